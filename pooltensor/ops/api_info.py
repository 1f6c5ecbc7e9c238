"""The Array API's inspection names: the device (the pool), ``__array_namespace_info__``,
and the array attributes that go with them (device, to_device, __dlpack__, __dlpack_device__,
mT), bound to the ndarray by methods.bind.

The pool is one device: every pool array lives in it, whichever members home its slabs.
DLPack: an array inside one slab this process homes, or (a plain script with attach) one
homed by a member on this machine whose memory is mapped here, is exported zero-copy (a view
of pool memory, kDLCPU); any other array raises BufferError (its bytes are not one local
buffer; use to_numpy() or numpy's own from_dlpack on a copy).
"""
import numpy as np

from ..pool.runtime import current

API_VERSIONS = ("2021.12", "2022.12", "2023.12", "2024.12")
API_VERSION = "2024.12"
KDLCPU = 1


class Device:
    """The pool as an Array API device (there is one: ``pooltensor.POOL``)."""

    def __repr__(self):
        return "pooltensor.POOL"

    def __eq__(self, other):
        return isinstance(other, Device)

    def __hash__(self):
        return hash(Device)


POOL = Device()


def check_device(device):
    """ValueError unless `device` is None or the pool."""
    if device is not None and device != POOL and device != "pool":
        raise ValueError(f"unknown device {device!r}: pool arrays live in the pool "
                         f"(pooltensor.POOL)")


_DTYPES = {
    "bool": np.bool_, "int8": np.int8, "int16": np.int16, "int32": np.int32,
    "int64": np.int64, "uint8": np.uint8, "uint16": np.uint16, "uint32": np.uint32,
    "uint64": np.uint64, "float32": np.float32, "float64": np.float64,
    "complex64": np.complex64, "complex128": np.complex128,
}
_KINDS = {
    "bool": ("bool",), "signed integer": ("int8", "int16", "int32", "int64"),
    "unsigned integer": ("uint8", "uint16", "uint32", "uint64"),
    "integral": ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"),
    "real floating": ("float32", "float64"), "complex floating": ("complex64", "complex128"),
    "numeric": ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
                "float32", "float64", "complex64", "complex128"),
}


class Info:
    """What ``__array_namespace_info__()`` returns: capabilities, devices, dtypes."""

    __module__ = "pooltensor"

    def capabilities(self):
        """boolean indexing and data-dependent shapes (unique, nonzero) are supported; no
        limit on dimensions beyond numpy's."""
        return {"boolean indexing": True, "data-dependent shapes": True,
                "max dimensions": 64}

    def default_device(self):
        """The pool."""
        return POOL

    def devices(self):
        """The one device: the pool."""
        return [POOL]

    def default_dtypes(self, *, device=None):
        """float64, complex128, int64 and int64 for indices."""
        check_device(device)
        return {"real floating": np.dtype(np.float64),
                "complex floating": np.dtype(np.complex128),
                "integral": np.dtype(np.int64), "indexing": np.dtype(np.int64)}

    def dtypes(self, *, device=None, kind=None):
        """The dtypes pool arrays hold, by name (all, or those of `kind`: a kind name or a
        tuple of them)."""
        check_device(device)
        if kind is None:
            names = list(_DTYPES)
        else:
            kinds = kind if isinstance(kind, tuple) else (kind,)
            names = []
            for k in kinds:
                if k not in _KINDS:
                    raise ValueError(f"unknown dtype kind {k!r}")
                names += [n for n in _KINDS[k] if n not in names]
        return {n: np.dtype(_DTYPES[n]) for n in names}


def __array_namespace_info__():
    """The Array API's inspection object for pooltensor (devices, dtypes, capabilities)."""
    return Info()


class ArrayMethods:
    """The Array API attributes bind() gives the ndarray."""

    @property
    def device(self):
        """The device this array lives on: the pool."""
        return POOL

    def to_device(self, device, /, *, stream=None):
        """This array on `device`: the pool is the only one, so the array itself."""
        check_device(device)
        if stream is not None:
            raise ValueError("pool arrays take no stream")
        return self

    @property
    def mT(self):
        """The last two axes swapped (a view); ValueError below two dimensions."""
        if self.ndim < 2:
            raise ValueError("mT needs an array of at least two dimensions")
        return self.swapaxes(-1, -2)

    def __dlpack_device__(self):
        return (KDLCPU, 0)

    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
        if dl_device is not None and tuple(dl_device) != (KDLCPU, 0):
            raise BufferError("pool arrays export to the CPU only")
        view = None if copy else self._local_view(mapped=True)
        if view is None and self.size == 0:
            view = np.empty(self.shape, self.dtype)        # no bytes to share
        if view is None:
            if copy is False or self.nbytes > current().materialize_limit:
                raise BufferError("this pool array is not one local buffer (its elements lie "
                                  "in slabs of other members or in several slabs); export "
                                  "x.to_numpy() instead, or pass copy=True")
            if copy is None:
                raise BufferError("this pool array is not one local buffer (its elements lie "
                                  "in slabs of other members or in several slabs); "
                                  "x.__dlpack__(copy=True) exports a copy")
            view = self.to_numpy(copy=True)
        kw = {} if max_version is None else {"max_version": max_version}
        try:
            return view.__dlpack__(stream=stream, **kw)
        except TypeError:
            return view.__dlpack__(stream=stream)
