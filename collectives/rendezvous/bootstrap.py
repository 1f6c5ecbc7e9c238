"""bootstrap(): find out this process's rank and world size, and give it a rendezvous store.

Three ways a job can be started, tried in this order (first match wins):

1. ``mpiexec``/``mpirun``: the launcher's environment variables say so. MPI (through mpi4py)
   is used only here, to agree on rank, size and where rank 0's TCPStore listens; everything
   after that goes through the store and our own transports.
2. ``POOLTENSOR_RANK``, ``POOLTENSOR_WORLD_SIZE`` and ``POOLTENSOR_COORDINATOR=host:port``, as set
   by ``python -m collectives.launch`` or by hand on several machines: rank 0 serves the store
   at that address and the others connect to it.
3. Nothing set: a world of one, with an in-process HashStore.

Misconfiguration fails here with a ``BootstrapError`` that says which variable is wrong,
rather than later as a hang.
"""
import dataclasses
import os
import socket
import time
import warnings

from ..errors import BootstrapError, PeerLost, Timeout
from .hash import HashStore
from .store import Store, allgather, resolve_timeout
from .tcp import TCPStore

# (rank variable, size variable or None) for each MPI launcher family we recognise.
MPI_ENV = (
    ("PMI_RANK", "PMI_SIZE"),  # MPICH / hydra, Intel MPI
    ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),  # Open MPI
    ("PMIX_RANK", None),  # PMIx (Open MPI 5, Slurm with pmix)
    ("MPI_LOCALRANKID", None),  # hydra, also when PMI_* are hidden
)
ENV_RANK, ENV_SIZE, ENV_COORD = "POOLTENSOR_RANK", "POOLTENSOR_WORLD_SIZE", "POOLTENSOR_COORDINATOR"
ENV_BIND, ENV_HOST = "POOLTENSOR_BIND", "POOLTENSOR_HOST"
ENV_SECRET_FILE = "POOLTENSOR_SECRET_FILE"
BOOT_ID = "/proc/sys/kernel/random/boot_id"
NET_NS = "/proc/self/ns/net"
SECRET_KEY = "bootstrap/secret"


@dataclasses.dataclass(frozen=True)
class HostLayout:
    """Which ranks share this rank's host (and so can share memory)."""

    host: str  # this rank's host identity
    hosts: tuple  # host identity of every rank, by rank
    local_rank: int  # index of this rank among the ranks on its host
    local_size: int  # number of ranks on this host
    local_ranks: tuple  # the global ranks on this host, ascending


