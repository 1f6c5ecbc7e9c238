"""The control channel between a process and a memory server: secrets, frames, handshake.

Why a channel apart from the data path: asking for memory, and learning when a client is gone
so its memory can be freed, are rare and need a lifetime (a connection that ends when the
client ends); bytes move only over the native transport, never through this Python.

Frames: a 4-byte little-endian length, then that many bytes of msgpack (a map). A frame
longer than MAX_FRAME, bytes that are not msgpack, or anything but a map ends the connection.

Handshake (HMAC-SHA256 over the shared secret; each side proves it knows it, and nonces from
both sides make every exchange fresh, so a recorded one cannot be replayed; the two proofs use
different labels, so one side's proof cannot be reflected back as the other's):

    server -> client  {"hello": "pooltensor-serve", "version": 1, "nonce": Ns}
    client -> server  {"nonce": Nc, "mac": HMAC(secret, CLIENT_LABEL + Ns + Nc)}
    server -> client  {"mac": HMAC(secret, SERVER_LABEL + Nc + Ns), ...server facts}
                      or {"error": "authentication failed"} and the connection closes
                      or {"error": why, "refused": True}: the proof was right, but the
                      server is at a limit (clients, connections from one address)

Both sides bound the whole handshake by a deadline (not each recv), so a peer that trickles
bytes cannot hold a connection open past it.

Secrets: a file of at least 16 bytes (trailing whitespace ignored), readable by its owner
only. ``python -c "import secrets; print(secrets.token_hex(32))" > F; chmod 600 F`` makes one;
``pooltensor serve`` makes one at default_secret_path() when given none.
"""
import hashlib
import hmac
import os
import secrets
import socket
import struct
import time

import msgpack

from .errors import BootstrapError, PooltensorError, Timeout

ENV_SECRET = "POOLTENSOR_SECRET_FILE"
MAX_FRAME = 64 * 1024            # every control message is small: anything larger is hostile
PLAN_FRAME = 4 << 20             # ...except, once authenticated, a plan and its reply (their
                                 # slab maps grow with the arrays: ~5 B a slab and array)
REPLY_FRAME = 1 << 30            # and a plan's reply as its client reads it: as large as what
                                 # the plan asked for (a reduction's partials are as large as
                                 # its result: x.sum(axis=0) of a wide array), from a server
                                 # that proved the secret
MIN_SECRET = 16
NONCE = 32
VERSION = 1
HELLO = "pooltensor-serve"
CLIENT_LABEL = b"pooltensor control client\0"
SERVER_LABEL = b"pooltensor control server\0"
_LEN = struct.Struct("<I")


class AuthenticationError(PooltensorError):
    """The other end of a control connection does not know the secret (or is not a server)."""


class ProtocolError(PooltensorError):
    """A control frame that breaks the protocol (too long, not msgpack, not a map)."""


class ServerRefused(PooltensorError):
    """A memory server refused a request or a connection (not enough free memory, one of its
    limits reached: clients, connections from one address, allocations or registrations of
    one client)."""


# -- secrets --------------------------------------------------------------------------------

def default_secret_path():
    """Where ``pooltensor serve`` keeps the secret it makes when given none."""
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return os.path.join(base, "pooltensor", "secret")


