"""The tolerance table shared by the tests and the benchmarks' correctness checks."""
import numpy as np

# How far a kernel's answer may stray from the reference's answer computed in float64 on the
# same inputs, per dtype (so the table bounds the kernel's own error, not the reference's).
TOL = {
    np.dtype(np.float32): dict(rtol=1e-4, atol=1e-5),
    np.dtype(np.float64): dict(rtol=1e-10, atol=1e-11),
}


def assert_close(actual, expected, dtype=None):
    """actual has the reference's shape, the given dtype, and values within that dtype's tolerance."""
    dtype = np.dtype(dtype or expected.dtype)
    assert isinstance(actual, np.ndarray)
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    assert actual.dtype == dtype, (actual.dtype, dtype)
    np.testing.assert_allclose(actual, expected, **TOL[dtype])


def assert_matches(result, expected, dtype):
    """result against the reference's answer (computed in float64): token ids equal; arrays of the
    reference's shape, the given dtype and values within that dtype's tolerance."""
    expected = np.asarray(expected)
    if expected.dtype.kind in "iu":
        np.testing.assert_array_equal(result, expected)
    else:
        assert_close(result, expected.astype(dtype), dtype)
