"""Three network namespaces on this machine that stand in for three hosts.

Why: the tcp transport, the rendezvous across hosts and the memory servers only run for real
when the ranks cannot reach each other by shared memory. Ranks in different network namespaces
count as different machines (the machine identity includes the namespace), have addresses of
their own, and talk over veth links, so one box (a CI runner) can test what several hosts do.

Layout (needs root and iproute2's ``ip``)::

    ptns0 10.77.0.1  --veth--  ptns1 10.77.0.2
         \\                      /
          --veth--  ptns2 10.77.0.3  --veth--

A full mesh of veth pairs, one /32 address per namespace and a host route per peer: no bridge,
so the host's bridge netfilter and firewall rules never see the traffic. Loopback is up in each.

``up()`` is idempotent (a healthy layout is left alone, a broken one is rebuilt) and serialized
with a file lock, so several test processes may call it at once. ``down()`` removes it.

    python tests/netns.py up | down | status

In tests: the session fixture ``netns`` gives the layout (or skips with the reason), and
``ns_cmd(k, argv)`` prefixes a command to run it inside namespace k.
"""
import contextlib
import fcntl
import os
import shutil
import subprocess
import sys

NAMES = ("ptns0", "ptns1", "ptns2")
ADDRS = ("10.77.0.1", "10.77.0.2", "10.77.0.3")
LOCK = "/tmp/pooltensor-netns.lock"


def _ip(*args, ns=None, check=True):
    cmd = ["ip"] + (["-n", ns] if ns else []) + list(args)
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    if check and p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: {p.stderr.strip() or p.stdout.strip()}")
    return p


def _dev(i, j):
    """Name of namespace i's end of the link to namespace j."""
    return f"pt{i}to{j}"


def unavailable():
    """Why namespaces cannot be made here (a sentence), or None when they can."""
    if sys.platform != "linux":
        return "network namespaces need Linux"
    if os.geteuid() != 0:
        return "network namespaces need root (CI runs .ci/run as root)"
    if shutil.which("ip") is None:
        return "iproute2's `ip` command is not installed (apt-get install iproute2)"
    return None


def healthy():
    """True when every namespace exists with its links up and its addresses and routes set."""
    try:
        listed = _ip("netns", "list").stdout
    except (RuntimeError, OSError, subprocess.SubprocessError):
        return False
    have = {line.split()[0] for line in listed.splitlines() if line.strip()}
    if not set(NAMES) <= have:
        return False
    for i, ns in enumerate(NAMES):
        addrs = _ip("-o", "addr", "show", ns=ns, check=False).stdout
        links = _ip("-o", "link", "show", ns=ns, check=False).stdout
        routes = _ip("route", "show", ns=ns, check=False).stdout
        if "127.0.0.1" not in addrs or ADDRS[i] not in addrs:
            return False
        for j in range(len(NAMES)):
            if j == i:
                continue
            line = next((ln for ln in links.splitlines() if f" {_dev(i, j)}@" in ln), "")
            if "state UP" not in line and "LOWER_UP" not in line:
                return False
            if ADDRS[j] not in routes:
                return False
    return True


def _create():
    for ns in NAMES:
        _ip("netns", "add", ns)
        _ip("link", "set", "lo", "up", ns=ns)
    n = len(NAMES)
    for i in range(n):
        for j in range(i + 1, n):
            # made in namespace i, its peer end moved straight into namespace j
            _ip("link", "add", _dev(i, j), "type", "veth", "peer", "name", _dev(j, i),
                "netns", NAMES[j], ns=NAMES[i])
    for i in range(n):
        for j in range(n):
            if j == i:
                continue
            dev = _dev(i, j)
            _ip("addr", "add", f"{ADDRS[i]}/32", "dev", dev, ns=NAMES[i])
            _ip("link", "set", dev, "up", ns=NAMES[i])
    for i in range(n):
        for j in range(n):
            if j != i:
                _ip("route", "add", f"{ADDRS[j]}/32", "dev", _dev(i, j), "src", ADDRS[i],
                    ns=NAMES[i])


def _delete():
    for ns in NAMES:
        _ip("netns", "del", ns, check=False)     # its veth ends go with it


