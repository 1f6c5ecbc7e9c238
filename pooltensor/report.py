"""Pictures of the pool: one PNG with the members' usage and the transfers' latency
histograms (pt.stats(plot=PATH), ``pooltensor stats --plot PATH``), drawn with matplotlib.

The drawing takes plain data so that both sources feed it: a job's own stats and native
histograms (fine buckets), or a metrics endpoint's scrape (Prometheus' coarser ``le``
buckets).
"""


def _hist_series(entries):
    """{label: [(low_ns, high_ns, count)]} from native entries, merged per transport and op."""
    from collectives import _native
    from collectives.counters import merge
    lo, hi = _native.hist_bounds()
    groups = {}
    for e in entries:
        groups.setdefault(f"{e['transport']} {e['op']}", []).append(e)
    out = {}
    for label, cells in sorted(groups.items()):
        m = merge(cells)
        if m["count"]:
            out[label] = [(lo[i], hi[i] + 1, n) for i, n in m["buckets"]]
    return out


def plot_stats(stats, entries, path):
    """Draw pt.stats()'s members and the native histograms of `entries` into path."""
    members = [(f"{m['member']} ({m['host']})", m["used"], m["capacity"])
               for m in stats["members"]]
    return draw(path, members, _hist_series(entries), "pooltensor: this process's pool")


def draw(path, members, hists, title):
    """members: [(label, used bytes, capacity bytes)]; hists: {label: [(low_ns, high_ns,
    count)]}. Left: usage bars per member; right: each histogram as the fraction of
    operations per bucket against latency (log scale). Returns path."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 4.8))
    if members:
        labels = [m[0] for m in members]
        cap = [m[2] / 2**20 for m in members]
        used = [m[1] / 2**20 for m in members]
        y = range(len(members))
        ax1.barh(y, cap, color="#dddddd", label="capacity")
        ax1.barh(y, used, color="#3b75af", label="used")
        ax1.set_yticks(list(y), labels)
        ax1.invert_yaxis()
        ax1.legend(loc="lower right")
    ax1.set_xlabel("MiB")
    ax1.set_title("members: used of capacity")
    for k, (label, buckets) in enumerate(hists.items()):
        total = sum(n for _, _, n in buckets) or 1
        ax2.bar([max(lo, 1) / 1e3 for lo, _, _ in buckets],
                [n / total for _, _, n in buckets],
                width=[(hi - max(lo, 1)) / 1e3 for lo, hi, _ in buckets], align="edge",
                alpha=0.6, color=f"C{k % 10}", label=label)
    ax2.set_xscale("log")
    ax2.set_xlabel("latency (us)")
    ax2.set_ylabel("fraction of operations")
    ax2.set_title("latency histograms")
    if hists:
        ax2.legend(fontsize="small")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
