"""BLAS threads for a plain script and its member processes.

numpy's BLAS (OpenBLAS in the PyPI wheels) starts a thread per core in every process. A
script with N members computes a matmul's row blocks in N processes at once, so with each
BLAS on every core the machine ran N times as many BLAS threads as cores, and the threads of
a process that finished its share first spun on cores the others still needed (measured: a
(262143, 256) @ (256, 64) float32 product with 2 members took 0.116-0.126 s, and numpy run
right after it 0.11-0.13 s instead of 0.067). So each process gets its share of the cores:
members through the usual variables at start (unless the user set any of them), the script
for the length of its own share of a plan (threadpoolctl, which finds whichever BLAS numpy
loaded), and back to what it was after.
"""
import contextlib
import os

_VARS = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "VECLIB_MAXIMUM_THREADS")
_controller = None


def share(processes):
    """This machine's cores divided among `processes` computing at the same time (>= 1)."""
    return max(1, (os.cpu_count() or 1) // max(1, processes))


def user_set():
    """Whether the user chose BLAS threads through any of the usual variables (OpenBLAS reads
    OMP_NUM_THREADS too): then every process keeps what they chose."""
    return any(v in os.environ for v in _VARS)


def member_env(processes):
    """Variables for a member process of a script with `processes` processes in all; none
    when the user set any of them (the members inherit the user's)."""
    if user_set():
        return {}
    k = str(share(processes))
    return {v: k for v in _VARS}


@contextlib.contextmanager
def limited(processes):
    """The script's BLAS on its share of the cores while `processes` processes compute."""
    global _controller
    if processes <= 1 or user_set():
        yield
        return
    try:
        if _controller is None:
            from threadpoolctl import ThreadpoolController
            _controller = ThreadpoolController()
        ctx = _controller.limit(limits=share(processes), user_api="blas")
    except Exception:                # noqa: BLE001  (no threadpoolctl, or a BLAS it can't set)
        yield
        return
    with ctx:
        yield
