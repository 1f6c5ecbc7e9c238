"""Reading safetensors files: checked by the ``safetensors`` package, read through mmap.

Why: a checkpoint is loaded once into pool slabs; it must not pass through an intermediate
copy of the whole file, and a damaged file must be refused before anything is registered.
The ``safetensors`` package opens every file first (``safe_open``): it checks the header,
the dtypes, that the data offsets tile the data section and that the file is as long as
the header says, raising its own error otherwise (a truncated file, a corrupted header).
The package does not expose where each tensor's bytes lie, so the offsets are read from
the same header (its format: 8-byte little-endian length, then JSON) and checked once more
here against the file's size; each tensor is then a numpy view of the memory-mapped file,
copied slab by slab into the pool by the caller.
"""
import json
import mmap
import os
import struct

import numpy as np


class SafetensorsError(ValueError):
    """A file that is not a valid safetensors file (truncated, corrupted, unknown dtype)."""


def _ml(name):
    import ml_dtypes
    return np.dtype(getattr(ml_dtypes, name))


# safetensors dtype names -> numpy dtypes (the 8-bit floats and bfloat16 from ml_dtypes)
DTYPES = {"BOOL": "bool", "U8": "uint8", "I8": "int8", "U16": "uint16", "I16": "int16",
          "U32": "uint32", "I32": "int32", "U64": "uint64", "I64": "int64", "F16": "float16",
          "F32": "float32", "F64": "float64", "BF16": "ml:bfloat16",
          "F8_E4M3": "ml:float8_e4m3fn", "F8_E5M2": "ml:float8_e5m2"}


def numpy_dtype(code, path="", key=""):
    """The numpy dtype of a safetensors dtype code; SafetensorsError for one we cannot hold."""
    name = DTYPES.get(code)
    if name is None:
        raise SafetensorsError(f"{path}: tensor {key!r} has dtype {code!r}, which pooltensor "
                               f"cannot hold (known: {', '.join(DTYPES)})")
    return _ml(name[3:]) if name.startswith("ml:") else np.dtype(name)


def safetensors_code(dtype):
    """The safetensors dtype code of a numpy dtype (the inverse of numpy_dtype)."""
    dtype = np.dtype(dtype)
    for code in DTYPES:
        if numpy_dtype(code) == dtype:
            return code
    raise TypeError(f"safetensors has no dtype for {dtype}")


def dtype_name(dtype):
    """A dtype as the manifest writes it: numpy's str, or ml_dtypes' name (bfloat16, ...)."""
    dtype = np.dtype(dtype)
    return dtype.name if dtype.type.__module__ == "ml_dtypes" else dtype.str


def parse_dtype(text):
    """The inverse of dtype_name."""
    try:
        return np.dtype(text)
    except TypeError:
        return _ml(text)


class File:
    """One safetensors file, checked and memory-mapped: .tensors maps key -> (dtype, shape,
    begin, end) in file bytes; .view(key) is a numpy view of the mapping. Close it."""

    def __init__(self, path):
        self.path = os.fspath(path)
        try:
            from safetensors import SafetensorError, safe_open
        except ImportError as e:          # a dependency: say what to install
            raise ImportError("reading safetensors files needs the safetensors package "
                              "(pip install safetensors)") from e
        try:
            with safe_open(self.path, framework="numpy") as f:
                keys = list(f.keys())
                self.metadata = dict(f.metadata() or {})
        except SafetensorError as e:
            raise SafetensorsError(f"{self.path}: not a valid safetensors file: {e}") from None
        except OSError as e:
            raise
        size = os.path.getsize(self.path)
        with open(self.path, "rb") as fh:
            (n,) = struct.unpack("<Q", fh.read(8))
            header = json.loads(fh.read(n))
        base = 8 + n
        self.tensors = {}
        for key in keys:
            info = header[key]
            dtype = numpy_dtype(info["dtype"], self.path, key)
            shape = tuple(int(d) for d in info["shape"])
            b, e = (int(v) for v in info["data_offsets"])
            count = 1
            for d in shape:
                count *= d
            if e - b != count * dtype.itemsize or base + e > size:
                raise SafetensorsError(f"{self.path}: tensor {key!r}: its bytes do not match "
                                       f"its dtype and shape, or lie past the end of the file")
            self.tensors[key] = (dtype, shape, base + b, base + e)
        self.nbytes = sum(e - b for _, _, b, e in self.tensors.values())
        self._fh = open(self.path, "rb")
        self._map = mmap.mmap(self._fh.fileno(), 0, access=mmap.ACCESS_READ) if size else None

    def view(self, key):
        """Tensor `key` as a read-only numpy view of the mapped file (no copy)."""
        dtype, shape, b, e = self.tensors[key]
        if e == b:
            return np.zeros(shape, dtype)
        return np.frombuffer(self._map, dtype, (e - b) // dtype.itemsize, b).reshape(shape)

    def close(self):
        if self._map is not None:
            try:
                self._map.close()
            except BufferError:       # a view still lives: the mapping goes with it
                pass
        self._fh.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def open_all(paths):
    """Every file of `paths` (a path or a list) checked before any is read: [File]; a key in
    two files is an error."""
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    files, seen = [], {}
    try:
        for p in paths:
            f = File(p)
            files.append(f)
            for k in f.tensors:
                if k in seen:
                    raise SafetensorsError(f"tensor {k!r} is in both {seen[k]} and {f.path}")
                seen[k] = f.path
    except BaseException:
        for f in files:
            f.close()
        raise
    if not files:
        raise ValueError("load_safetensors needs at least one file")
    return files
