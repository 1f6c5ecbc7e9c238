/* dlopen of the verbs library and its table of function pointers (verbs_lib.h). Versioned
 * symbols are asked for by version where the loader can (glibc's dlvsym): libibverbs keeps a
 * 1.0 compatibility version of several calls beside the 1.1 ones we declare. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "transport/verbs/verbs_lib.h"

static pthread_once_t once = PTHREAD_ONCE_INIT;
static pt_verbs_lib_t table;
static const pt_verbs_lib_t *loaded;
static char error[512];
static char path[256];

static void *symbol(void *h, const char *name)
{
#if defined(__GLIBC__)
    void *f = dlvsym(h, name, "IBVERBS_1.1");
    if (f)
        return f;
#endif
    return dlsym(h, name);
}

static void load(void)
{
    const char *env = getenv("POOLTENSOR_VERBS_LIB");
#if defined(__APPLE__)
    const char *def = "/usr/lib/librdma.dylib";
#else
    const char *def = "libibverbs.so.1";
#endif
    snprintf(path, sizeof(path), "%s", env && *env ? env : def);
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        const char *e = dlerror();
        snprintf(error, sizeof(error), "no verbs library: %s", e ? e : path);
        return;
    }
    struct {
        void **slot;
        const char *name;
        int optional;
    } want[] = {
        {(void **)&table.get_device_list, "ibv_get_device_list", 0},
        {(void **)&table.free_device_list, "ibv_free_device_list", 0},
        {(void **)&table.get_device_name, "ibv_get_device_name", 0},
        {(void **)&table.open_device, "ibv_open_device", 0},
        {(void **)&table.close_device, "ibv_close_device", 0},
        {(void **)&table.query_device, "ibv_query_device", 0},
        {(void **)&table.query_port, "ibv_query_port", 0},
        {(void **)&table.query_gid, "ibv_query_gid", 0},
        {(void **)&table.query_gid_ex, "_ibv_query_gid_ex", 1},
        {(void **)&table.alloc_pd, "ibv_alloc_pd", 0},
        {(void **)&table.dealloc_pd, "ibv_dealloc_pd", 0},
        {(void **)&table.reg_mr, "ibv_reg_mr", 0},
        {(void **)&table.dereg_mr, "ibv_dereg_mr", 0},
        {(void **)&table.create_cq, "ibv_create_cq", 0},
        {(void **)&table.destroy_cq, "ibv_destroy_cq", 0},
        {(void **)&table.create_qp, "ibv_create_qp", 0},
        {(void **)&table.modify_qp, "ibv_modify_qp", 0},
        {(void **)&table.destroy_qp, "ibv_destroy_qp", 0},
    };
    for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++) {
        *want[i].slot = symbol(h, want[i].name);
        if (!*want[i].slot && !want[i].optional) {
            snprintf(error, sizeof(error), "%s lacks %s: not a verbs library", path,
                     want[i].name);
            dlclose(h);
            return;
        }
    }
    loaded = &table; /* (the handle stays open for the life of the process) */
}

const pt_verbs_lib_t *pt_verbs_lib_get(void)
{
    pthread_once(&once, load);
    return loaded;
}

const char *pt_verbs_lib_error(void)
{
    pthread_once(&once, load);
    return loaded ? "" : error;
}

const char *pt_verbs_lib_path(void)
{
    pthread_once(&once, load);
    return path;
}
