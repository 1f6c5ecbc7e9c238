/* The team entry points as a table of function pointers, handed to other extensions of ours
 * (the XLA FFI handler of collectives.jax) in a PyCapsule named "collectives._native.team_api",
 * so that they call the engine linked into collectives._native without linking it twice. */
#ifndef PT_TEAM_API_H
#define PT_TEAM_API_H
#include "pt.h"

#define PT_TEAM_API_VERSION 2

typedef struct {
    int version;
    pt_status_t (*barrier)(pt_team_t *t, double timeout, int *who);
    pt_status_t (*allreduce)(pt_team_t *t, pt_op_t op, pt_dtype_t dt, const void *in, void *out,
                             size_t count, int algo, uint64_t sig, double timeout, int *who);
    pt_status_t (*allgather)(pt_team_t *t, const void *in, void *out, size_t nbytes,
                             uint64_t sig, double timeout, int *who);
    pt_status_t (*reduce_scatter)(pt_team_t *t, pt_op_t op, pt_dtype_t dt, const void *in,
                                  void *out, size_t count, uint64_t sig, double timeout,
                                  int *who);
    pt_status_t (*broadcast)(pt_team_t *t, int root, void *buf, size_t nbytes, uint64_t sig,
                             double timeout, int *who);
    size_t (*dtype_size)(pt_dtype_t dt);
    void (*prefault)(void *p, size_t n);
} pt_team_api_t;

#endif
