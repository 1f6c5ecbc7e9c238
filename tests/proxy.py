"""A tcp forwarder that tests can cut: a real middlebox between a client and a server.

Why: a connection that drops while both processes live (a reset from the network, a
middlebox restarting) is what reconnect is for, and it cannot be told from a dead peer on the
socket. The forwarder accepts on its own port and relays each connection to the target;
``cut()`` ends every relayed connection at once (both ends see the stream end or a reset) while
the listener stays up, so the client's next dial gets through again. ``hold()`` stops
relaying replies (server -> client) so that a request is applied at the target but its answer
never arrives, then ``cut()`` makes it a request in doubt.
"""
import socket
import struct
import threading
import time


class Proxy:
    """Forward 127.0.0.1:<port> to (host, port); cut() ends the relayed connections."""

    def __init__(self, host, port):
        self.target = (host, port)
        self.ls = socket.socket()
        self.ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.ls.bind(("127.0.0.1", 0))
        self.ls.listen(16)
        self.port = self.ls.getsockname()[1]
        self.lock = threading.Lock()
        self.pairs = []
        self.accepted = 0
        self.held = threading.Event()
        self.muted = False
        self.mute_socks = []
        self.closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while not self.closed:
            try:
                c, _ = self.ls.accept()
            except OSError:
                return
            if self.muted:                  # accepted, and never a byte: a black hole
                self.mute_socks.append(c)
                continue
            try:
                s = socket.create_connection(self.target, timeout=5)
            except OSError:
                c.close()
                continue
            s.settimeout(None)   # the 5 s were for the dial: an idle relay must not end
            with self.lock:
                self.pairs.append((c, s))
                self.accepted += 1
            threading.Thread(target=self._pump, args=(c, s, False), daemon=True).start()
            threading.Thread(target=self._pump, args=(s, c, True), daemon=True).start()

    def _pump(self, src, dst, reply):
        while True:
            try:
                data = src.recv(1 << 16)
            except OSError:
                return
            if not data:
                try:
                    dst.shutdown(socket.SHUT_WR)
                except OSError:
                    pass
                return
            while reply and self.held.is_set():
                time.sleep(0.005)
                with self.lock:
                    if self.closed or not any(p[1] is src for p in self.pairs):
                        return          # cut meanwhile: the held bytes are dropped
            try:
                dst.sendall(data)
            except OSError:
                return

    def hold(self):
        """Stop relaying server -> client bytes (requests still reach the server)."""
        self.held.set()

    def mute(self, on=True):
        """New connections are accepted and then get no answer (the server is out of reach);
        off: relayed again."""
        self.muted = on

    def cut(self, which=None):
        """End every relayed connection at once (which: only the one accepted which-th among
        those still relayed); keep listening. Returns how many."""
        with self.lock:
            if which is None:
                pairs, self.pairs = self.pairs, []
            else:
                pairs = [self.pairs.pop(which)]
        for pair in pairs:
            for sock in pair:
                try:
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    sock.shutdown(socket.SHUT_RDWR)     # wakes its pump thread at once
                except OSError:
                    pass
                sock.close()
        self.held.clear()
        return len(pairs)

    def close(self):
        """Stop listening and cut what is relayed."""
        self.closed = True
        try:
            self.ls.shutdown(socket.SHUT_RDWR)      # wakes the accept thread
        except OSError:
            pass
        self.ls.close()
        self.cut()
        for c in self.mute_socks:
            c.close()
