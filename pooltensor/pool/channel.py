"""The socket pair between a plain script and one of its member processes.

Made at spawn time (spawn.py): nothing listens on the network, only the script's children
hold an end, and the kernel closes it when either side dies, so a member killed mid-operation
is PeerLost in the script at once, without a timeout to wait out. Frames are length-prefixed
bytes; what they carry is pool/work.py's business.
"""
import select
import socket
import struct
import time

from collectives.errors import PeerLost, PooltensorError, Timeout

_LEN = struct.Struct("<Q")
MAX_FRAME = 1 << 31                  # a plan or reply larger than this is refused


class MemberError(PooltensorError, RuntimeError):
    """A member refused or failed an operation in a way numpy has no exception for (a plan
    outside its vocabulary, a reply that does not decode). Names the member."""


class Channel:
    """One end of a script <-> member socket pair: length-prefixed frames."""

    def __init__(self, sock, peer):
        self.sock = sock
        self.peer = peer               # the rank at the other end (for messages)

    def send(self, data):
        """Send one frame (bytes); PeerLost when the other end is gone."""
        try:
            if len(data) < 1 << 16:          # one system call (a wake-up of the peer) for both
                self.sock.sendall(_LEN.pack(len(data)) + data)
            else:
                self.sock.sendall(_LEN.pack(len(data)))
                self.sock.sendall(data)
        except OSError as e:
            raise PeerLost(f"member {self.peer} is gone ({e.strerror or e})",
                           rank=self.peer) from None

    def recv(self, timeout=None, alive=None):
        """One frame; PeerLost at end of file, Timeout after `timeout` seconds (alive():
        polled meanwhile, False -> PeerLost)."""
        head = self._exact(_LEN.size, timeout, alive)
        n = _LEN.unpack(head)[0]
        if n > MAX_FRAME:
            raise MemberError(f"member {self.peer} sent a frame of {n} bytes")
        return self._exact(n, timeout, alive)

    def _exact(self, n, timeout, alive):
        buf = bytearray(n)
        view = memoryview(buf)
        got = 0
        deadline = None if timeout is None else time.monotonic() + timeout
        wait = 0.001
        while got < n:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise Timeout(f"member {self.peer} did not answer within {timeout:.0f} s",
                              rank=self.peer)
            r, _, _ = select.select([self.sock], [], [], wait if left is None
                                    else min(wait, left))
            wait = min(0.25, wait * 2)        # poll briefly, then block in longer steps
            if not r:
                if alive is not None and not alive():
                    raise PeerLost(f"member {self.peer} died", rank=self.peer)
                continue
            try:
                k = self.sock.recv_into(view[got:], n - got)
            except OSError as e:
                k = 0 if e.errno in (104, 32) else None
                if k is None:
                    raise
            if k == 0:
                raise PeerLost(f"member {self.peer} closed its channel (it exited or was "
                               f"killed)", rank=self.peer)
            got += k
        return bytes(buf)

    def close(self):
        try:
            self.sock.close()
        except OSError:
            pass


def pair(peer):
    """(script's Channel, the member's socket to inherit)."""
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    a.set_inheritable(False)
    b.set_inheritable(True)
    return Channel(a, peer), b
