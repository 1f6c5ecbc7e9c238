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
