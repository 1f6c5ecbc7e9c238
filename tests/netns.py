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
