"""The cache room: copies of remote slabs (slabs.py), faults that fill them (fault.py), the
prefetcher (prefetch.py), and moving elements between slabs and numpy (transfer.py, with the
byte arithmetic of layout.py).

It takes a pool as an argument and never imports the pool room: the pool owns a SlabCache
and the rooms above hand the pool to the functions here.
"""
from .slabs import SlabCache

__all__ = ["SlabCache"]