def _free_index(name, what):
    """The first k in 1..249 with no namespace called name.format(k) (under _locked())."""
    listed = _ip("netns", "list").stdout
    used = {ln.split()[0] for ln in listed.splitlines() if ln.strip()}
    n = next((k for k in range(1, 250) if name.format(k) not in used), None)
    if n is None:
        raise RuntimeError(f"no free {what} (250 in use)")
    return n


@contextlib.contextmanager
def _locked():
    with open(LOCK, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def up():
    """Make the namespaces (idempotent). Returns True if this call created them, False if
    they were already there; RuntimeError (with the failing command) if they cannot be made."""
    why = unavailable()
    if why:
        raise RuntimeError(why)
    with _locked():
        if healthy():
            return False
        _delete()
        try:
            _create()
        except BaseException:
            _delete()
            raise
        if not healthy():
            _delete()
            raise RuntimeError("network namespaces were created but their links do not come up")
        return True


def down():
    """Remove the namespaces (and their links)."""
    if unavailable():
        return
    with _locked():
        _delete()


def ns_cmd(k, argv):
    """argv run inside namespace k (``ip netns exec ptnsK ...``)."""
    return ["ip", "netns", "exec", NAMES[k], *argv]


# -- a private pair, for fault injection ---------------------------------------------------------
#
# Partitions are made with packet-filter rules that drop everything between two hosts. They must
# never go into the shared layout above (other tests use it at the same time), so each test that
# injects faults makes a pair of its own: namespaces ptpN-a and ptpN-b, one veth link, the subnet
# 10.78.N.0/30 (N chosen free under the lock), removed again on exit whatever happens.

def partition_unavailable():
    """Why partitions cannot be made here (a sentence), or None: namespaces plus `nft` (or
    `iptables`) to drop packets inside them."""
    why = unavailable()
    if why:
        return why
    if not (shutil.which("nft") or shutil.which("iptables")):
        return "neither `nft` nor `iptables` is installed (apt-get install nftables)"
    return None


class Pair:
    """Two namespaces of their own joined by one veth link; cut() drops every packet between
    them (nft, else iptables, in namespace a: both directions), heal() lifts the rules,
    throttle(rate) shapes a's link with tc's token bucket filter. close() removes everything."""

    TABLE = "ptpartition"

    def __init__(self):
        why = partition_unavailable()
        if why:
            raise RuntimeError(why)
        with _locked():
            n = self.n = _free_index("ptp{}-a", "private namespace pair")
            self.names = (f"ptp{n}-a", f"ptp{n}-b")
            self.addrs = (f"10.78.{n}.1", f"10.78.{n}.2")
            try:
                for ns in self.names:
                    _ip("netns", "add", ns)
                    _ip("link", "set", "lo", "up", ns=ns)
                _ip("link", "add", "ptpa", "type", "veth", "peer", "name", "ptpb", "netns",
                    self.names[1], ns=self.names[0])
                for ns, dev, addr in zip(self.names, ("ptpa", "ptpb"), self.addrs):
                    _ip("addr", "add", f"{addr}/30", "dev", dev, ns=ns)
                    _ip("link", "set", dev, "up", ns=ns)
            except BaseException:
                self.close()
                raise
        self.nft = shutil.which("nft") is not None
        self.cut_now = False

    def cmd(self, k, argv):
        """argv run inside namespace k (0: a, 1: b)."""
        return ["ip", "netns", "exec", self.names[k], *argv]

    def _run(self, argv, stdin=None, check=True):
        p = subprocess.run(self.cmd(0, argv), input=stdin, capture_output=True, text=True,
                           timeout=30)
        if check and p.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)}: {p.stderr.strip() or p.stdout.strip()}")
        return p

    def cut(self):
        """Drop every packet between a and b, both ways (established connections included)."""
        peer = self.addrs[1]
        if self.nft:
            self._run(["nft", "-f", "-"], stdin=(
                f"table inet {self.TABLE} {{\n"
                f"  chain in {{ type filter hook input priority -10; ip saddr {peer} drop; }}\n"
                f"  chain out {{ type filter hook output priority -10; ip daddr {peer} drop; }}\n"
                f"}}\n"))
        else:
            self._run(["iptables", "-I", "INPUT", "-s", peer, "-j", "DROP"])
            self._run(["iptables", "-I", "OUTPUT", "-d", peer, "-j", "DROP"])
        self.cut_now = True

    def heal(self):
        """Lift the partition (idempotent)."""
        if self.nft:
            self._run(["nft", "delete", "table", "inet", self.TABLE], check=False)
        else:
            peer = self.addrs[1]
            while self._run(["iptables", "-D", "INPUT", "-s", peer, "-j", "DROP"],
                            check=False).returncode == 0:
                pass
            while self._run(["iptables", "-D", "OUTPUT", "-d", peer, "-j", "DROP"],
                            check=False).returncode == 0:
                pass
        self.cut_now = False

    def throttle(self, rate="8mbit"):
        """Shape a's side of the link (tc tbf); rate None lifts it."""
        self._run(["tc", "qdisc", "del", "dev", "ptpa", "root"], check=False)
        if rate:
            self._run(["tc", "qdisc", "add", "dev", "ptpa", "root", "tbf", "rate", rate,
                       "burst", "64kb", "latency", "400ms"])

    def close(self):
        """Remove both namespaces (their link, rules and shaping go with them)."""
        for ns in self.names:
            _ip("netns", "del", ns, check=False)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


