"""The general checks of ``pooltensor doctor`` (pooltensor/doctor.py runs them, then the verbs
check): shared-memory huge pages, the secret file and its mode, the ports of the jobs and
memory servers named on the command line (can this machine reach them?), and the transport
each peer pair of a running job uses, read from its metrics endpoint.

Each check takes the run's options (``endpoints``: metrics endpoints "HOST:PORT" of a job's
ranks or of servers; ``servers``: memory servers' control ports "HOST:PORT"; ``timeout``:
seconds per connection) and returns findings (level, text[, fix]); a warn or a fail always
carries its fix. Nothing here changes the machine or the job: it reads files, opens TCP
connections and closes them, and reads metrics.
"""
import os
import socket
import stat

from . import info as _info

WILDCARDS = ("", "0.0.0.0", "::", "*")


def _titled(name):
    def mark(check):
        check.title = name
        return check
    return mark


@_titled("huge pages")
def check_huge_pages(opts):
    """Whether memfd/shm segments (pool memory) get transparent huge pages."""
    path = os.path.join(_info.THP, "shmem_enabled")
    shmem = _info._thp("shmem_enabled")
    if shmem is None:
        return [("info", f"huge pages: no {path} here: pool memory gets the system's own "
                         f"pages; nothing to do")]
    if shmem in ("advise", "always", "force", "within_size"):
        return [("pass", f"huge pages: shmem_enabled={shmem}: pool memory gets 2 MiB pages")]
    return [("warn", f"huge pages: shmem_enabled={shmem}: pool memory gets 4 KiB pages "
                     f"(more TLB misses on big arrays)",
             f"as root: echo advise > {path} (lasts until reboot; put the same line in a "
             f"boot script to keep it)")]


def _make_secret(path):
    return (f"umask 077; python3 -c 'import secrets; print(secrets.token_hex(32))' > {path} "
            f"and give every client and server of the pool the same file")


@_titled("secret file")
def check_secret_file(opts):
    """The secret file that servers and their clients would use: there, private, long enough,
    yours."""
    from collectives import control
    named = control.secret_path(None)
    path = named or control.default_secret_path()
    src = f"${control.ENV_SECRET}" if named else "default"
    try:
        st = os.stat(path)
    except FileNotFoundError:
        if named:
            return [("fail", f"secret file {path} ({src}) does not exist", _make_secret(path))]
        return [("info", f"secret file {path} (default): not there yet; `pooltensor serve` "
                         f"makes it (mode 0600); only memory servers and their clients use it")]
    except OSError as e:
        return [("fail", f"secret file {path} ({src}): {e.strerror}",
                 f"make {os.path.dirname(path)} readable by you, or point "
                 f"${control.ENV_SECRET} at a file you can read")]
    mode = stat.S_IMODE(st.st_mode)
    if not stat.S_ISREG(st.st_mode):
        return [("fail", f"secret file {path} ({src}) is not a regular file",
                 _make_secret(path))]
    if mode & 0o077:
        return [("fail", f"secret file {path} ({src}) has mode {mode:04o}: other users can "
                         f"read it, and pooltensor refuses it", f"chmod 600 {path}")]
    out = []
    if hasattr(os, "getuid") and st.st_uid != os.getuid():
        out.append(("warn", f"secret file {path} ({src}) belongs to uid {st.st_uid}, not to "
                            f"you (uid {os.getuid()}): its owner can change it",
                    f"chown {os.getuid()} {path}, or use a copy of your own"))
    folder = os.path.dirname(os.path.abspath(path))
    fmode = stat.S_IMODE(os.stat(folder).st_mode)
    if fmode & 0o022:
        out.append(("warn", f"the folder of the secret file, {folder}, has mode {fmode:04o}: "
                            f"other users can replace the file", f"chmod go-w {folder}"))
    try:
        secret = control.read_secret(path)
    except ValueError as e:
        return out + [("fail", str(e), _make_secret(path))]
    return [("pass", f"secret file {path} ({src}): mode {mode:04o}, {len(secret)} bytes")] + out


