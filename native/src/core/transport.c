/* The transports this build has (the one file that lists them), and the shared function an
 * operation a transport lacks points at. */
#include "core/transport.h"

const pt_transport_ops_t *const pt_transports[] = {&pt_transport_verbs, &pt_transport_tcp,
                                                     &pt_transport_shm, NULL};

pt_status_t pt_transport_unsupported_map(pt_ctx_t *ctx, int rank, uint64_t key, uint64_t off,
                                         size_t len, int flags, void **ptr)
{
    return PT_ERR_UNSUPPORTED;
}