# -- machines on a switch, for benchmarks --------------------------------------------------------
#
# The shared layout above is a full mesh of unshaped veth links: each pair has a link of its own,
# as fast as this machine's memory. A benchmark that stands in for separate machines needs what a
# real cluster has: one network card per machine, full duplex, behind a switch, so that everything
# a machine sends shares its card's rate, and so does everything it receives. Lan makes that,
# privately (never in the shared layout, which other tests use at the same time): namespaces
# ptlN-sw (the switch: a bridge) and ptlN-<host> per host, each host's card a veth to a bridge
# port, the subnet 10.79.N.0/24 (N chosen free under the lock). With a rate, each card's egress
# (what the host sends) and its switch port's egress (what the host receives) are shaped with an
# htb class of that rate. close() removes the namespaces, and with them every link and rule; a
# layout whose owner died without close() is removed by the next Lan.

class Lan:
    """Hosts `hosts` (short names) on one switch; rates: {host: "1gbit"} or one rate for all
    (None: unshaped). addr(host), cmd(host, argv), close()."""

    OWNERS = "/tmp/pooltensor-lan-{}.pid"

    def __init__(self, hosts, rate=None, rates=None):
        why = unavailable()
        if why:
            raise RuntimeError(why)
        if shutil.which("tc") is None and (rate or rates):
            raise RuntimeError("shaping needs iproute2's `tc`")
        self.hosts = list(hosts)
        self.rates = {h: (rates or {}).get(h, rate) for h in self.hosts}
        with _locked():
            self._reap()
            n = self.n = _free_index("ptl{}-sw", "switch layout")
            self.sw = f"ptl{n}-sw"
            self.names = {h: f"ptl{n}-{h}" for h in self.hosts}
            with open(self.OWNERS.format(n), "w") as f:
                f.write(f"{os.getpid()}\n")
            try:
                self._create()
            except BaseException:
                self.close()
                raise

    @classmethod
    def _reap(cls):
        """Remove the layouts whose owner process is gone (killed before its close())."""
        import glob
        for path in glob.glob(cls.OWNERS.format("*")):
            n = path.rsplit("-", 1)[1].split(".")[0]
            try:
                pid = int(open(path).read())
                os.kill(pid, 0)
                continue                          # its owner lives
            except (ValueError, OSError):
                pass
            listed = _ip("netns", "list").stdout
            for line in listed.splitlines():
                if line.strip() and line.split()[0].startswith(f"ptl{n}-"):
                    _ip("netns", "del", line.split()[0], check=False)
            with contextlib.suppress(OSError):
                os.unlink(path)

    def _create(self):
        _ip("netns", "add", self.sw)
        _ip("link", "set", "lo", "up", ns=self.sw)
        _ip("link", "add", "br0", "type", "bridge", ns=self.sw)
        _ip("link", "set", "br0", "up", ns=self.sw)
        for i, h in enumerate(self.hosts):
            ns, port = self.names[h], f"p{i}"
            _ip("netns", "add", ns)
            _ip("link", "set", "lo", "up", ns=ns)
            _ip("link", "add", port, "type", "veth", "peer", "name", "nic", "netns", ns,
                ns=self.sw)
            _ip("link", "set", port, "master", "br0", ns=self.sw)
            _ip("link", "set", port, "up", ns=self.sw)
            _ip("addr", "add", f"{self.addr(h)}/24", "dev", "nic", ns=ns)
            _ip("link", "set", "nic", "up", ns=ns)
            rate = self.rates[h]
            if rate:
                self._shape(ns, "nic", rate)          # what the host sends
                self._shape(self.sw, port, rate)      # what it receives

    @staticmethod
    def _shape(ns, dev, rate):
        for args in (["qdisc", "add", "dev", dev, "root", "handle", "1:", "htb", "default", "1"],
                     ["class", "add", "dev", dev, "parent", "1:", "classid", "1:1", "htb",
                      "rate", rate, "ceil", rate, "burst", "256k", "cburst", "256k"]):
            p = subprocess.run(["tc", "-n", ns, *args], capture_output=True, text=True,
                               timeout=30)
            if p.returncode != 0:
                raise RuntimeError(f"tc {' '.join(args)} in {ns}: {p.stderr.strip()}")

    def addr(self, host):
        """The host's address (10.79.N.i)."""
        return f"10.79.{self.n}.{self.hosts.index(host) + 1}"

    def cmd(self, host, argv):
        """argv run inside the host's namespace."""
        return ["ip", "netns", "exec", self.names[host], *argv]

    def shaping(self):
        """What tc says of each host's card and switch port: {host: (sent, received)}."""
        out = {}
        for i, h in enumerate(self.hosts):
            out[h] = tuple(subprocess.run(["tc", "-n", ns, "class", "show", "dev", dev],
                                          capture_output=True, text=True, timeout=30
                                          ).stdout.strip()
                           for ns, dev in ((self.names[h], "nic"), (self.sw, f"p{i}")))
        return out

    def close(self):
        """Remove every namespace of the layout (links, bridge and shaping go with them)."""
        for ns in [self.sw, *getattr(self, "names", {}).values()]:
            _ip("netns", "del", ns, check=False)
        with contextlib.suppress(OSError):
            os.unlink(self.OWNERS.format(self.n))

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


