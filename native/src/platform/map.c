/* Mapping a shareable segment, for both profiles: a large one at a 2 MiB-aligned address and
 * advised for transparent huge pages where the system has the advice (a stream over pool memory
 * then runs at numpy's speed on Linux with shmem_enabled=advise); a small one where mmap puts it.
 * Peers map segments through the same function. */
#include <stdint.h>
#include <sys/mman.h>
#include <unistd.h>

#include "platform/platform.h"

#define PT_HUGE (2u << 20)

#ifndef MAP_NORESERVE
#define MAP_NORESERVE 0
#endif

void *pt__plat_map_shared(int fd, size_t len, int prot)
{
    if (len < PT_HUGE)
        return mmap(NULL, len, prot, MAP_SHARED, fd, 0);
    uint8_t *r = mmap(NULL, len + PT_HUGE, PROT_NONE, MAP_PRIVATE | MAP_ANON | MAP_NORESERVE,
                      -1, 0);
    if (r == MAP_FAILED)
        return mmap(NULL, len, prot, MAP_SHARED, fd, 0);
    uint8_t *a = (uint8_t *)(((uintptr_t)r + PT_HUGE - 1) & ~(uintptr_t)(PT_HUGE - 1));
    void *p = mmap(a, len, prot, MAP_SHARED | MAP_FIXED, fd, 0);
    if (p == MAP_FAILED) {
        munmap(r, len + PT_HUGE);
        return MAP_FAILED;
    }
    if (a > r)
        munmap(r, (size_t)(a - r));
    if (r + len + PT_HUGE > a + len)
        munmap(a + len, (size_t)(r + len + PT_HUGE - (a + len)));
#ifdef MADV_HUGEPAGE
    madvise(p, len, MADV_HUGEPAGE);
#endif
    return p;
}

pt_status_t pt__plat_map_peer(int fd, size_t len, int prot_write, int writable, void **base_out,
                              int *writable_out)
{
    void *base = pt__plat_map_shared(fd, len, PROT_READ | (prot_write ? PROT_WRITE : 0));
    pt_status_t st = base == MAP_FAILED ? pt__sys() : PT_OK;
    close(fd);
    if (st != PT_OK)
        return st;
    *base_out = base;
    if (writable_out)
        *writable_out = writable;
    return PT_OK;
}

#if defined(__linux__) && !defined(MADV_POPULATE_WRITE)
#define MADV_POPULATE_WRITE 23 /* Linux 5.14 */
#endif

/* 1 when the page at p is mapped (resident). */
static int resident(uintptr_t p, size_t page)
{
#if defined(__APPLE__)
    char v = 0;
#else
    unsigned char v = 0;
#endif
    return mincore((void *)p, page, (void *)&v) == 0 && (v & 1);
}

/* A fresh result buffer (malloc's or XLA's) is memory never touched: its first write takes a
 * page fault every 4 KiB, and a collective writes it chunk by chunk in lockstep with its peers,
 * so every fault stalls them all (8 MiB allreduce inside jax.jit, 2 ranks on a loaded 2-core
 * machine: 55 ms a call unmapped, against 7 ms into a warm buffer). Mapping the pages first, in
 * one call, costs less (older kernels and other systems: read and write back one byte per page;
 * the bytes stay as they are). A buffer whose first and last pages are mapped already is taken
 * as warm and left alone: two mincore calls instead of a walk of its page tables (64 MiB: about
 * 240 us here). Advising huge pages first measured no better here, and with the usual
 * defrag=madvise it may stall in compaction. */
void pt_prefault(void *p, size_t n)
{
    static size_t page;
    if (n < PT_PREFAULT_MIN)
        return;
    if (!page)
        page = (size_t)sysconf(_SC_PAGESIZE);
    uintptr_t a = ((uintptr_t)p + page - 1) & ~(uintptr_t)(page - 1);
    uintptr_t b = ((uintptr_t)p + n) & ~(uintptr_t)(page - 1);
    if (b <= a || (resident(a, page) && resident(b - page, page)))
        return;
#ifdef MADV_POPULATE_WRITE
    if (madvise((void *)a, b - a, MADV_POPULATE_WRITE) == 0)
        return;
#endif
    for (volatile char *c = (volatile char *)a; (uintptr_t)c < b; c += page)
        *c = *c;
}
