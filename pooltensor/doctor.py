"""``pooltensor doctor``: what this machine offers pooltensor, and what is wrong with it, in
plain words.

A check is a function of one argument, the options of the run (a dict: ``endpoints`` and
``servers`` to reach, ``timeout``), returning a list of findings, each (level, text) or
(level, text, fix) with level "pass" (or "ok"), "info", "warn" or "fail"; a warn or fail
says what to do in its fix. ``CHECKS`` lists them in the order they print, and
``register()`` adds one (other parts of pooltensor plug theirs in the same way). The general
checks (huge pages, the secret file, ports, transports per peer) are in
pooltensor/commands/checks.py; the verbs check here reports the library, devices, ports and
their state, GIDs with their types, MTU, device caps (atomics, max QPs and MRs), the profile
that would be used, and for each known failure what to do about it.
"""
import json
import os
import platform
import shutil
import subprocess

from .commands import checks as _general

CHECKS = list(_general.GENERAL)
LEVELS = ("pass", "info", "warn", "fail")


def register(check):
    """Add a check (a function of the run's options returning [(level, text[, fix]), ...]) to
    the doctor's list."""
    CHECKS.append(check)
    return check


def _thunderbolt_bridge():
    """macOS: whether the 'Thunderbolt Bridge' network service still exists (it claims the
    Thunderbolt interfaces that RDMA needs)."""
    exe = shutil.which("networksetup")
    if platform.system() != "Darwin" or not exe:
        return False
    try:
        out = subprocess.run([exe, "-listallnetworkservices"], capture_output=True, text=True,
                             timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return False
    return any(line.strip().lstrip("*").strip() == "Thunderbolt Bridge"
               for line in out.splitlines())


def _explain(error):
    """What to do about the probe's error line."""
    if error.startswith("no verbs library"):
        if platform.system() == "Darwin":
            return ("no /usr/lib/librdma.dylib: Thunderbolt RDMA needs macOS 26.2 or later "
                    "(POOLTENSOR_VERBS_LIB names another library)")
        return ("no libibverbs.so.1: install rdma-core's libibverbs1 and your NIC's provider "
                "(Debian/Ubuntu: apt install libibverbs1 ibverbs-providers); "
                "POOLTENSOR_VERBS_LIB names another library")
    if "ENOSYS" in error:
        return ("this kernel has no RDMA support (ibv_get_device_list: ENOSYS): load the NIC's "
                "RDMA driver (mlx5_ib, irdma, bnxt_re, ...; rdma_rxe to try RoCE in software) "
                "or use a host that has it")
    if error.startswith("no RDMA devices") and platform.system() == "Darwin":
        return ("RDMA is not enabled: run `rdma_ctl enable` in the Terminal of macOS Recovery, "
                "then restart")
    if error.startswith("no RDMA devices"):
        return "no RDMA device: is the NIC's RDMA driver loaded (`ibv_devices`, `rdma link`)?"
    return error


@register
def check_verbs(opts=None):
    """The verbs library, its devices, ports, GIDs, caps, and the profile that would be used."""
    from collectives.transport import verbs
    out = []
    try:
        info = verbs.probe()
    except Exception as e:
        return [("fail", f"verbs: the probe failed: {e}; tcp is used")]
    out.append(("info", f"verbs library: {info['library']}"))
    if info["error"] and not info["devices"]:
        out.append(("warn", f"verbs: {info['error']}"))
        out.append(("info", f"  -> {_explain(info['error'])}"))
        out.append(("info", "  -> between machines pooltensor uses tcp"))
        return out
    for d in info["devices"]:
        atomics = {0: "none (served at the target)", 1: "HCA (served at the target)",
                   2: "global"}.get(d.get("atomic"), "?")
        out.append(("ok", f"device {d['name']}: firmware {d.get('fw')}, {d.get('ports')} "
                          f"port(s), atomics {atomics}, max QPs {d.get('max_qp')}, "
                          f"max WRs/queue {d.get('max_qp_wr')}, max MRs {d.get('max_mr')}"))
        for p in (p for p in info["ports"] if p["device"] == d["name"]):
            state = verbs.PORT_STATE.get(p.get("state"), str(p.get("state")))
            link = verbs.LINK.get(p.get("link"), "?")
            mtu = verbs.MTU.get(p.get("mtu"), "?")
            level = "ok" if p.get("state") == 4 else "warn"
            out.append((level, f"  port {p['port']}: {state}, {link}, MTU {mtu}"))
            if level == "warn":
                out.append(("info", f"    -> port {p['port']} is down: check the cable and the "
                                    f"link partner"))
            gids = [g for g in info["gids"]
                    if g["device"] == d["name"] and g["port"] == p["port"]]
            for g in gids:
                kind = "IB" if p.get("link") == 1 else verbs.GID_TYPE.get(g.get("type"), "?")
                out.append(("info", f"    GID {g['index']}: {g['gid']} ({kind})"))
            if (p.get("state") == 4 and p.get("link") == 2
                    and not any(g["gid"].startswith("::ffff:") for g in gids)):
                out.append(("warn", f"    -> no IPv4-mapped GID on port {p['port']}: give its "
                                    f"interface an IPv4 address (on Thunderbolt RDMA the link "
                                    f"does not route without one)"))
    c = info["chosen"]
    if c:
        rails = c.get("rails", 1)
        out.append(("ok", f"verbs would use {c['device']} port {c['port']} GID {c['gid']}, "
                          f"profile {c['profile']}"
                          + (f", {rails} rails (transfers spread over both)" if rails > 1
                             else "")))
    else:
        out.append(("fail", f"verbs: {info['error']}; between machines pooltensor uses tcp"))
    if _thunderbolt_bridge():
        out.append(("warn", "the 'Thunderbolt Bridge' network service is still present: remove "
                            "it (System Settings > Network) so that RDMA has the Thunderbolt "
                            "interfaces"))
    if os.environ.get("POOLTENSOR_VERBS_LIB"):
        out.append(("info", f"POOLTENSOR_VERBS_LIB={os.environ['POOLTENSOR_VERBS_LIB']}"))
    return out


def findings(checks=None, opts=None):
    """Every check's findings as dicts: check (its name), level, text, fix (None for a pass
    or an info)."""
    out = []
    for check in checks or CHECKS:
        name = getattr(check, "title", check.__name__.replace("check_", "").replace("_", " "))
        try:
            got = check(opts or {})
        except Exception as e:          # a check that breaks is a finding, not a crash
            got = [("fail", f"the check itself failed: {type(e).__name__}: {e}",
                    "report this with the output of `pooltensor info --json`")]
        for f in got:
            level, text, fix = (tuple(f) + (None,))[:3]
            level = "pass" if level == "ok" else level
            if (level == "info" and text.lstrip().startswith("-> ") and out
                    and out[-1]["check"] == name and out[-1]["level"] in ("warn", "fail")):
                # an older check's advice on a line of its own: the fix of what it follows
                extra = text.lstrip()[3:]
                out[-1]["fix"] = f"{out[-1]['fix']}; {extra}" if out[-1]["fix"] else extra
                continue
            out.append({"check": name, "level": level, "text": text, "fix": fix})
    return out


def run(stream=None, checks=None, opts=None, as_json=False):
    """Run every check (or `checks`) and print its findings, a line each ([pass], [warn],
    [fail], [info]) with the fix under a warn or fail; or one JSON object (as_json). Returns
    0, or 1 when one failed."""
    import sys
    stream = stream or sys.stdout
    found = findings(checks, opts)
    worst = max((LEVELS.index(f["level"]) for f in found), default=0)
    status = 1 if worst == LEVELS.index("fail") else 0
    if as_json:
        json.dump({"status": LEVELS[worst] if found else "pass", "findings": found}, stream,
                  indent=1)
        stream.write("\n")
        return status
    for f in found:
        stream.write(f"[{f['level']:>4}] {f['text']}\n")
        if f["fix"]:
            stream.write(f"       fix: {f['fix']}\n")
    return status


def pair(role, address, quick=False, stream=None):
    """The pair self-test: `pooltensor doctor --listen HOST:PORT` on one machine (rank 0,
    passive) and `pooltensor doctor --peer HOST:PORT` on the other (rank 1, measures): a world
    of two over verbs (POOLTENSOR_TRANSPORT=verbs: an error, naming the reason, where either
    end has none), then 8-byte latency P50/P99 and get/put bandwidth 4 KiB .. 64 MiB (1 MiB
    with quick). Returns the exit status."""
    import sys
    import time

    import numpy as np
    stream = stream or sys.stdout
    os.environ.update({"POOLTENSOR_RANK": "0" if role == "listen" else "1",
                       "POOLTENSOR_WORLD_SIZE": "2", "POOLTENSOR_COORDINATOR": address,
                       "POOLTENSOR_TRANSPORT": "verbs"})
    import collectives
    from collectives.errors import PooltensorError
    try:
        w = collectives.init()
    except PooltensorError as e:
        stream.write(f"[fail] pair test: {e}\n")
        return 1
    top = (1 << 20) if quick else (64 << 20)
    win = w.expose(top)
    stream.write(f"[info] pair test: rank {w.rank} of 2, verbs: {w.describe()['verbs']}\n")
    from collectives.transport import verbs
    if any(str(d.get("fw", "")).startswith("fakeverbs") for d in verbs.probe()["devices"]):
        stream.write("[info] the simulated provider of the tests: these figures say nothing "
                     "about hardware\n")
    w.barrier()
    if w.rank == 1:
        out8 = np.zeros(8, np.uint8)
        samples = []
        for i in range(2000 if quick else 20000):
            t = time.perf_counter_ns()
            win.get(0, 0, out8)
            samples.append(time.perf_counter_ns() - t)
        samples.sort()
        p50, p99 = samples[len(samples) // 2] / 1e3, samples[int(len(samples) * 0.99)] / 1e3
        stream.write(f"[  ok] 8 B get latency: P50 {p50:.1f} us, P99 {p99:.1f} us\n")
        buf = np.ones(top, np.uint8)
        size = 4096
        while size <= top:
            rates = {}
            for name, op in (("get", win.get), ("put", win.put)):
                n, t0 = 0, time.perf_counter()
                while time.perf_counter() - t0 < (0.05 if quick else 0.2) or n < 3:
                    op(0, 0, buf[:size])
                    n += 1
                rates[name] = size * n / (time.perf_counter() - t0) / 1e9
            stream.write(f"[  ok] {size >> 10:>6} KiB: get {rates['get']:.2f} GB/s, "
                         f"put {rates['put']:.2f} GB/s\n")
            size *= 4
    w.barrier(timeout=3600)
    collectives.finalize()
    return 0