# ---- reaching a job or a server ---------------------------------------------------------------

def split(address):
    """"HOST:PORT" -> (host, port); ValueError naming the address otherwise."""
    host, sep, port = str(address).strip().rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) <= 65535:
        raise ValueError(f"{address!r} is not HOST:PORT")
    return host.strip("[]") or "127.0.0.1", int(port)


def reach(host, port, timeout):
    """None when a TCP connection to host:port opens (it is closed at once), else why not."""
    try:
        socket.create_connection((host, port), timeout=timeout).close()
        return None
    except ConnectionRefusedError:
        return "connection refused: nothing listens there"
    except socket.timeout:
        return f"no answer within {timeout:g} s (a firewall that drops it?)"
    except OSError as e:
        return e.strerror or str(e)


def _scrape(opts, address):
    """The endpoint's metric families, read once per run (shared by the checks); or the
    EndpointError's text."""
    from .stats import EndpointError, scrape
    cache = opts.setdefault("_scraped", {})
    if address not in cache:
        try:
            cache[address] = scrape(address, timeout=opts.get("timeout", 3.0))
        except EndpointError as e:
            cache[address] = str(e)
    return cache[address]


_LISTEN_FIX = {
    "tcp": "the rank's data listener: open this port in the firewall between the machines, "
           "or set POOLTENSOR_LISTEN=HOST[:PORT] to an interface the others reach",
    "control": "the server's control port: open it in the firewall, or start the server with "
               "--listen on an interface this machine reaches (0.0.0.0:PORT: every one)",
    "data": "the server's data port: open it in the firewall (pooltensor serve --data-port P "
            "fixes its number)",
}


def _server(address, opts):
    """A memory server's control port (the greeting, then the handshake when this machine
    holds the secret) and its data port."""
    from collectives import control
    timeout = opts.get("timeout", 3.0)
    host, port = split(address)
    why = reach(host, port, timeout)
    if why:
        return [("fail", f"server {host}:{port}: {why}",
                 "is `pooltensor serve` running there? " + _LISTEN_FIX["control"])]
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            hello = control.recv_frame(sock, None)
    except (OSError, control.ProtocolError) as e:
        hello = None
        why = str(e)
    if not hello or hello.get("hello") != control.HELLO:
        return [("fail", f"server {host}:{port}: something answers, but not a pooltensor "
                         f"server ({why or 'no greeting'})",
                 "check the port: the server prints its control port when it starts")]
    out = [("pass", f"server {host}:{port}: its control port answers")]
    path = control.secret_path(None) or control.default_secret_path()
    try:
        secret = control.read_secret(path)
    except ValueError as e:
        return out + [("info", f"server {host}:{port}: its data port is not checked without "
                               f"a usable secret here ({e})")]
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            facts = control.client_handshake(sock, secret, f"{host}:{port}", timeout)
    except Exception as e:        # AuthenticationError, ServerRefused, Timeout, ...
        return out + [("fail", f"server {host}:{port}: the handshake failed: {e}",
                       f"give this machine a copy of the server's secret file ({path}, or "
                       f"${control.ENV_SECRET})")]
    data = int(facts.get("data_port") or 0)
    why = reach(host, data, timeout)
    if why:
        return out + [("fail", f"server {host}:{port}: data port {data}: {why}",
                       _LISTEN_FIX["data"])]
    return out + [("pass", f"server {host}:{port}: data port {data} answers (data moves "
                           f"over tcp)")]