@dataclasses.dataclass
class Bootstrap:
    """The result of ``bootstrap()``: who we are, how many we are, and a store to meet in."""

    rank: int
    size: int
    store: Store
    how: str  # "mpi", "env" or "single"
    mpi_comm: object = None  # mpi4py COMM_WORLD when how == "mpi"
    coordinator: str = None  # the host the others reach rank 0's store at
    _layout: HostLayout = dataclasses.field(default=None, repr=False)

    def secret(self, timeout=None):
        """The pool's secret (bytes), the same on every rank; collective: every rank calls it.

        $POOLTENSOR_SECRET_FILE when set (every rank reads it; see collectives.control.
        read_secret for what the file must hold), else 32 random bytes made by rank 0 and
        handed to the others through the bootstrap (mpi4py broadcast, or the store)."""
        path = os.environ.get(ENV_SECRET_FILE)
        if path:
            from ..control import read_secret
            try:
                return read_secret(path)
            except ValueError as e:
                raise BootstrapError(f"{ENV_SECRET_FILE}: {e}", rank=self.rank) from None
        if self.size == 1:
            return os.urandom(32)
        if self.mpi_comm is not None:
            return self.mpi_comm.bcast(os.urandom(32) if self.rank == 0 else None, root=0)
        if self.rank == 0:
            value = os.urandom(32)
            self.store.set(SECRET_KEY, value)
            return value
        return bytes(self.store.get(SECRET_KEY, resolve_timeout(timeout, self.store.timeout)))

    def layout(self, timeout=None):
        """This rank's ``HostLayout``, computed once with an allgather of host identities."""
        if self._layout is None:
            self._layout = host_layout(self.store, self.rank, self.size, timeout, tag="bootstrap")
        return self._layout

    def close(self, timeout=None, failed=False):
        """Leave the rendezvous. Rank 0 keeps its server up until every other rank has left.

        Otherwise a fast rank 0 would take the store away from ranks still using it. A rank
        that has exited or died has no connection left, so rank 0 stops waiting for it; one
        that hangs delays rank 0 by at most ``timeout``, and is named in a warning. A process
        leaving on an error (``failed``) waits for no one: its peers are failing too, or
        should see it gone. A server already gone when a rank leaves is no news: rank 0 left.
        """
        store = self.store
        if self.size > 1 and isinstance(store, TCPStore) and not failed:
            try:
                if store.server is None:
                    _watch_server(store)   # before leaving: the server cannot be gone yet
                store.set(f"bootstrap/left/{self.rank}", b"")
                if store.server is not None:
                    waited = resolve_timeout(timeout, store.timeout)
                    stay = self._wait_for_leavers(waited)
                    if stay:
                        warnings.warn(f"rank {self.rank}: rank(s) {', '.join(map(str, stay))} "
                                      f"had not left the rendezvous after {waited:g} s; "
                                      f"closing it anyway (they can no longer use it)",
                                      RuntimeWarning, stacklevel=2)
            except (Timeout, PeerLost, BootstrapError):
                pass
        store.close()

    def _wait_for_leavers(self, timeout):
        """Wait until every rank has left or only our own connections remain; returns the
        ranks that had not left when `timeout` passed (empty when all did)."""
        store, deadline = self.store, time.monotonic() + timeout
        keys = [f"bootstrap/left/{r}" for r in range(self.size)]
        while True:
            try:
                store.wait(keys, min(0.1, max(0.0, deadline - time.monotonic())))
                return []
            except Timeout:
                if store.server.connections <= len(store._idle):
                    return []  # only our own connections remain: the others are gone
                if time.monotonic() >= deadline:
                    return [r for r in range(self.size) if not _has(store, keys[r])]

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _net_namespace():
    """Inode of this process's network namespace ("" where /proc does not say)."""
    try:
        return str(os.stat(NET_NS).st_ino)
    except OSError:
        return ""


def machine_identity():
    """A string equal for two ranks exactly when they can share memory and each other's
    loopback: hostname, kernel boot id and network namespace.

    Hostname alone is not enough: containers on different machines may share one; the boot id
    tells kernels apart. Ranks in different network namespaces of one kernel count as different
    machines: that is how several hosts are tried out on one box (and a container with its own
    network is treated as a host of its own)."""
    try:
        with open(BOOT_ID) as f:
            boot = f.read().strip()
    except OSError:
        boot = ""
    name = socket.gethostname()
    return "/".join(x for x in (name, boot, _net_namespace()) if x)


def host_identity():
    """The host a rank counts as for topology (hierarchical algorithms, the pool's members):
    ``$POOLTENSOR_HOST`` when set (e.g. to pretend ranks are on different hosts in tests), else
    machine_identity()."""
    return os.environ.get(ENV_HOST) or machine_identity()


def host_layout(store, rank, size, timeout=None, tag="hosts"):
    """Allgather host identities through ``store`` and work out this rank's ``HostLayout``."""
    raw = allgather(store, f"layout/{tag}", rank, size, host_identity().encode(), timeout)
    hosts = tuple(h.decode() for h in raw)
    local = tuple(r for r in range(size) if hosts[r] == hosts[rank])
    return HostLayout(hosts[rank], hosts, local.index(rank), len(local), local)


def mpi_launcher_variable(environ=None):
    """Name of the variable showing we were started by an MPI launcher, or None."""
    env = os.environ if environ is None else environ
    for rank_var, size_var in MPI_ENV:
        if rank_var in env and (size_var is None or size_var in env):
            return rank_var
    return None


def bootstrap(timeout=None):
    """Return a ``Bootstrap`` for this process: MPI launcher, environment variables, or alone.

    ``timeout`` (seconds; default ``$POOLTENSOR_TIMEOUT`` or 60) bounds the rendezvous and is
    the default timeout of the returned store.
    """
    timeout = resolve_timeout(timeout)
    var = mpi_launcher_variable()
    if var is not None:
        return _from_mpi(var, timeout)
    if any(v in os.environ for v in (ENV_RANK, ENV_SIZE, ENV_COORD)):
        return _from_env(timeout)
    return Bootstrap(0, 1, HashStore(timeout), "single")


def parse_address(text, what=ENV_COORD):
    """Split ``host:port`` (or ``[v6addr]:port``) and check it; errors name ``what``."""
    host, sep, port = text.strip().rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise BootstrapError(f"{what} must be host:port, not {text!r}")
    return host, int(port)


