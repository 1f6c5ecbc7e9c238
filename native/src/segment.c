/* Segments: page-aligned anonymous shared memory (memfd). A memfd has no name in /dev/shm, so
 * nothing outlives the processes that hold it, even after SIGKILL. Same-host peers map it
 * through /proc/<pid>/fd/<fd>. */
#define _GNU_SOURCE
#include <errno.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include "internal.h"

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
    seg->base = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, seg->fd, 0);
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