@_titled("ports")
def check_ports(opts):
    """The ports of what the run names: each metrics endpoint and the ports its member says
    it listens on (pooltensor_listen_info), and each memory server's control and data
    ports."""
    endpoints, servers = opts.get("endpoints") or [], opts.get("servers") or []
    if not endpoints and not servers:
        return [("info", "ports: no job or server named (--endpoint HOST:PORT: a job's or a "
                         "server's metrics endpoint; --server HOST:PORT: a memory server)")]
    out = []
    timeout = opts.get("timeout", 3.0)
    for address in endpoints:
        fams = _scrape(opts, address)
        if isinstance(fams, str):
            out.append(("fail", f"endpoint {address}: {fams}",
                        "is the job running with pooltensor.init(metrics=':PORT') or "
                        "POOLTENSOR_METRICS (under SPMD rank r serves on PORT + its local "
                        "rank), or the server with --metrics? Open the port in the firewall"))
            continue
        out.append(("pass", f"endpoint {address}: its metrics answer"))
        host = split(address)[0]
        f = fams.get("pooltensor_listen_info")
        for s in f.samples if f else ():
            kind, where = s.labels["kind"], s.labels["address"]
            lhost, lport = split(where)
            lhost = host if lhost in WILDCARDS else lhost
            member = s.labels["member"]
            why = reach(lhost, lport, timeout)
            if why:
                out.append(("fail", f"member {member}: {kind} port {lhost}:{lport}: {why}",
                            _LISTEN_FIX.get(kind, "open the port in the firewall")))
            else:
                out.append(("pass", f"member {member}: {kind} port {lhost}:{lport} answers"))
    for address in servers:
        try:
            out.extend(_server(address, opts))
        except ValueError as e:
            out.append(("fail", f"server: {e}", "give --server as HOST:PORT"))
    return out


@_titled("transports")
def check_transports(opts):
    """Which transport each peer pair of a running job uses (each endpoint reports its own
    member's links: name every rank's endpoint to see every pair), and links that are lost or
    that failed."""
    endpoints = opts.get("endpoints") or []
    if not endpoints:
        from collectives import _native
        return [("info", f"transports: built in here: {', '.join(_native.transports())}; name "
                         f"a job's metrics endpoints (--endpoint) to see each peer pair's")]
    out = []
    for address in endpoints:
        fams = _scrape(opts, address)
        if isinstance(fams, str):
            continue                       # (the ports check says why)
        links, events = {}, {}
        for name in ("pooltensor_peer_up", "pooltensor_peer_lost"):
            f = fams.get(name)
            for s in f.samples if f else ():
                key = (s.labels["member"], s.labels["peer"])
                link = links.setdefault(key, {})
                link[name.rsplit("_", 1)[1]] = bool(s.value)
                if "transport" in s.labels:
                    link["transport"] = s.labels["transport"]
        f = fams.get("pooltensor_link_events")
        for s in f.samples if f else ():
            if s.name.endswith("_total") and s.value:
                events.setdefault((s.labels["member"], s.labels["peer"]), {})[
                    s.labels["event"]] = int(s.value)
        pairs = [(m, p) for m, p in links if m != p]
        if not pairs:
            out.append(("info", f"endpoint {address}: no peers (a world of one, or a server "
                                f"that only serves)"))
        for m, p in sorted(pairs, key=lambda k: (k[0], int(k[1]) if k[1].isdigit() else 0)):
            link, ev = links[(m, p)], events.get((m, p), {})
            tr = link.get("transport", "none")
            where = f"member {m} -> peer {p}"
            if link.get("lost"):
                out.append(("fail", f"{where}: lost (was {tr})",
                            f"peer {p} is gone: see its log; its slabs raise PeerLost until "
                            f"the pool is rebuilt (pool.lost() lists them); restart the job "
                            f"or the member"))
            elif not link.get("up"):
                out.append(("info", f"{where}: not connected (yet): connections are made at "
                                    f"the first transfer"))
            elif ev.get("errors") or ev.get("timeouts"):
                out.append(("warn", f"{where}: {tr}, up, but {ev.get('errors', 0)} error(s) "
                                    f"and {ev.get('timeouts', 0)} timeout(s) so far",
                            f"look at member {m}'s log with POOLTENSOR_LOG=debug; "
                            f"`pooltensor stats {address} --watch` shows when they happen"))
            else:
                out.append(("pass", f"{where}: {tr}, up"))
    return out


GENERAL = [check_huge_pages, check_secret_file, check_ports, check_transports]
