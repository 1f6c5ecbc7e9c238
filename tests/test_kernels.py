"""The native kernels against numpy: every kernel, dtype and op, odd lengths, unaligned buffers,
NaN and infinities, aliasing, N-d strided slices, bad arguments, and the scalar variant against
the dispatched one."""
import ctypes
import functools
import io
import mmap
import os
import subprocess
import sys
import threading

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import collectives
from collectives import _native, kernels

INTS = ["int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"]
FLOATS = ["float16", "float32", "float64", "bfloat16"]
DTYPES = INTS + FLOATS
OPS = ["sum", "prod", "min", "max"]
LENGTHS = [0, 1, 7, 33, 1000, 4099]
UFUNC = {"sum": np.add, "prod": np.multiply, "min": np.minimum, "max": np.maximum}


# ---- bfloat16 in numpy terms: uint16 bit patterns ----

def bf16_to_f32(u):
    return (np.asarray(u, np.uint16).astype(np.uint32) << 16).view(np.float32)


def f32_to_bf16(f):
    """Round float32 to bfloat16 bits, nearest even; NaN stays NaN."""
    u = np.ascontiguousarray(f, np.float32).view(np.uint32)
    rne = ((u + np.uint32(0x7FFF) + ((u >> 16) & np.uint32(1))) >> 16).astype(np.uint16)
    nan = (u & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000)
    return np.where(nan, ((u >> 16) | np.uint32(0x40)).astype(np.uint16), rne)


def storage(dt):
    return np.dtype(np.uint16 if dt == "bfloat16" else dt)


def as_f64(x, dt):
    return bf16_to_f32(x).astype(np.float64) if dt == "bfloat16" else x.astype(np.float64)