# -- pytest -------------------------------------------------------------------------------------
try:
    import pytest
except ImportError:          # the command line below does not need pytest
    pytest = None

if pytest is not None:
    @pytest.fixture(scope="session")
    def netns():
        """The namespace layout (NAMES, ADDRS); skips with the reason when it cannot be made.
        Removed at the end of the session only if this session created it."""
        why = unavailable()
        if why:
            pytest.skip(f"multi-host tests need network namespaces: {why}")
        try:
            created = up()
        except RuntimeError as e:
            pytest.skip(f"multi-host tests need network namespaces, which cannot be made "
                        f"here: {e}")
        yield {"names": NAMES, "addrs": ADDRS}
        if created and not os.environ.get("POOLTENSOR_KEEP_NETNS"):
            down()

    @pytest.fixture
    def netns_pair():
        """A private pair of namespaces (Pair) for fault injection; skips with the reason when
        it cannot be made; removed (rules and all) whatever the test does."""
        why = partition_unavailable()
        if why:
            pytest.skip(f"partition tests need namespaces and a packet filter: {why}")
        try:
            pair = Pair()
        except RuntimeError as e:
            pytest.skip(f"partition tests need a private namespace pair: {e}")
        try:
            yield pair
        finally:
            pair.close()


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    what = argv[0] if argv else "status"
    if what == "up":
        try:
            made = up()
        except RuntimeError as e:
            print(f"netns: cannot create: {e}", file=sys.stderr)
            return 1
        print("netns: created" if made else "netns: already up", ", ".join(
            f"{n}={a}" for n, a in zip(NAMES, ADDRS)))
        return 0
    if what == "down":
        down()
        print("netns: removed")
        return 0
    if what == "status":
        why = unavailable()
        print(f"netns: unavailable: {why}" if why else
              ("netns: up" if healthy() else "netns: down"))
        return 0
    print("usage: python tests/netns.py up | down | status", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
