/* Segments: page-aligned anonymous shared memory (memfd). A memfd has no name in /dev/shm, so
 * nothing outlives the processes that hold it, even after SIGKILL. Same-host peers map it
 * through /proc/<pid>/fd/<fd>. */
#define _GNU_SOURCE
#include <errno.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include "core/internal.h"

/* Large segments are mapped at a 2 MiB-aligned address and advised for transparent huge pages:
 * where the system allows them for shared memory (shmem_enabled = advise), a stream over a
 * slab then costs what it costs over numpy's (huge-page backed) memory; elsewhere the advice is
 * ignored. Peers map segments through the same function. */
#define PT_HUGE (2u << 20)

void *pt__map_shared(int fd, size_t len, int prot)
{
    if (len < PT_HUGE)
        return mmap(NULL, len, prot, MAP_SHARED, fd, 0);
    uint8_t *r = mmap(NULL, len + PT_HUGE, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
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
    madvise(p, len, MADV_HUGEPAGE);
    return p;
}

struct pt_segment {
    void *base;
    size_t len;
    int fd;
};

pt_status_t pt_segment_create(size_t len, pt_segment_t **out)
{
    if (len == 0 || !out)
        return PT_ERR_INVALID;
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    len = (len + page - 1) / page * page;
    pt_segment_t *seg = calloc(1, sizeof(*seg));
    if (!seg)
        return PT_ERR_NOMEM;
    pt_status_t st;
    seg->fd = memfd_create("pooltensor", MFD_CLOEXEC);
    if (seg->fd < 0) {
        st = pt__sys();
        goto err_free;
    }
    if (ftruncate(seg->fd, (off_t)len) != 0) {
        st = pt__sys();
        goto err_close;
    }
    seg->base = pt__map_shared(seg->fd, len, PROT_READ | PROT_WRITE);
    if (seg->base == MAP_FAILED) {
        st = errno == ENOMEM ? PT_ERR_NOMEM : pt__sys();
        goto err_close;
    }
    seg->len = len;
    *out = seg;
    return PT_OK;
err_close:
    close(seg->fd);
err_free:
    free(seg);
    return st;
}

void pt_segment_destroy(pt_segment_t *seg)
{
    if (!seg)
        return;
    munmap(seg->base, seg->len);
    close(seg->fd);
    free(seg);
}

void *pt_segment_base(const pt_segment_t *seg) { return seg->base; }
size_t pt_segment_len(const pt_segment_t *seg) { return seg->len; }
int pt_segment_fd(const pt_segment_t *seg) { return seg->fd; }
