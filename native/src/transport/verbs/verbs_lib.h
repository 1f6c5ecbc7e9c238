/* The verbs library, opened with dlopen at first use and called through a table of function
 * pointers (never linked: the extension loads and runs where no RDMA library is installed).
 * Linux: libibverbs.so.1; macOS: /usr/lib/librdma.dylib; $POOLTENSOR_VERBS_LIB names another
 * (the simulated provider of the tests, a vendor's build). */
#ifndef PT_VERBS_LIB_H
#define PT_VERBS_LIB_H

#include "transport/verbs/verbs_abi.h"

typedef struct pt_verbs_lib {
    struct pt_ibv_device **(*get_device_list)(int *n);
    void (*free_device_list)(struct pt_ibv_device **list);
    const char *(*get_device_name)(struct pt_ibv_device *dev);
    pt_ibv_context_t *(*open_device)(struct pt_ibv_device *dev);
    int (*close_device)(pt_ibv_context_t *c);
    int (*query_device)(pt_ibv_context_t *c, pt_ibv_device_attr_t *out);
    int (*query_port)(pt_ibv_context_t *c, uint8_t port, pt_ibv_port_attr_t *out);
    int (*query_gid)(pt_ibv_context_t *c, uint8_t port, int index, pt_ibv_gid_t *out);
    /* optional (rdma-core 32+): the GID's type; NULL where the library lacks it */
    int (*query_gid_ex)(pt_ibv_context_t *c, uint32_t port, uint32_t index,
                        pt_ibv_gid_entry_t *out, uint32_t flags, size_t entry_size);
    pt_ibv_pd_t *(*alloc_pd)(pt_ibv_context_t *c);
    int (*dealloc_pd)(pt_ibv_pd_t *pd);
    pt_ibv_mr_t *(*reg_mr)(pt_ibv_pd_t *pd, void *addr, size_t len, int access);
    int (*dereg_mr)(pt_ibv_mr_t *mr);
    pt_ibv_cq_t *(*create_cq)(pt_ibv_context_t *c, int cqe, void *cq_context, void *channel,
                              int comp_vector);
    int (*destroy_cq)(pt_ibv_cq_t *cq);
    pt_ibv_qp_t *(*create_qp)(pt_ibv_pd_t *pd, pt_ibv_qp_init_attr_t *attr);
    int (*modify_qp)(pt_ibv_qp_t *qp, pt_ibv_qp_attr_t *attr, int mask);
    int (*destroy_qp)(pt_ibv_qp_t *qp);
} pt_verbs_lib_t;

/* The library and its table, loaded once (thread-safe). NULL when it cannot be used; then
 * pt_verbs_lib_error says why in one line (not found, a symbol missing). */
const pt_verbs_lib_t *pt_verbs_lib_get(void);
const char *pt_verbs_lib_error(void);
/* The path it was (or would be) opened from. */
const char *pt_verbs_lib_path(void);

#endif