def make(dt, n, rng, op="sum", specials=True):
    """Random data for dtype name dt: full-range integers (so that sums and products wrap);
    floats of moderate size with NaN, +-inf and +-0 sprinkled in when specials is set."""
    if dt in INTS:
        info = np.iinfo(dt)
        x = rng.integers(info.min, info.max, n, dtype=dt, endpoint=True)
        return x | 1 if op == "prod" else x  # odd factors: the product does not just become 0
    if op == "prod":  # around 1, so that products of many neither overflow nor underflow
        x = np.exp(rng.uniform(-1, 1, n) * min(0.7, 2 / np.sqrt(n + 1)))
    else:
        x = rng.standard_normal(n) * 100
    if specials and n:
        pos = rng.integers(0, n, max(1, n // 200))
        x[pos] = rng.choice([np.nan, np.inf, -np.inf, 0.0, -0.0], len(pos))
    if dt == "bfloat16":
        return f32_to_bf16(x.astype(np.float32))
    return x.astype(dt)


def ref_reduce(op, srcs, dt):
    f = UFUNC[op]
    with np.errstate(all="ignore"):
        if dt == "bfloat16":
            return f32_to_bf16(functools.reduce(f, [bf16_to_f32(s) for s in srcs]))
        if dt == "float16":
            return functools.reduce(f, [s.astype(np.float32) for s in srcs]).astype(np.float16)
        return functools.reduce(f, [s.copy() for s in srcs])


def assert_same(got, want, dt):
    """Equal values, NaN where NaN (payloads may differ)."""
    if dt == "bfloat16":
        got, want = bf16_to_f32(got), bf16_to_f32(want)
    np.testing.assert_array_equal(got, want)


def dtype_arg(dt):
    return {"dtype": "bfloat16"} if dt == "bfloat16" else {}


def unaligned(arr, offset):
    """A copy of arr that starts offset bytes into a fresh byte buffer."""
    buf = np.zeros(arr.nbytes + 16, np.uint8)
    view = buf[offset:offset + arr.nbytes].view(arr.dtype)
    view[...] = arr
    return view


# ---- basics ----

def test_isa_is_known():
    assert kernels.isa() in ("avx512", "avx2", "neon", "scalar")
    assert _native.kernels_isa() == kernels.isa()


def test_dtype_codes_match_native_sizes():
    for name, code in kernels.DTYPES.items():
        assert _native.dtype_size(code) == (2 if name == "bfloat16" else np.dtype(name).itemsize)
        assert kernels.dtype_code(storage(name) if name != "bfloat16" else "bfloat16") == code


def test_public_names_have_docstrings():
    for name in kernels.__all__:
        obj = getattr(kernels, name)
        if callable(obj):
            assert obj.__doc__, name
    for name in ("kernels_isa", "dtype_size", "copy", "gather", "scatter", "reduce",
                 "reduce_all"):
        assert getattr(_native, name).__doc__, name


# ---- pt_reduce ----

@pytest.mark.parametrize("n", LENGTHS)
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dt", DTYPES)
def test_reduce_vs_numpy(dt, op, n):
    rng = np.random.default_rng([DTYPES.index(dt), OPS.index(op), n])
    for nsrc in range(1, 6):
        srcs = [make(dt, n, rng, op) for _ in range(nsrc)]
        dst = np.empty(n, storage(dt))
        assert kernels.reduce(op, dst, srcs, **dtype_arg(dt)) is dst
        assert_same(dst, ref_reduce(op, srcs, dt), dt)


@pytest.mark.parametrize("dt", DTYPES)
def test_reduce_unaligned(dt):
    rng = np.random.default_rng(7)
    n = 1031
    for offset in range(1, 8):
        srcs = [unaligned(make(dt, n, rng), (offset + k) % 8) for k in range(3)]
        dst = unaligned(np.zeros(n, storage(dt)), 8 - offset)
        for op in OPS:
            kernels.reduce(op, dst, srcs, **dtype_arg(dt))
            assert_same(dst, ref_reduce(op, srcs, dt), dt)


@pytest.mark.parametrize("dt", ["int8", "int64", "float32", "float16", "bfloat16"])
def test_reduce_blocks_and_aliasing(dt):
    """dst may be any source (in place); lengths cross the kernels' internal blocks."""
    rng = np.random.default_rng(3)
    n = 20011
    srcs = [make(dt, n, rng) for _ in range(4)]
    want = ref_reduce("sum", srcs, dt)
    for k in range(4):
        ins = [s.copy() for s in srcs]
        kernels.reduce("sum", ins[k], ins, **dtype_arg(dt))
        assert_same(ins[k], want, dt)
    ins = [s.copy() for s in srcs]
    kernels.reduce("max", ins[1], [ins[1], ins[0], ins[1], ins[1]], **dtype_arg(dt))
    assert_same(ins[1], ref_reduce("max", [srcs[1], srcs[0], srcs[1], srcs[1]], dt), dt)


@settings(max_examples=100, deadline=None)
@given(st.sampled_from(DTYPES), st.sampled_from(OPS), st.integers(0, 300), st.integers(1, 5),
       st.lists(st.integers(0, 7), min_size=6, max_size=6), st.integers(0, 2 ** 32 - 1))
def test_reduce_property(dt, op, n, nsrc, offsets, seed):
    """Any dtype, op, length, number of sources and byte offsets: numpy's answer."""
    rng = np.random.default_rng(seed)
    srcs = [unaligned(make(dt, n, rng, op), offsets[k]) for k in range(nsrc)]
    dst = unaligned(np.zeros(n, storage(dt)), offsets[5])
    kernels.reduce(op, dst, srcs, **dtype_arg(dt))
    assert_same(dst, ref_reduce(op, srcs, dt), dt)


def test_reduce_wraps_and_rounds_once():
    a = np.array([127, -128, 100], np.int8)
    assert kernels.reduce("sum", np.empty(3, np.int8), [a, a]).tolist() == [-2, 0, -56]
    u = np.array([65535, 40000], np.uint16)
    assert kernels.reduce("prod", np.empty(2, np.uint16), [u, u]).tolist() == [1, 4096]
    i = np.array([np.iinfo(np.int64).max], np.int64)
    assert kernels.reduce("sum", np.empty(1, np.int64), [i, i])[0] == -2
    # float16: 2048 + 1 + 1 is 2050 in float32, rounded once; pairwise in float16 gives 2048
    h = [np.array([2048], np.float16), np.array([1], np.float16), np.array([1], np.float16)]
    assert kernels.reduce("sum", np.empty(1, np.float16), h)[0] == 2050
    # bfloat16: 1 + 2^-8 is a tie between 1 and 1 + 2^-7: even mantissa wins
    one, tiny = f32_to_bf16(np.float32([1.0])), f32_to_bf16(np.float32([2.0 ** -8]))
    out = kernels.reduce("sum", np.empty(1, np.uint16), [one, tiny], dtype="bfloat16")
    assert bf16_to_f32(out)[0] == 1.0


def test_reduce_nan_and_inf():
    x = np.array([np.nan, 1.0, np.inf, -np.inf, np.inf, 0.0], np.float32)
    y = np.array([1.0, np.nan, 1.0, np.inf, np.inf, -0.0], np.float32)
    for op in OPS:
        for dt in ("float16", "float32", "float64"):
            a, b = x.astype(dt), y.astype(dt)
            got = kernels.reduce(op, np.empty(6, dt), [a, b])
            assert_same(got, ref_reduce(op, [a, b], dt), dt)
            assert np.isnan(got[:2]).all()
        a, b = f32_to_bf16(x), f32_to_bf16(y)
        got = kernels.reduce(op, np.empty(6, np.uint16), [a, b], dtype="bfloat16")
        assert_same(got, ref_reduce(op, [a, b], "bfloat16"), "bfloat16")


# ---- pt_reduce_all ----

ACC = {"int": np.int64, "uint": np.uint64, "float16": np.float32, "bfloat16": np.float32,
       "float32": np.float32, "float64": np.float64}


def acc_type(dt):
    return ACC["uint" if dt.startswith("uint") else "int" if dt in INTS else dt]


@pytest.mark.parametrize("n", LENGTHS + [100003])
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dt", DTYPES)
def test_reduce_all_vs_numpy(dt, op, n):
    if n == 0 and op in ("min", "max"):
        with pytest.raises(ValueError, match="no identity"):
            kernels.reduce_all(op, np.empty(0, storage(dt)), **dtype_arg(dt))
        return
    rng = np.random.default_rng([DTYPES.index(dt), OPS.index(op), n, 1])
    x = make(dt, n, rng, op, specials=False)
    assert_reduce_all_like_numpy(op, x, dt, kernels.reduce_all(op, x, **dtype_arg(dt)))


def assert_reduce_all_like_numpy(op, x, dt, got):
    """got (reduce_all(op, x)) is numpy's answer: exact for integers, min and max; a float
    sum or product within the rounding a pairwise order allows."""
    assert type(got) is acc_type(dt)
    n = x.size
    if dt in INTS:
        acc = acc_type(dt)
        want = {"sum": lambda: np.sum(x, dtype=acc), "prod": lambda: np.prod(x, dtype=acc),
                "min": lambda: acc(x.min()), "max": lambda: acc(x.max())}[op]()
        assert got == want
        return
    f = as_f64(x, dt)
    if op in ("min", "max"):
        assert got == getattr(np, op)(f)
    elif op == "sum":
        eps = np.finfo(acc_type(dt)).eps
        assert abs(float(got) - f.sum()) <= 4 * eps * np.log2(n + 2) * np.abs(f).sum() + 1e-300
    else:
        eps = np.finfo(acc_type(dt)).eps
        with np.errstate(over="ignore"):       # a product of many may overflow (to inf) alike
            want = np.prod(f) if acc_type(dt) is np.float64 else np.float32(np.prod(f))
        assert float(got) == pytest.approx(float(want), rel=float(4 * eps * (n + 1)))


@pytest.mark.parametrize("dt", FLOATS)
def test_reduce_all_nan_inf(dt):
    rng = np.random.default_rng(11)
    for n in (1, 7, 1000, 4099):
        for where in {0, n // 2, n - 1}:
            x = as_f64(make(dt, n, rng, specials=False), dt)
            x[where] = np.nan
            for op in OPS:
                arr = f32_to_bf16(x.astype(np.float32)) if dt == "bfloat16" else x.astype(dt)
                assert np.isnan(kernels.reduce_all(op, arr, **dtype_arg(dt))), (n, where, op)
            x[where] = np.inf
            x[(where + 1) % n] = -np.inf if n > 1 else np.inf
            arr = f32_to_bf16(x.astype(np.float32)) if dt == "bfloat16" else x.astype(dt)
            with np.errstate(invalid="ignore"):
                want = np.sum(x)
            got = kernels.reduce_all("sum", arr, **dtype_arg(dt))
            assert (np.isnan(got) and np.isnan(want)) or got == want
            assert kernels.reduce_all("max", arr, **dtype_arg(dt)) == np.inf


def test_reduce_all_identities_and_exact_sums():
    for dt in DTYPES:
        empty = np.empty(0, storage(dt))
        assert kernels.reduce_all("sum", empty, **dtype_arg(dt)) == 0
        assert kernels.reduce_all("prod", empty, **dtype_arg(dt)) == 1
    x = np.arange(1, 4097, dtype=np.float32)  # integers: every partial sum is exact
    assert kernels.reduce_all("sum", x) == 4096 * 4097 // 2
    assert kernels.reduce_all("sum", np.float16([65504, 65504])) == np.float32(131008)
    big = np.full(10, np.iinfo(np.uint64).max, np.uint64)
    assert kernels.reduce_all("sum", big) == np.uint64(2 ** 64 - 10)
    assert kernels.reduce_all("min", np.array([-128, 5], np.int8)) == -128


def test_reduce_all_accuracy_like_numpy():
    rng = np.random.default_rng(5)
    x = (rng.standard_normal(1 << 20) + 1).astype(np.float32)
    exact = x.astype(np.float64).sum()
    ours = abs(float(kernels.reduce_all("sum", x)) - exact)
    theirs = abs(float(np.sum(x)) - exact)
    assert ours <= max(4 * theirs, 1e-6 * np.abs(x).sum())


@pytest.mark.parametrize("dt", DTYPES)
def test_reduce_all_unaligned_and_strided(dt):
    """Unaligned and strided inputs give numpy's answer (and an unaligned sum the same bits
    as the aligned one: the lanes do not depend on where the data starts)."""
    rng = np.random.default_rng(9)
    x = make(dt, 2001, rng, specials=False)
    want = kernels.reduce_all("sum", x, **dtype_arg(dt))
    assert_reduce_all_like_numpy("sum", x, dt, want)
    for offset in range(1, 8):
        got = kernels.reduce_all("sum", unaligned(x, offset), **dtype_arg(dt))
        assert_reduce_all_like_numpy("sum", x, dt, got)
        assert got == want, offset
    for op in OPS:
        for view in (x[::-3], x[1::7], x[::-1]):
            assert_reduce_all_like_numpy(op, view, dt,
                                         kernels.reduce_all(op, view, **dtype_arg(dt)))


def test_ml_dtypes_bfloat16():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    rng = np.random.default_rng(2)
    a = rng.standard_normal(1001).astype(ml_dtypes.bfloat16)
    b = rng.standard_normal(1001).astype(ml_dtypes.bfloat16)
    out = kernels.reduce("sum", np.empty_like(a), [a, b])
    want = (a.astype(np.float32) + b.astype(np.float32)).astype(ml_dtypes.bfloat16)
    np.testing.assert_array_equal(out.view(np.uint16), want.view(np.uint16))
    assert kernels.reduce_all("max", a) == a.astype(np.float32).max()
    np.testing.assert_array_equal(kernels.gather(a[::-2]).view(np.uint16),
                                  a[::-2].view(np.uint16))


# ---- copy, gather, scatter ----

def test_copy():
    rng = np.random.default_rng(1)
    for n in (0, 1, 7, 4099, 100000):
        src = rng.integers(0, 255, n, dtype=np.uint8)
        dst = np.empty_like(src)
        assert kernels.copy(dst, src) is dst
        np.testing.assert_array_equal(dst, src)
    a = np.arange(10)
    kernels.copy(a[:5], a[2:7])  # overlapping: memmove
    assert a.tolist() == [2, 3, 4, 5, 6, 5, 6, 7, 8, 9]
    b = np.arange(12.0).reshape(3, 4)
    np.testing.assert_array_equal(kernels.copy(np.empty((4, 3)), b.T), b.T)


def _mapped(a):
    """Fraction of the pages of a that are mapped, by mincore(2)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    page = mmap.PAGESIZE
    vec = (ctypes.c_ubyte * (a.nbytes // page))()
    assert libc.mincore(a.ctypes.data, a.nbytes, vec) == 0, ctypes.get_errno()
    return sum(v & 1 for v in vec) / len(vec)


def test_prefault_maps_fresh_memory_and_keeps_its_bytes():
    # fresh anonymous memory: nothing mapped until prefault, all of it after, bytes unchanged
    m = mmap.mmap(-1, 8 << 20)
    a = np.frombuffer(m, np.uint8)
    a[:4096] = np.arange(4096) % 251                   # the first page only: not yet warm
    assert _mapped(a) < 0.01
    _native.prefault(a)
    assert _mapped(a) == 1.0
    assert (a[:4096] == np.arange(4096) % 251).all() and not a[4096:].any()
    # first and last pages mapped: taken as warm, left alone (no walk of its page tables)
    warm = np.frombuffer(mmap.mmap(-1, 4 << 20), np.uint8)
    warm[0] = warm[-1] = 7
    _native.prefault(warm)
    assert _mapped(warm) < 0.01 and warm[0] == warm[-1] == 7
    # under 1 MiB: left alone
    small = mmap.mmap(-1, 512 << 10)
    s = np.frombuffer(small, np.uint8)
    _native.prefault(s)
    assert _mapped(s) == 0.0
    with pytest.raises(BufferError):
        _native.prefault(b"read-only bytes")


ITEM_DTYPES = [np.uint8, np.int16, np.float32, np.float64, np.complex128, np.dtype("S3")]


@st.composite
def sliced(draw):
    """A random array of 1..4 dims and a random basic slice of it (steps may be negative)."""
    ndim = draw(st.integers(1, 4))
    shape = tuple(draw(st.lists(st.integers(1, 7), min_size=ndim, max_size=ndim)))
    index = []
    for n in shape:
        kind = draw(st.sampled_from(["slice", "slice", "slice", "int", "all"]))
        if kind == "int":
            index.append(draw(st.integers(-n, n - 1)))
        elif kind == "all":
            index.append(slice(None))
        else:
            start = draw(st.none() | st.integers(-n - 1, n))
            stop = draw(st.none() | st.integers(-n - 1, n))
            step = draw(st.sampled_from([1, 2, 3, -1, -2, -3]))
            index.append(slice(start, stop, step))
    dtype = draw(st.sampled_from(ITEM_DTYPES))
    transpose = draw(st.booleans())
    return shape, tuple(index) + (Ellipsis,), np.dtype(dtype), transpose  # views, even 0-d


def bytes_of(a):
    return np.ascontiguousarray(a).reshape(-1).view(np.uint8)


def filled(shape, dtype, seed):
    raw = np.random.default_rng(seed).integers(0, 256, int(np.prod(shape)) * dtype.itemsize,
                                               dtype=np.uint8)
    return raw.view(dtype).reshape(shape)


@settings(max_examples=150, deadline=None)
@given(sliced(), st.integers(0, 2 ** 32 - 1))
def test_gather_scatter_slices(case, seed):
    shape, index, dtype, transpose = case
    base = filled(shape, dtype, seed)
    view = base[index]
    if transpose:
        view = view.T
    got = kernels.gather(view)
    assert got.flags.c_contiguous and got.shape == view.shape
    np.testing.assert_array_equal(bytes_of(got), bytes_of(view))

    dst = base.copy()
    dview = dst[index].T if transpose else dst[index]
    src = filled(view.shape, dtype, seed + 1)
    want = base.copy()
    (want[index].T if transpose else want[index])[...] = src
    kernels.scatter(dview, src)
    np.testing.assert_array_equal(bytes_of(dst), bytes_of(want))


def test_gather_zero_strides_and_scalars():
    a = np.arange(5, dtype=np.int32)
    b = np.broadcast_to(a, (3, 5))  # stride 0 on axis 0
    np.testing.assert_array_equal(kernels.gather(b), np.ascontiguousarray(b))
    c = np.lib.stride_tricks.as_strided(a[4:], shape=(2, 4), strides=(0, -4))
    np.testing.assert_array_equal(kernels.gather(c), [[4, 3, 2, 1]] * 2)
    s = np.float64(3.5)
    assert kernels.gather(np.asarray(s)).shape == () and kernels.gather(np.asarray(s)) == 3.5
    big = np.arange(3 * 5000, dtype=np.float64).reshape(3, 5000)[:, ::-7]  # GIL released
    np.testing.assert_array_equal(kernels.gather(big), np.ascontiguousarray(big))
    out = np.zeros((3, 5000))
    kernels.scatter(out[:, ::-7], big)
    np.testing.assert_array_equal(out[:, ::-7], big)


def test_scatter_overlapping_source():
    a = np.arange(10)
    kernels.scatter(a[::-1], a)  # src copied first, like numpy's own a[::-1] = a
    assert a.tolist() == list(range(9, -1, -1))


# ---- bad arguments ----

def test_bad_arguments_python():
    a = np.zeros(4, np.float32)
    with pytest.raises(ValueError, match="op"):
        kernels.reduce("mean", a, [a])
    with pytest.raises(TypeError, match="bool"):
        kernels.reduce("sum", np.zeros(4, bool), [np.zeros(4, bool)])
    with pytest.raises(TypeError):
        kernels.reduce_all("sum", np.zeros(4, complex))
    with pytest.raises(ValueError, match="byte order"):
        kernels.reduce_all("sum", np.zeros(4, ">f4"))
    with pytest.raises(ValueError, match="srcs\\[0\\]"):
        kernels.reduce("sum", a, [np.zeros(5, np.float32)])
    with pytest.raises(ValueError, match="srcs\\[1\\]"):
        kernels.reduce("sum", a, [a, np.zeros(4, np.float64)])
    with pytest.raises(ValueError, match="empty"):
        kernels.reduce("sum", a, [])
    with pytest.raises(ValueError, match="C-contiguous"):
        kernels.reduce("sum", np.zeros(8, np.float32)[::2], [a])
    frozen = a.copy()
    frozen.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        kernels.reduce("sum", frozen, [a])
    with pytest.raises(ValueError, match="2-byte"):
        kernels.reduce_all("sum", a, dtype="bfloat16")
    with pytest.raises(ValueError):
        kernels.scatter(np.zeros(3), np.zeros(4))
    with pytest.raises(ValueError):
        kernels.copy(np.zeros(3), np.zeros(4))
    with pytest.raises(TypeError):
        kernels.gather(np.array([object()]))
    big = np.zeros(16, np.float32)
    with pytest.raises(ValueError, match="overlaps"):
        kernels.reduce("sum", big[:8], [big[4:12], big[:8]])


def test_bad_arguments_native():
    f = np.zeros(4, np.float32)
    with pytest.raises(ValueError, match="op"):
        _native.reduce(9, 10, f, [f])
    with pytest.raises(ValueError, match="dtype"):
        _native.reduce(0, -1, f, [f])
    with pytest.raises(ValueError, match="dtype"):
        _native.dtype_size(12)
    with pytest.raises(TypeError, match="srcs"):
        _native.reduce(0, 10, f, 3)
    with pytest.raises(TypeError, match="srcs\\[1\\]"):
        _native.reduce(0, 10, f, [f, 3.0])
    with pytest.raises(ValueError, match="at least one"):
        _native.reduce(0, 10, f, [])
    with pytest.raises(ValueError, match="dst"):
        _native.reduce(0, 10, b"\0" * 16, [f])  # read-only dst
    with pytest.raises(ValueError, match="whole number"):
        _native.reduce(0, 10, bytearray(6), [bytearray(6)])
    with pytest.raises(ValueError, match="whole number"):
        _native.reduce_all(0, 3, bytearray(12))
    with pytest.raises(ValueError, match="bytes"):
        _native.reduce(0, 10, f, [np.zeros(1000, np.float32)])  # longer than dst
    with pytest.raises(ValueError, match="no identity"):
        _native.reduce_all(2, 10, b"")
    with pytest.raises(ValueError, match="C-contiguous"):
        _native.reduce_all(0, 10, np.zeros(8, np.float32)[::2])
    with pytest.raises(ValueError, match="bytes"):
        _native.gather(bytearray(3), np.zeros(4, np.uint8)[::-1])
    with pytest.raises(ValueError, match="bytes"):
        _native.scatter(np.zeros(4, np.uint8)[::2], b"abc")
    with pytest.raises(ValueError, match="bytes"):
        _native.copy(bytearray(3), b"abcd")
    with pytest.raises(TypeError):
        _native.copy(bytearray(3))
    assert _native.reduce_all(0, 4, b"\x01\x02\x03") == 6
    assert _native.reduce_all(0, 0, b"\xff\x01") == 0


def test_threads_agree():
    """Many threads calling at once (GIL released for big buffers) get the right answers."""
    x = np.arange(1 << 16, dtype=np.float64)
    want = kernels.reduce_all("sum", x)
    errors = []

    def work():
        for _ in range(20):
            if kernels.reduce_all("sum", x) != want:
                errors.append(1)
            out = kernels.reduce("max", np.empty_like(x), [x, x[::-1]])
            if not (out == np.maximum(x, x[::-1])).all():
                errors.append(2)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors


# ---- the scalar variant against the dispatched one ----

def _fingerprint():
    """Results of every reduction for fixed data, as arrays, to compare across variants."""
    out = {}
    for dt in DTYPES:
        for op in OPS:
            rng = np.random.default_rng([DTYPES.index(dt), OPS.index(op), 42])
            srcs = [make(dt, 5003, rng, op) for _ in range(3)]
            dst = np.empty(5003, storage(dt))
            kernels.reduce(op, dst, srcs, **dtype_arg(dt))
            out[f"reduce_{dt}_{op}"] = dst
            x = make(dt, 30011, rng, op, specials=False)
            out[f"all_{dt}_{op}"] = np.array([kernels.reduce_all(op, x, **dtype_arg(dt))])
    return out


def _run_variant(name):
    root = os.path.dirname(os.path.dirname(os.path.abspath(collectives.__file__)))
    here = os.path.dirname(os.path.abspath(__file__))
    env = dict(os.environ, POOLTENSOR_KERNELS=name,
               PYTHONPATH=os.pathsep.join([root, here, os.environ.get("PYTHONPATH", "")]))
    code = ("import io, sys, numpy as np, test_kernels as t\n"
            "from collectives import kernels\n"
            "buf = io.BytesIO(); np.savez(buf, **t._fingerprint())\n"
            "sys.stdout.buffer.write(kernels.isa().encode() + b'\\n' + buf.getvalue())\n")
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, timeout=60)
    assert res.returncode == 0, res.stderr.decode()
    isa, _, data = res.stdout.partition(b"\n")
    return isa.decode(), dict(np.load(io.BytesIO(data)))


@pytest.mark.parametrize("variant", ["scalar", "avx2"])
def test_variants_agree_bitwise(variant):
    """Every variant does the same operations in the same order: same bits (NaN payloads
    aside), so ranks on different CPUs agree."""
    isa, theirs = _run_variant(variant)
    if variant == "scalar":
        assert isa == "scalar"
    elif isa != variant:
        pytest.skip(f"this CPU cannot run {variant} (got {isa})")
    ours = _fingerprint()
    for key, want in ours.items():
        got = theirs[key]
        if want.dtype.kind == "f":
            nan = np.isnan(want)
            np.testing.assert_array_equal(np.isnan(got), nan, err_msg=key)
            want, got = want[~nan], got[~nan]
        elif key.startswith("reduce_bfloat16"):
            nan = np.isnan(bf16_to_f32(want))
            np.testing.assert_array_equal(np.isnan(bf16_to_f32(got)), nan, err_msg=key)
            want, got = want[~nan], got[~nan]
        np.testing.assert_array_equal(got.view(np.uint8), want.view(np.uint8), err_msg=key)


def test_unknown_kernels_variable_is_an_error():
    root = os.path.dirname(os.path.dirname(os.path.abspath(collectives.__file__)))
    env = dict(os.environ, POOLTENSOR_KERNELS="sse9",
               PYTHONPATH=os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]))
    res = subprocess.run([sys.executable, "-c", "import collectives.kernels"], env=env,
                         capture_output=True, timeout=60)
    assert res.returncode != 0 and b"POOLTENSOR_KERNELS" in res.stderr
