/* The device a context uses: which device and port (the first with an active port, or
 * $POOLTENSOR_VERBS_DEVICE=name[:port]), which GID (RoCE v2 IPv4-mapped > RoCE v2 IPv6 >
 * RoCE v1 / IB; link-local last; $POOLTENSOR_VERBS_GID=index), and which profile (an RC queue
 * pair is taken to RTR on a loopback; where the device refuses, UC-SEND). Also the probe that
 * `pooltensor doctor` prints (pt_verbs_probe). */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "transport/verbs/verbs.h"

const char *pt__verbs_wc_str(int status)
{
    switch (status) {
    case PT_IBV_WC_SUCCESS: return "success";
    case PT_IBV_WC_LOC_LEN_ERR: return "local length error";
    case PT_IBV_WC_LOC_QP_OP_ERR: return "local QP operation error";
    case PT_IBV_WC_LOC_PROT_ERR: return "local protection error";
    case PT_IBV_WC_WR_FLUSH_ERR: return "flushed (queue pair in error)";
    case PT_IBV_WC_REM_ACCESS_ERR: return "remote access error";
    case PT_IBV_WC_REM_OP_ERR: return "remote operation error";
    case PT_IBV_WC_RETRY_EXC_ERR: return "transport retries exceeded (peer unreachable)";
    case PT_IBV_WC_RNR_RETRY_EXC_ERR: return "receiver not ready, retries exceeded";
    default: return "error";
    }
}

static int is_zero(const pt_ibv_gid_t *g)
{
    for (int i = 0; i < 16; i++)
        if (g->raw[i])
            return 0;
    return 1;
}

static int is_v4mapped(const pt_ibv_gid_t *g)
{
    for (int i = 0; i < 10; i++)
        if (g->raw[i])
            return 0;
    return g->raw[10] == 0xff && g->raw[11] == 0xff;
}

/* The GID's type: from the library where it says (rdma-core 32+), else sysfs (Linux), else
 * -1 (unknown). */
static int gid_type(const pt_verbs_lib_t *lib, pt_ibv_context_t *c, const char *dev, int port,
                    int index)
{
    if (lib->query_gid_ex) {
        pt_ibv_gid_entry_t e;
        if (lib->query_gid_ex(c, (uint32_t)port, (uint32_t)index, &e, 0, sizeof(e)) == 0)
            return (int)e.gid_type;
    }
    char path[256], buf[32] = {0};
    snprintf(path, sizeof(path), "/sys/class/infiniband/%s/ports/%d/gid_attrs/types/%d", dev,
             port, index);
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = 0;
    if (strstr(buf, "v2"))
        return PT_IBV_GID_TYPE_ROCE_V2;
    return strstr(buf, "v1") ? PT_IBV_GID_TYPE_ROCE_V1 : PT_IBV_GID_TYPE_IB;
}

/* Higher is better; 0: not usable. */
static int gid_score(int link_layer, int type, const pt_ibv_gid_t *g)
{
    if (is_zero(g))
        return 0;
    if (link_layer != PT_IBV_LINK_LAYER_ETHERNET)
        return 10;
    int linklocal = g->raw[0] == 0xfe && (g->raw[1] & 0xc0) == 0x80;
    if (type == PT_IBV_GID_TYPE_ROCE_V2 || type < 0)
        return is_v4mapped(g) ? 40 : linklocal ? 15 : 30;
    return linklocal ? 5 : 20;
}

/* The best GID of an active port: index, or -1. */
static int best_gid(const pt_verbs_lib_t *lib, pt_ibv_context_t *c, const char *dev, int port,
                    const pt_ibv_port_attr_t *pa, pt_ibv_gid_t *gid, int *type)
{
    const char *force = getenv("POOLTENSOR_VERBS_GID");
    int best = -1, best_score = 0;
    for (int i = 0; i < pa->gid_tbl_len && i < 256; i++) {
        pt_ibv_gid_t g;
        if (lib->query_gid(c, (uint8_t)port, i, &g) != 0)
            continue;
        int t = gid_type(lib, c, dev, port, i);
        int s = gid_score(pa->link_layer, t, &g);
        if (force && *force && atoi(force) == i && !is_zero(&g))
            s = 1000;
        if (s > best_score) {
            best_score = s;
            best = i;
            *gid = g;
            *type = t;
        }
    }
    return best;
}

