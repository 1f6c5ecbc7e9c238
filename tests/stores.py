"""What the store tests share: the byte-for-byte comparison of a pool array with numpy."""
import numpy as np


def same(a, b):
    """a and b have one shape, one dtype and the same bytes."""
    a, b = np.asarray(a), np.asarray(b)
    assert a.shape == b.shape and a.dtype == b.dtype, (a.shape, a.dtype, b.shape, b.dtype)
    assert np.ascontiguousarray(a).tobytes() == np.ascontiguousarray(b).tobytes()
