"""The verbs transport from Python's side: what the native probe found (parsed for the world's
choice, ``describe()`` and ``pooltensor doctor``), and the fabric a rank is on.

The native layer opens the verbs library with dlopen at first use (libibverbs.so.1; macOS
/usr/lib/librdma.dylib; ``POOLTENSOR_VERBS_LIB``), so a machine without it just has no verbs:
``summary()`` then says why in one line and every peer is reached over tcp. Two ranks on
different machines use verbs when both have an active port on a common fabric: the same
InfiniBand subnet prefix, or both on Ethernet (RoCE / Thunderbolt RDMA, routed by IP).
"""
from .. import _native

ENV_LIB, ENV_DEVICE, ENV_GID, ENV_PROFILE = ("POOLTENSOR_VERBS_LIB", "POOLTENSOR_VERBS_DEVICE",
                                             "POOLTENSOR_VERBS_GID", "POOLTENSOR_VERBS_PROFILE")
LINK = {0: "unspecified", 1: "InfiniBand", 2: "Ethernet"}
GID_TYPE = {-1: "unknown", 0: "IB/RoCE v1", 1: "RoCE v1", 2: "RoCE v2"}
PORT_STATE = {1: "down", 2: "init", 3: "armed", 4: "active", 5: "active (deferred)"}
MTU = {1: 256, 2: 512, 3: 1024, 4: 2048, 5: 4096}


def _kv(words):
    out = {}
    for w in words:
        k, _, v = w.partition("=")
        out[k] = int(v) if v.lstrip("-").isdigit() else v
    return out


def probe():
    """What the verbs library and its devices offer, as a dict: library, error (one line, or
    None), devices, ports, gids, chosen (device, port, gid, profile) or None."""
    out = {"library": None, "error": None, "devices": [], "ports": [], "gids": [],
           "chosen": None}
    for line in _native.verbs_probe().splitlines():
        kind, _, rest = line.partition(" ")
        words = rest.split()
        if kind == "library":
            out["library"] = rest
        elif kind == "error":
            out["error"] = rest
        elif kind == "device" and words:
            out["devices"].append({"name": words[0], **_kv(words[1:])})
        elif kind == "port" and len(words) >= 2:
            out["ports"].append({"device": words[0], "port": int(words[1]), **_kv(words[2:])})
        elif kind == "gid" and len(words) >= 5:
            out["gids"].append({"device": words[0], "port": int(words[1]),
                                "index": int(words[2]), **_kv(words[3:4]), "gid": words[4]})
        elif kind == "chosen" and len(words) >= 4:
            out["chosen"] = {"device": words[0], "port": int(words[1]), "gid": int(words[2]),
                             **_kv(words[3:])}
    return out


def fabric(info):
    """The fabric the chosen port is on ('ib:<subnet prefix>' or 'ethernet'), or None."""
    c = info.get("chosen")
    if not c:
        return None
    port = next((p for p in info["ports"]
                 if p["device"] == c["device"] and p["port"] == c["port"]), {})
    if port.get("link") == 1:
        gid = next((g["gid"] for g in info["gids"] if g["device"] == c["device"]
                    and g["port"] == c["port"] and g["index"] == c["gid"]), "")
        return "ib:" + ":".join(gid.split(":")[:4])
    return "ethernet"


def summary():
    """This rank's verbs in a few fields, for the world's records: fabric (None when verbs
    cannot be used here), profile, device and why (the one line describe() shows)."""
    try:
        info = probe()
    except Exception as e:          # a library that misbehaves: no verbs, and say why
        return {"fabric": None, "why": f"verbs probe failed: {e}"}
    c = info["chosen"]
    if not c:
        return {"fabric": None, "why": f"verbs not available: {info['error'] or 'no device'}; "
                                      f"tcp is used instead"}
    return {"fabric": fabric(info), "profile": c["profile"],
            "why": f"{c['profile']} on {c['device']} port {c['port']} GID {c['gid']}"}
