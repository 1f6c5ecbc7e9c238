"""``pooltensor info``: what this installation is and what this machine gives it: version,
native profile and kernels, transports built in, shared-memory huge pages, the secret file and
its mode."""
import json
import os
import platform
import stat
import sys

THP = "/sys/kernel/mm/transparent_hugepage"


def add_parser(sub):
    """Register ``info``."""
    p = sub.add_parser(
        "info", help="version, native build, transports, huge pages, secret file",
        description="What this installation of pooltensor is and what this machine gives it. "
                    "Reads files and the native module only; starts nothing.")
    p.add_argument("--json", action="store_true", help="print one JSON object instead")
    p.set_defaults(run=run)
    return p


def _thp(name):
    """The bracketed choice of a THP setting file, or None where there is none."""
    try:
        with open(os.path.join(THP, name)) as f:
            text = f.read()
    except OSError:
        return None
    for word in text.split():
        if word.startswith("["):
            return word.strip("[]")
    return text.strip() or None


def _secret():
    from collectives import control
    path = control.secret_path(None)
    source = "$" + control.ENV_SECRET if path else "default"
    path = path or control.default_secret_path()
    out = {"path": path, "source": source, "exists": os.path.exists(path), "mode": None,
           "private": None}
    if out["exists"]:
        mode = stat.S_IMODE(os.stat(path).st_mode)
        out["mode"] = f"{mode:04o}"
        out["private"] = not mode & 0o077
    return out


def gather():
    """Everything ``info`` reports, as a dict."""
    import importlib.metadata

    import numpy
    from collectives import _native
    from collectives.native import native_info
    shmem = _thp("shmem_enabled")
    nat = native_info()
    kind = nat["segments"]
    return {
        "version": importlib.metadata.version("pooltensor"),
        "python": platform.python_version(), "numpy": numpy.__version__,
        "system": f"{platform.system()} {platform.release()} {platform.machine()}",
        "cpus": os.cpu_count(),
        "native": nat,
        "kernels": _native.kernels_isa(),
        "transports": _native.transports(),
        "counters": _native.stats_enable(),
        "huge_pages": {"enabled": _thp("enabled"), "shmem_enabled": shmem,
                       "pool_memory_gets_them": (shmem in ("advise", "always", "force")
                                                 or kind == "tmpfs") if shmem else None},
        "secret_file": _secret(),
        "environment": {k: v for k, v in sorted(os.environ.items())
                        if k.startswith("POOLTENSOR_")},
    }


def text(info):
    """The report as lines for a terminal."""
    n = info["native"]
    hp = info["huge_pages"]
    sf = info["secret_file"]
    lines = [f"pooltensor {info['version']} (Python {info['python']}, numpy {info['numpy']}, "
             f"{info['system']}, {info['cpus']} CPUs)",
             f"native profile   {n['profile']}: segments {n.get('segments')}, waits "
             f"{n.get('waits')}, peer death {n.get('peer_death')}",
             f"kernels          {info['kernels']}",
             f"transports       {', '.join(info['transports'])}",
             f"counters         {'on' if info['counters'] else 'off (POOLTENSOR_STATS=0)'}"]
    if hp["shmem_enabled"] is None:
        lines.append("huge pages       no transparent huge pages on this system")
    else:
        lines.append(f"huge pages       enabled={hp['enabled']}, shmem_enabled="
                     f"{hp['shmem_enabled']}" +
                     ("  (pool memory gets them from a private tmpfs)"
                      if n.get("segments") == "tmpfs" else
                      "" if hp["pool_memory_gets_them"] else
                      "  (pool memory gets 4 KiB pages; as root: "
                      f"echo advise > {THP}/shmem_enabled)"))
    if not sf["exists"]:
        lines.append(f"secret file      {sf['path']} ({sf['source']}): not there yet "
                     "(pooltensor serve makes it, mode 0600)")
    else:
        lines.append(f"secret file      {sf['path']} ({sf['source']}), mode {sf['mode']}" +
                     ("" if sf["private"] else
                      f"  (others can read it: chmod 600 {sf['path']})"))
    for k, v in info["environment"].items():
        lines.append(f"environment      {k}={v}")
    return lines


def run(args):
    """Print the report; exit status 0."""
    info = gather()
    if args.json:
        json.dump(info, sys.stdout, indent=1)
        print()
    else:
        print("\n".join(text(info)))
    return 0
