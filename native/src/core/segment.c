/* Segments (pt.h): shared memory a same-host peer can map, made by the platform
 * (pt_plat_segment_create), page-aligned and a whole number of pages long. */
#include <stdlib.h>
#include <unistd.h>

#include "core/internal.h"

struct pt_segment {
    pt_plat_segment_t plat;
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
    pt_status_t st = pt_plat_segment_create(len, &seg->plat);
    if (st != PT_OK) {
        free(seg);
        return st;
    }
    *out = seg;
    return PT_OK;
}

void pt_segment_destroy(pt_segment_t *seg)
{
    if (!seg)
        return;
    pt_plat_segment_destroy(&seg->plat);
    free(seg);
}

void *pt_segment_base(const pt_segment_t *seg) { return seg->plat.base; }
size_t pt_segment_len(const pt_segment_t *seg) { return seg->plat.len; }
int pt_segment_fd(const pt_segment_t *seg) { return seg->plat.handle; }
const char *pt_segment_kind(void) { return pt_plat_segment_kind(); }