def _int_env(name):
    raw = os.environ.get(name)
    if raw is None:
        return None
    try:
        return int(raw.strip())
    except ValueError:
        raise BootstrapError(f"{name} must be an integer, not {raw!r}") from None


def _from_env(timeout):
    rank, size = _int_env(ENV_RANK), _int_env(ENV_SIZE)
    coord = os.environ.get(ENV_COORD)
    if rank is None or size is None:
        have, lack = (ENV_RANK, ENV_SIZE) if size is None else (ENV_SIZE, ENV_RANK)
        if rank is None and size is None:
            have, lack = ENV_COORD, f"{ENV_RANK} and {ENV_SIZE}"
        raise BootstrapError(f"{have} is set but {lack} is not; set {ENV_RANK}, {ENV_SIZE} "
                             f"and {ENV_COORD}=host:port together")
    if size < 1:
        raise BootstrapError(f"{ENV_SIZE} must be >= 1, not {size}")
    if not 0 <= rank < size:
        raise BootstrapError(f"{ENV_RANK}={rank} is outside 0..{size - 1} ({ENV_SIZE}={size})")
    if size == 1 and not coord:
        return Bootstrap(0, 1, HashStore(timeout), "env")
    if not coord:
        raise BootstrapError(f"{ENV_COORD}=host:port is needed when {ENV_SIZE}={size}", rank=rank)
    host, port = parse_address(coord)
    if port == 0:
        raise BootstrapError(f"{ENV_COORD}={coord!r} needs a fixed port that every rank knows")
    if rank == 0:
        store = TCPStore(os.environ.get(ENV_BIND) or host, port, is_server=True, timeout=timeout)
    else:
        _outlive_server(host, port, resolve_timeout(timeout))
        store = TCPStore(host, port, timeout=timeout)
    return Bootstrap(rank, size, store, "env", coordinator=host)


def _advertised_address():
    """An address of this host that other hosts can reach (the interface of the default route)."""
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        probe.connect(("10.255.255.255", 1))  # UDP connect sends nothing; it only picks a route
        addr = probe.getsockname()[0]
        if addr and not addr.startswith("0."):
            return addr
    except OSError:
        pass
    finally:
        probe.close()
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return socket.gethostname()


def _from_mpi(var, timeout):
    try:
        from mpi4py import MPI
    except ImportError:
        raise BootstrapError(f"started by an MPI launcher ({var} is set) but mpi4py is not "
                             f"installed: pip install mpi4py, or start without mpiexec") from None
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    if size == 1:
        return Bootstrap(0, 1, HashStore(timeout), "mpi", comm)
    one_host = len(set(comm.allgather(host_identity()))) == 1
    if rank == 0:
        bind = os.environ.get(ENV_BIND) or ("127.0.0.1" if one_host else "0.0.0.0")
        try:
            store = TCPStore(bind, 0, is_server=True, timeout=timeout)
        except BootstrapError as e:
            comm.bcast(str(e), root=0)  # tell the others, so they fail now instead of hanging
            raise
        wildcard = bind in ("0.0.0.0", "::", "")
        address = (_advertised_address() if wildcard else bind, store.port)
        comm.bcast(address, root=0)
    else:
        address = comm.bcast(None, root=0)
        if isinstance(address, str):
            raise BootstrapError(f"rank 0 could not start the rendezvous server: {address}",
                                 rank=0)
        store = TCPStore(address[0], address[1], timeout=timeout)
    return Bootstrap(rank, size, store, "mpi", comm, coordinator=address[0])


def _has(store, key):
    try:
        store.get(key, 0.0)
        return True
    except Timeout:
        return False


# Rendezvous servers this process has left, each watched through one connection until it
# closes: a rank that joins a new world at the same address (collectives.init() after
# finalize()) must not reach rank 0's old server, which closes once every rank has left.
_LEFT = {}


def _watch_server(store):
    try:
        _LEFT[(store.host, store.port)] = socket.create_connection(store._addr, timeout=1.0)
    except OSError:
        pass


def _outlive_server(host, port, timeout):
    """Wait (up to `timeout`) until the rendezvous server this process left at host:port, if
    any, has closed."""
    sock = _LEFT.pop((host, port), None)
    if sock is None:
        return
    try:
        sock.settimeout(timeout)
        while sock.recv(4096):
            pass
    except OSError:
        pass
    finally:
        sock.close()
