/* The transports this build has (the one file that lists them), the shared function an
 * operation a transport lacks points at, and the queued asynchronous get and put. */
#include "core/transport.h"

const pt_transport_ops_t *const pt_transports[] = {&pt_transport_verbs, &pt_transport_tcp,
                                                     &pt_transport_shm, NULL};

pt_status_t pt_transport_unsupported_map(pt_ctx_t *ctx, int rank, uint64_t key, uint64_t off,
                                         size_t len, int flags, void **ptr)
{
    return PT_ERR_UNSUPPORTED;
}

pt_status_t pt_transport_queued_get_async(pt_ctx_t *ctx, int rank, uint64_t key, uint64_t off,
                                          void *dst, size_t len, pt_req_t **out)
{
    return pt__progress_submit(ctx, 0, rank, key, off, dst, len, out);
}

pt_status_t pt_transport_queued_put_async(pt_ctx_t *ctx, int rank, uint64_t key, uint64_t off,
                                          const void *src, size_t len, pt_req_t **out)
{
    return pt__progress_submit(ctx, 1, rank, key, off, (void *)(uintptr_t)src, len, out);
}