/* A queue pair of type `type` taken to RTR towards itself on the chosen GID: does the device
 * accept that type, and does the GID route? */
static int loopback_ok(vb_dev_t *d, int type)
{
    const pt_verbs_lib_t *lib = d->lib;
    pt_ibv_cq_t *cq = lib->create_cq(d->ctx, 4, NULL, NULL, 0);
    if (!cq)
        return 0;
    pt_ibv_qp_init_attr_t ia = {.send_cq = cq, .recv_cq = cq, .qp_type = type,
                                .cap = {.max_send_wr = 1, .max_recv_wr = 1, .max_send_sge = 1,
                                        .max_recv_sge = 1}};
    pt_ibv_qp_t *qp = lib->create_qp(d->pd, &ia);
    int ok = 0;
    if (qp) {
        pt_ibv_qp_attr_t a = {.qp_state = PT_IBV_QPS_INIT, .port_num = (uint8_t)d->port,
                              .qp_access_flags = PT_IBV_ACCESS_REMOTE_READ |
                                                 PT_IBV_ACCESS_REMOTE_WRITE};
        ok = lib->modify_qp(qp, &a, PT_IBV_QP_STATE | PT_IBV_QP_PKEY_INDEX | PT_IBV_QP_PORT |
                                        PT_IBV_QP_ACCESS_FLAGS) == 0;
        memset(&a, 0, sizeof(a));
        a.qp_state = PT_IBV_QPS_RTR;
        a.path_mtu = d->mtu;
        a.dest_qp_num = qp->qp_num;
        a.max_dest_rd_atomic = 1;
        a.min_rnr_timer = 12;
        a.ah_attr.is_global = d->link_layer != PT_IBV_LINK_LAYER_INFINIBAND || d->lid == 0;
        a.ah_attr.dlid = (uint16_t)d->lid;
        a.ah_attr.grh.dgid = d->gid;
        a.ah_attr.grh.sgid_index = (uint8_t)d->gid_index;
        a.ah_attr.grh.hop_limit = 1;
        a.ah_attr.port_num = (uint8_t)d->port;
        ok = ok && lib->modify_qp(qp, &a, PT_IBV_QP_STATE | PT_IBV_QP_AV | PT_IBV_QP_PATH_MTU |
                                              PT_IBV_QP_DEST_QPN | PT_IBV_QP_RQ_PSN |
                                              PT_IBV_QP_MAX_DEST_RD_ATOMIC |
                                              PT_IBV_QP_MIN_RNR_TIMER) == 0;
        lib->destroy_qp(qp);
    }
    lib->destroy_cq(cq);
    return ok;
}

