"""A plain script's member process: ``python -m pooltensor.ops.members CONFIG``.

pool/member.py is its life (joining the world, exposing its heaps, stopping); this module is
its work: each plan the script sends (pool/work.py) is one operation's part that this member
homes, run with the same code SPMD ranks use for their own slabs:

- ``run``: the executor's units of the targets homed here (ufuncs, casts, where, fills,
  map_blocks);
- ``reduce``: a reduction's partials over the slabs homed here, sent back for the script to
  combine in member order;
- ``fill``: creation's values (zeros, full, arange, linspace, seeded random) for the slabs
  homed here;
- ``assign``: the tiles homed here of a copy between layouts (reshape, transpose, x[...] = y;
  on memory servers such a copy is a ``run`` of the executor's Assign: its units are whole
  slabs, so each server writes only what it holds);
- ``rows``: the row tiles homed here of a matmul's left operand times a numpy right one (a
  memory server: the result's slabs it holds, the right operand numpy or a pool array);
- ``chunks``: one pass of a chunked algorithm (sort, unique, scans, nonzero, searchsorted,
  fft, TSQR: ops/chunks.py): the job run on the chunks whose first row is homed here, their
  small summaries sent back.

Inputs homed elsewhere are read one-sided from their homes through this member's own slab
cache, which is emptied before every plan (the script and the other members write between
plans; nothing here tracks their versions). numpy's error state is the script's (np.errstate
around the plan). A failure is sent back as the exception itself; the member stays usable.
"""
import pickle
import sys
import warnings

import numpy as np

from ..array.array import ndarray
from ..array.creation import fill_here
from ..pool import member, work
from . import chunks, executor, products, reducer, shape


def _array(a, off, shape, strides, dtype):
    return ndarray(a, off, shape, strides, dtype)


def _run(pool, kernel, outs, values, fill, fresh):
    executor.run_here(pool, kernel, outs, values, fill, fresh)
    return None


def _reduce(pool, job, flat):
    return reducer.partials_here(job, flat)


def _fill(pool, x, values, skip_fresh, fresh):
    fill_here(x, fresh, values, skip_fresh)
    return None


def _assign(pool, dst, src):
    shape.assign_here(dst, src)
    return None


def _rows(pool, a, B, out, rdt, by_units=False):
    if by_units:              # a memory server: the result slabs it holds (B numpy or pool)
        products.rows_units(a, B, out, rdt, True)
    else:
        products.rows_here(a, B, out, rdt, True)
    return None


def _chunks(pool, job, arrays, parts, homes):
    return chunks.run_here(pool, job, arrays, parts, homes, {pool.me})


PLANS = {"run": _run, "reduce": _reduce, "fill": _fill, "assign": _assign, "rows": _rows,
         "chunks": _chunks}


def handle(pool, frame):
    """One plan -> one reply frame: ("ok", value) or ("err", (pickled exception, text))."""
    try:
        plan, code, errstate = work.loads(frame, pool, _array)
        fn = PLANS.get(plan[0]) if isinstance(plan, tuple) and plan else None
        if fn is None:
            raise work.MemberError(f"unknown plan {plan[0] if plan else plan!r}")
        if code is not None:
            if not getattr(pool, "allow_code", True):
                raise work.MemberError("this memory server runs no code from clients (start "
                                       "it with --allow-code to allow map_blocks functions)")
            kernel = plan[1]
            kernel.fn = pickle.loads(code)        # our own script, or an allowed client
        pool.cache.clear()
        pool.cache.gen += 1
        with np.errstate(**errstate), warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            value = fn(pool, *plan[1:])
        said = []
        for w in caught:                  # numpy's warnings, for the script to issue
            if (w.category.__name__, str(w.message)) not in said:
                said.append((w.category.__name__, str(w.message)))
        return pickle.dumps(("ok", (value, said)), protocol=5)
    except BaseException as e:            # noqa: BLE001  (everything goes back to the script)
        text = f"{type(e).__name__}: {e}"
        try:
            blob = pickle.dumps(e, protocol=5)
            pickle.loads(blob)
        except Exception:                 # noqa: BLE001  (an exception that does not pickle)
            blob = None
        return pickle.dumps(("err", (blob, text)), protocol=5)


def main(argv=None):
    """Entry point of a member process (see pool/member.py)."""
    return member.main(argv, handle)


if __name__ == "__main__":
    sys.exit(main())
