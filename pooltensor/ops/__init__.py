"""The ops room: what computes on pool arrays.

executor.py runs a kernel where the output slabs live (SPMD ranks, or the plain script over its
members); ufuncs.py (NEP-13), reductions.py with reducer.py, products.py (matmul), shape.py
and tiles.py are the operations; dispatch.py is NEP-18 with its ``@implements`` registry;
namespace.py and the api_*.py modules the Array API names (coerce.py: what they take and
give), sorting.py and scans.py the data-dependent ones, chunks.py with chunkjobs.py and
tsqr.py their chunked passes above the materialize limit; methods.py the ndarray's computing
methods, bound once by the package.

It imports the array, cache and pool rooms below it, never the package above.
"""