pt_status_t pt__verbs_dev_open(vb_dev_t *d, char *why, size_t whylen)
{
    memset(d, 0, sizeof(*d));
    const pt_verbs_lib_t *lib = pt_verbs_lib_get();
    if (!lib) {
        snprintf(why, whylen, "%s", pt_verbs_lib_error());
        return PT_ERR_UNSUPPORTED;
    }
    d->lib = lib;
    int n = 0;
    errno = 0;
    struct pt_ibv_device **list = lib->get_device_list(&n);
    if (!list || n <= 0) {
        int e = errno;
        if (e == ENOSYS)
            snprintf(why, whylen, "no RDMA devices: this kernel has no RDMA support (ENOSYS)");
        else
            snprintf(why, whylen, "no RDMA devices%s%s", e ? ": " : "", e ? strerror(e) : "");
        if (list)
            lib->free_device_list(list);
        return PT_ERR_UNSUPPORTED;
    }
    const char *want = getenv("POOLTENSOR_VERBS_DEVICE");
    char wname[64] = {0};
    int wport = 0;
    if (want && *want) {
        snprintf(wname, sizeof(wname), "%s", want);
        char *colon = strchr(wname, ':');
        if (colon) {
            *colon = 0;
            wport = atoi(colon + 1);
        }
    }
    snprintf(why, whylen, "no active port with a usable GID");
    pt_status_t st = PT_ERR_UNSUPPORTED;
    for (int i = 0; i < n && st != PT_OK; i++) {
        const char *name = lib->get_device_name(list[i]);
        if (*wname && strcmp(name, wname) != 0)
            continue;
        pt_ibv_context_t *c = lib->open_device(list[i]);
        if (!c)
            continue;
        pt_ibv_device_attr_t attr;
        if (lib->query_device(c, &attr) != 0) {
            lib->close_device(c);
            continue;
        }
        for (int port = 1; port <= attr.phys_port_cnt && st != PT_OK; port++) {
            pt_ibv_port_attr_t pa;
            memset(&pa, 0, sizeof(pa));
            if ((wport && port != wport) || lib->query_port(c, (uint8_t)port, &pa) != 0 ||
                pa.state != PT_IBV_PORT_ACTIVE)
                continue;
            int type = -1;
            int gi = best_gid(lib, c, name, port, &pa, &d->gid, &type);
            if (gi < 0)
                continue;
            d->ctx = c;
            d->port = port;
            d->gid_index = gi;
            d->gid_type = type;
            d->link_layer = pa.link_layer;
            d->mtu = pa.active_mtu;
            d->lid = pa.lid;
            d->attr = attr;
            snprintf(d->name, sizeof(d->name), "%s", name);
            st = PT_OK;
        }
        if (st != PT_OK)
            lib->close_device(c);
    }
    lib->free_device_list(list);
    if (st != PT_OK)
        return st;
    /* a second active port of the same device with a usable GID: a second rail
     * ($POOLTENSOR_VERBS_RAILS=1, or a port named in $POOLTENSOR_VERBS_DEVICE: one only) */
    const char *rails = getenv("POOLTENSOR_VERBS_RAILS");
    int one = wport || (rails && atoi(rails) == 1);
    for (int port = 1; port <= d->attr.phys_port_cnt && !one; port++) {
        pt_ibv_port_attr_t pa;
        memset(&pa, 0, sizeof(pa));
        if (port == d->port || lib->query_port(d->ctx, (uint8_t)port, &pa) != 0 ||
            pa.state != PT_IBV_PORT_ACTIVE || pa.link_layer != d->link_layer)
            continue;
        int type = -1;
        int gi = best_gid(lib, d->ctx, d->name, port, &pa, &d->gid2, &type);
        if (gi >= 0) {
            d->port2 = port;
            d->gid_index2 = gi;
            d->lid2 = pa.lid;
            break;
        }
    }
    d->pd = lib->alloc_pd(d->ctx);
    if (!d->pd) {
        snprintf(why, whylen, "%s: cannot allocate a protection domain", d->name);
        lib->close_device(d->ctx);
        return PT_ERR_SYS;
    }
    /* the profile from what the device accepts: RC, else UC-SEND, else the GID does not route */
    const char *prof = getenv("POOLTENSOR_VERBS_PROFILE");
    int uc_only = prof && strcmp(prof, "uc") == 0;
    d->profile = !uc_only && loopback_ok(d, PT_IBV_QPT_RC) ? VB_RC
                 : loopback_ok(d, PT_IBV_QPT_UC)           ? VB_UC
                                                           : 0;
    if (!d->profile) {
        snprintf(why, whylen, "%s port %d: queue pairs refused on GID %d%s", d->name, d->port,
                 d->gid_index, is_v4mapped(&d->gid) ? "" : " (not IPv4-mapped: give the "
                 "interface an IPv4 address)");
        pt__verbs_dev_close(d);
        return PT_ERR_UNSUPPORTED;
    }
    if (prof && strcmp(prof, "rc") == 0 && d->profile != VB_RC) {
        snprintf(why, whylen, "%s: RC queue pairs refused (POOLTENSOR_VERBS_PROFILE=rc)", d->name);
        pt__verbs_dev_close(d);
        return PT_ERR_UNSUPPORTED;
    }
    why[0] = 0;
    return PT_OK;
}

