"""Which pool this process is a member of, for code running in Dask tasks (a worker's pool,
or the client's after attach()). A module of its own so that the slab views and the worker
plugin both read it without importing each other."""

_state = {"pool": None}


def process_pool(required=True):
    """The pool this process is a member of (a worker's, or the client's after attach())."""
    pool = _state["pool"]
    if pool is not None and not pool.closed:
        return pool
    if required:
        raise RuntimeError("this process is not a member of a pooltensor pool: call "
                           "pooltensor.dask.attach(client) first; a Dask worker that joined "
                           "the cluster after attach() is not a member (detach() and attach() "
                           "again to make it one)")
    return None


def set_process_pool(pool):
    """Record `pool` as this process's (None: it left the pool)."""
    _state["pool"] = pool
