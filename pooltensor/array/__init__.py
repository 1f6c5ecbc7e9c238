"""The array room: the pool ``ndarray`` (array.py), numpy index parsing (indexing.py), creation
(creation.py) and seeded random arrays (random.py).

An ndarray is data and addressing only: an allocation, a byte offset, a shape, byte strides and
a dtype, read and written one-sided through the cache room. What computes on arrays (ufuncs,
reductions, products, shape functions) is the ops room above; it binds the ndarray's methods
and operators when it is imported (ops/methods.py), so nothing here imports an op.
"""
from .array import ndarray
from .creation import arange, asarray, empty, from_numpy, full, linspace, ones, zeros

__all__ = ["ndarray", "empty", "zeros", "ones", "full", "arange", "linspace", "asarray",
           "from_numpy"]