void pt__verbs_dev_close(vb_dev_t *d)
{
    if (d->pd)
        d->lib->dealloc_pd(d->pd);
    if (d->ctx)
        d->lib->close_device(d->ctx);
    d->pd = NULL;
    d->ctx = NULL;
}

static void gid_text(const pt_ibv_gid_t *g, char *out, size_t len)
{
    if (is_v4mapped(g)) {
        snprintf(out, len, "::ffff:%d.%d.%d.%d", g->raw[12], g->raw[13], g->raw[14], g->raw[15]);
        return;
    }
    size_t k = 0;
    for (int i = 0; i < 16 && k + 6 < len; i += 2)
        k += (size_t)snprintf(out + k, len - k, "%s%02x%02x", i ? ":" : "", g->raw[i],
                              g->raw[i + 1]);
}

/* What the doctor prints: one "key value..." line per fact. */
pt_status_t pt_verbs_probe(char *buf, size_t len)
{
    if (!buf || len < 256)
        return PT_ERR_INVALID;
    size_t k = 0;
#define OUT(...)                                                                         \
    do {                                                                                 \
        if (k < len)                                                                     \
            k += (size_t)snprintf(buf + k, len - k, __VA_ARGS__);                        \
    } while (0)
    const pt_verbs_lib_t *lib = pt_verbs_lib_get();
    OUT("library %s\n", pt_verbs_lib_path());
    if (!lib) {
        OUT("error %s\n", pt_verbs_lib_error());
        return PT_OK;
    }
    int n = 0;
    errno = 0;
    struct pt_ibv_device **list = lib->get_device_list(&n);
    int e = errno;
    if (!list || n <= 0) {
        OUT("error %s\n", e == ENOSYS ? "no RDMA devices: this kernel has no RDMA support (ENOSYS)"
                                      : "no RDMA devices");
        if (list)
            lib->free_device_list(list);
        return PT_OK;
    }
    for (int i = 0; i < n; i++) {
        const char *name = lib->get_device_name(list[i]);
        pt_ibv_context_t *c = lib->open_device(list[i]);
        pt_ibv_device_attr_t a;
        if (!c || lib->query_device(c, &a) != 0) {
            OUT("device %s unopenable\n", name);
            if (c)
                lib->close_device(c);
            continue;
        }
        OUT("device %s fw=%s ports=%d atomic=%d max_qp=%d max_qp_wr=%d max_mr=%d max_cqe=%d\n",
            name, a.fw_ver, a.phys_port_cnt, a.atomic_cap, a.max_qp, a.max_qp_wr, a.max_mr,
            a.max_cqe);
        for (int p = 1; p <= a.phys_port_cnt; p++) {
            pt_ibv_port_attr_t pa;
            memset(&pa, 0, sizeof(pa));
            if (lib->query_port(c, (uint8_t)p, &pa) != 0)
                continue;
            OUT("port %s %d state=%d mtu=%d link=%d gids=%d\n", name, p, pa.state,
                pa.active_mtu, pa.link_layer, pa.gid_tbl_len);
            for (int g = 0; g < pa.gid_tbl_len && g < 16; g++) {
                pt_ibv_gid_t gid;
                char text[64];
                if (lib->query_gid(c, (uint8_t)p, g, &gid) != 0 || is_zero(&gid))
                    continue;
                gid_text(&gid, text, sizeof(text));
                OUT("gid %s %d %d type=%d %s\n", name, p, g, gid_type(lib, c, name, p, g), text);
            }
        }
        lib->close_device(c);
    }
    lib->free_device_list(list);
    vb_dev_t d;
    char why[256];
    if (pt__verbs_dev_open(&d, why, sizeof(why)) == PT_OK) {
        OUT("chosen %s %d %d profile=%s rails=%d\n", d.name, d.port, d.gid_index,
            d.profile == VB_RC ? "rc" : "uc-send", d.port2 ? 2 : 1);
        pt__verbs_dev_close(&d);
    } else {
        OUT("error %s\n", why);
    }
#undef OUT
    return PT_OK;
}