def read_secret(path):
    """The secret in file `path` (bytes). ValueError with the reason when it cannot serve:
    missing, unreadable, shorter than 16 bytes, or open to other users (chmod 600)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError as e:
        raise ValueError(f"secret file {path}: {e.strerror}") from None
    try:
        st = os.fstat(fd)
        if st.st_mode & 0o077:
            raise ValueError(f"secret file {path} is open to other users (mode "
                             f"{st.st_mode & 0o777:o}): chmod 600 {path}")
        data = os.read(fd, 1 << 16)
    finally:
        os.close(fd)
    data = data.rstrip()
    if len(data) < MIN_SECRET:
        raise ValueError(f"secret file {path} holds {len(data)} bytes; a secret needs at "
                         f"least {MIN_SECRET}")
    return data


def create_secret(path):
    """Write a new random secret (64 hex digits) to `path`, mode 0600; the parent folder is
    made (0700) if missing. Refuses to overwrite an existing file."""
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, mode=0o700, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.write(fd, (secrets.token_hex(32) + "\n").encode())
    finally:
        os.close(fd)
    return read_secret(path)


def secret_path(secret_file=None):
    """The secret file to use: the argument, else $POOLTENSOR_SECRET_FILE, else None."""
    path = secret_file or os.environ.get(ENV_SECRET) or None
    return os.path.expanduser(os.fspath(path)) if path else None


# -- frames ---------------------------------------------------------------------------------

def _settimeout(sock, deadline):
    if deadline is not None:
        left = deadline - time.monotonic()
        if left <= 0:
            raise socket.timeout("the deadline passed")
        sock.settimeout(left)


def recv_frame(sock, deadline=None, max_frame=MAX_FRAME):
    """The next message (a dict), or None when the peer closed between frames.
    ProtocolError for a bad frame or one over max_frame bytes (PLAN_FRAME only on connections
    whose peer has authenticated); socket.timeout / OSError pass through. `deadline` (a
    time.monotonic() value) bounds the whole frame, however the bytes trickle in. What a
    timed-out call read is gone (and the stream with it): FrameReader keeps it."""
    return FrameReader(sock).recv(deadline, max_frame)


def _decode(body):
    try:
        msg = msgpack.unpackb(body, raw=False, strict_map_key=True)
    except Exception as e:
        raise ProtocolError(f"frame is not msgpack: {type(e).__name__}") from None
    if not isinstance(msg, dict):
        raise ProtocolError(f"frame is a {type(msg).__name__}, not a map")
    return msg


class FrameReader:
    """The frames of one connection, read so that a wait that times out loses nothing: the
    bytes of a frame read so far stay here, and the next read goes on from them. A client
    that stopped waiting for one reply (socket.timeout) can then still read it later, and
    the replies after it, in step (remote._Server's owed replies). It never reads past the
    frame it is reading, and each byte is received straight into the frame's buffer."""

    def __init__(self, sock):
        self.sock = sock
        self.head = bytearray(4)
        self.body = None            # the frame's bytes, once its length is known
        self.got = 0                # bytes of the header, then of the body, received

    def recv(self, deadline=None, max_frame=MAX_FRAME):
        """As recv_frame (None: closed between frames)."""
        while True:
            if self.body is None and self.got == 4:
                (n,) = _LEN.unpack(self.head)
                if n > max_frame:
                    raise ProtocolError(f"frame of {n} bytes (at most {max_frame})")
                self.body, self.got = bytearray(n), 0
            buf = self.head if self.body is None else self.body
            if self.body is not None and self.got == len(buf):
                self.body, self.got = None, 0
                return _decode(buf)
            _settimeout(self.sock, deadline)
            k = self.sock.recv_into(memoryview(buf)[self.got:])
            if k == 0:
                if self.got or self.body is not None:
                    raise ProtocolError("connection closed in the middle of a frame")
                return None
            self.got += k


def send_frame(sock, msg, deadline=None):
    """Send one message (a dict); `deadline` as for recv_frame."""
    body = msgpack.packb(msg, use_bin_type=True)
    _settimeout(sock, deadline)
    sock.sendall(_LEN.pack(len(body)) + body)


def keepalive(sock, idle=10, interval=5, count=3):
    """Let the kernel notice a peer that vanished without closing (host gone, link cut)."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        if hasattr(socket, "TCP_KEEPIDLE"):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, idle)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, interval)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, count)
    except OSError:
        pass


# -- handshake ------------------------------------------------------------------------------

def _mac(secret, label, a, b):
    return hmac.new(secret, label + a + b, hashlib.sha256).digest()


def _nonce(msg, what):
    n = msg.get("nonce")
    if not isinstance(n, bytes) or len(n) != NONCE:
        raise ProtocolError(f"{what}: no {NONCE}-byte nonce")
    return n


def server_handshake(sock, secret, facts, deadline=None, admit=None):
    """Server side: True once the client proved the secret and got our proof and `facts`
    (a dict sent along); False after a wrong proof (the client is told, then dropped).
    admit(): called once the proof is right; it may raise ServerRefused, which the client is
    told (with "refused") before it passes through. ProtocolError for a malformed exchange,
    socket.timeout past `deadline` (time.monotonic()), for the whole exchange."""
    ns = secrets.token_bytes(NONCE)
    send_frame(sock, {"hello": HELLO, "version": VERSION, "nonce": ns}, deadline)
    msg = recv_frame(sock, deadline)
    if msg is None:
        raise ProtocolError("closed before authenticating")
    nc = _nonce(msg, "client proof")
    mac = msg.get("mac")
    if not isinstance(mac, bytes) or not hmac.compare_digest(
            mac, _mac(secret, CLIENT_LABEL, ns, nc)):
        try:
            send_frame(sock, {"error": "authentication failed: the client's secret is not "
                                       "the server's"}, deadline)
        except OSError:
            pass
        return False
    if admit is not None:
        try:
            admit()
        except ServerRefused as e:
            try:
                send_frame(sock, {"error": str(e), "refused": True}, deadline)
            except OSError:
                pass
            raise
    send_frame(sock, dict(facts, mac=_mac(secret, SERVER_LABEL, nc, ns)), deadline)
    return True


def client_handshake(sock, secret, where, timeout=None):
    """Client side: prove the secret, check the server's proof; returns the server's facts.
    `where` names the server in messages; `timeout` (seconds) bounds the whole exchange. What each failure says is what happened:
    AuthenticationError: either proof failed, or the peer does not speak this protocol;
    ServerRefused: the server took the proof but is at one of its limits;
    Timeout: no greeting, or no answer, before the deadline;
    BootstrapError: the connection was closed or reset before the handshake ended."""
    deadline = None if timeout is None else time.monotonic() + float(timeout)

    def wait(stage):
        try:
            return recv_frame(sock, deadline)
        except socket.timeout:
            left = "" if timeout is None else f" within {float(timeout):g} s"
            raise Timeout(f"{where} did not {stage}{left} (a server too busy to answer, "
                          f"or something that is not a memory server)") from None
        except ProtocolError as e:
            if stage == "greet":
                raise AuthenticationError(f"{where} is not a pooltensor memory server (what "
                                          f"it sent is not a control frame: {e})") from None
            raise
        except OSError as e:
            raise BootstrapError(f"{where} reset the connection before the handshake ended "
                                 f"({e.strerror or e})") from None

    hello = wait("greet")
    if hello is None:
        raise BootstrapError(f"{where} closed the connection before greeting (a memory server "
                             f"does that when it is stopping, or drops the oldest of the "
                             f"connections still authenticating when too many arrive at "
                             f"once; anything else may not be a memory server)")
    if hello.get("hello") != HELLO:
        raise AuthenticationError(f"{where} is not a pooltensor memory server (it did not "
                                  f"greet as one)")
    if hello.get("version") != VERSION:
        raise AuthenticationError(f"{where} speaks control protocol version "
                                  f"{hello.get('version')!r}; this process speaks {VERSION}")
    ns = _nonce(hello, "server greeting")
    nc = secrets.token_bytes(NONCE)
    try:
        send_frame(sock, {"nonce": nc, "mac": _mac(secret, CLIENT_LABEL, ns, nc)}, deadline)
    except socket.timeout:
        raise Timeout(f"{where} did not take this process's proof in time") from None
    except OSError as e:
        raise BootstrapError(f"{where} closed the connection while authenticating "
                             f"({e.strerror or e})") from None
    reply = wait("answer the proof")
    if reply is None:
        raise BootstrapError(f"{where} closed the connection while authenticating (a memory "
                             f"server under a flood of connections drops the oldest still "
                             f"authenticating; or it is stopping)")
    if "error" in reply:
        if reply.get("refused"):
            raise ServerRefused(f"{where} refused the connection: {reply['error']}")
        raise AuthenticationError(f"{where} refused this process: {reply['error']}")
    mac = reply.pop("mac", None)
    if not isinstance(mac, bytes) or not hmac.compare_digest(
            mac, _mac(secret, SERVER_LABEL, nc, ns)):
        raise AuthenticationError(f"{where} failed to prove it knows the secret")
    return reply
