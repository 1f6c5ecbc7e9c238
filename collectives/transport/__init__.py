"""Transports: how bytes reach a peer. Every transport serves the same one-sided operations
(get, put, fetch_add, compare_swap, notify) behind the native context; this module only chooses
one per peer, and where a rank listens for tcp.

- ``shm``: same machine; the peer's segments are mapped and copied directly (native/src/transport/shm/).
- ``tcp``: between machines; served at the target by native threads, authenticated with the
  pool's secret (native/src/transport/tcp/). ``POOLTENSOR_TRANSPORT=tcp`` uses it on one
  machine too.
- ``verbs``: between machines that both have an active RDMA port on a common fabric
  (native/src/transport/verbs/, collectives/transport/verbs.py); tcp is connected too, as the
  liveness channel and the fallback once a queue pair fails. ``POOLTENSOR_TRANSPORT=verbs``
  uses it for every peer, on one machine too, and is an error where a rank has no verbs.

A machine is (hostname, boot id, network namespace): ranks in different network namespaces
cannot reach each other's loopback, so they are different machines to the transports (which is
how several hosts are tried out on one box).
"""
import os
import socket

TRANSPORTS = ("shm", "tcp", "verbs")
REMOTE = ("tcp", "verbs")          # served by the target's native threads or its NIC
ENV_TRANSPORT, ENV_LISTEN = "POOLTENSOR_TRANSPORT", "POOLTENSOR_LISTEN"
WILDCARDS = ("", "0.0.0.0", "::", "*")


def forced():
    """The transport named by POOLTENSOR_TRANSPORT, or None; ValueError for an unknown name."""
    name = os.environ.get(ENV_TRANSPORT, "").strip().lower() or None
    if name and name not in TRANSPORTS:
        raise ValueError(f"{ENV_TRANSPORT}={name!r}: choose one of {TRANSPORTS}")
    return name


_UNSET = object()


def choose(machines, rank, force=_UNSET, fabrics=None):
    """The transport to each rank: 'self', 'shm' on this machine, 'verbs' elsewhere when both
    ranks are on one RDMA fabric (fabrics: each rank's, or None), else 'tcp'; or `force`
    (default: POOLTENSOR_TRANSPORT). Symmetric: rank a's choice for b is b's for a."""
    force = forced() if force is _UNSET else force
    out = []
    for r, m in enumerate(machines):
        if r == rank:
            out.append("self")
        elif force:
            out.append(force)
        elif m == machines[rank]:
            out.append("shm")
        elif fabrics and fabrics[r] and fabrics[r] == fabrics[rank]:
            out.append("verbs")
        else:
            out.append("tcp")
    return out


def wants_verbs(machines, forces):
    """Whether the world asks its ranks about verbs (collectively decided, the same on every
    rank): some rank forces verbs, or some pair is on different machines and nobody forces
    another transport."""
    if "verbs" in forces:
        return True
    if any(f for f in forces):
        return False
    return len(set(map(tuple, machines))) > 1


def facing_address(host):
    """This machine's address on the route to `host` (the interface that faces it), or None.

    A UDP connect sends nothing; it only asks the kernel which source address it would use."""
    if not host or host in WILDCARDS:
        return None
    try:
        infos = socket.getaddrinfo(host, 9, type=socket.SOCK_DGRAM)
    except OSError:
        return None
    for family, kind, proto, _, addr in infos:
        s = socket.socket(family, kind, proto)
        try:
            s.connect(addr)
            return s.getsockname()[0]
        except OSError:
            continue
        finally:
            s.close()
    return None


def listen_address(all_local, coordinator):
    """(host to bind, port, host to publish) for this rank's tcp listener.

    POOLTENSOR_LISTEN=host or host:port when set; else loopback when every peer is on this
    machine; else the address facing the coordinator (the interface the others reach us on).
    A wildcard bind publishes the facing address (or the hostname)."""
    raw = os.environ.get(ENV_LISTEN, "").strip()
    port = 0
    if raw:
        host, sep, p = raw.rpartition(":")
        if not sep or ("]" not in raw and raw.count(":") > 1):   # bare host (or IPv6 address)
            host, p = raw, ""
        host = host.strip("[]")
        if p:
            if not p.isdigit() or not 0 <= int(p) <= 65535:
                raise ValueError(f"{ENV_LISTEN} must be host or host:port, not {raw!r}")
            port = int(p)
    elif all_local:
        host = "127.0.0.1"
    else:
        host = facing_address(coordinator) or "0.0.0.0"
    publish = host
    if host in WILDCARDS:
        host = "0.0.0.0" if host in ("", "*") else host
        publish = facing_address(coordinator) or socket.gethostname()
    return host, port, publish
