"""MSG_ZEROCOPY against a plain send on one tcp stream (Linux): is it worth it for large puts?

    python bench/tcp_zerocopy.py [--links loopback,netns] [--seconds 1.5] [--repeats 3]

A receiver process (in namespace ptns1 for the netns link, tests/netns.py) reads into one
16 MiB buffer; a sender process (ptns0) sends 16 MiB messages for --seconds with and without
MSG_ZEROCOPY (SO_ZEROCOPY set), alternating, draining the completions from the error queue as
they come, and counts how many the kernel reports as copied after all
(SO_EE_CODE_ZEROCOPY_COPIED). Prints GB/s of each, the ratio (zerocopy / plain, median of
pairs) and the load. Writes DIR/tcp_zerocopy.json.
"""
import argparse
import errno
import json
import os
import socket
import statistics
import struct
import subprocess
import sys
import time

SO_ZEROCOPY, MSG_ZEROCOPY, MSG_ERRQUEUE = 60, 0x4000000, 0x2000
N = 16 << 20
LINKS = {"loopback": (None, None, "127.0.0.1"), "netns": ("ptns0", "ptns1", "10.77.0.2")}


def receive(host):
    ls = socket.socket()
    ls.bind((host, 0))
    ls.listen(4)
    print(ls.getsockname()[1], flush=True)
    mv = memoryview(bytearray(N))
    while True:
        c, _ = ls.accept()
        while c.recv_into(mv):
            pass
        c.close()


def drain(s, seen):
    """Read the zerocopy completions queued so far; seen counts them and the copied ones."""
    while True:
        try:
            _, anc, _, _ = s.recvmsg(0, 1024, MSG_ERRQUEUE | socket.MSG_DONTWAIT)
        except BlockingIOError:
            return
        for _, _, data in anc:
            code = struct.unpack("IBBBBII", data[:16])[3]
            seen["notes"] += 1
            seen["copied"] += code & 1


def send(host, port, zc, seconds):
    s = socket.create_connection((host, port))
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    if zc:
        s.setsockopt(socket.SOL_SOCKET, SO_ZEROCOPY, 1)
    data = memoryview(bytearray(b"\x01" * N))
    seen, total, t = {"notes": 0, "copied": 0}, 0, time.perf_counter()
    while time.perf_counter() - t < seconds:
        off = 0
        while off < N:
            try:
                off += s.send(data[off:], MSG_ZEROCOPY if zc else 0)
            except OSError as e:
                if e.errno != errno.ENOBUFS:      # too many completions unread: read them
                    raise
            if zc:
                drain(s, seen)
        total += N
    gbs = total / (time.perf_counter() - t) / 1e9
    s.close()
    return gbs, seen


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--links", default="loopback,netns")
    p.add_argument("--seconds", type=float, default=1.5)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                 "results"))
    p.add_argument("--receive", help=argparse.SUPPRESS)
    p.add_argument("--send", nargs=2, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.receive:
        return receive(a.receive)
    if a.send:
        res = [(send(a.send[0], int(a.send[1]), 0, a.seconds),
                send(a.send[0], int(a.send[1]), 1, a.seconds)) for _ in range(a.repeats)]
        return print(json.dumps(res), flush=True)
    load, out = os.getloadavg(), {}
    for link in a.links.split(","):
        near, far, host = LINKS[link]
        pre = (lambda ns: ["ip", "netns", "exec", ns] if ns else [])
        rx = subprocess.Popen(pre(far) + [sys.executable, __file__, "--receive", host],
                              stdout=subprocess.PIPE, text=True)
        try:
            port = rx.stdout.readline().strip()
            tx = subprocess.run(pre(near) + [sys.executable, __file__, "--send", host, port,
                                             "--seconds", str(a.seconds), "--repeats",
                                             str(a.repeats)],
                                capture_output=True, text=True, timeout=300, check=True)
            res = json.loads(tx.stdout)
        finally:
            rx.kill()
            rx.wait()
        ratio = statistics.median(z[0] / p_[0] for p_, z in res)
        out[link] = {"pairs": res, "ratio_zerocopy_over_plain": ratio}
        for (pg, _), (zg, seen) in res:
            print(f"{link}: plain {pg:.2f} GB/s, zerocopy {zg:.2f} GB/s "
                  f"({seen['copied']} of {seen['notes']} completions copied by the kernel)")
        print(f"{link}: zerocopy / plain, median of pairs: {ratio:.2f}")
    print(f"load average at start: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "tcp_zerocopy.json"), "w") as f:
        json.dump({"load": load, "links": out}, f, indent=1)


if __name__ == "__main__":
    main()
