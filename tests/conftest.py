"""Shared test fixtures: the tolerance table, the backends under test, a seeded generator."""
import importlib

import numpy as np
import pytest

import silkattn
from silkattn._backends import MODULES

# One table per dtype: how far a kernel's answer may stray from the reference's answer computed
# in float64 on the same inputs (so the table bounds the kernel's own error, not the reference's).
TOL = {
    np.dtype(np.float32): dict(rtol=1e-4, atol=1e-5),
    np.dtype(np.float64): dict(rtol=1e-10, atol=1e-11),
}
DTYPES = [np.float32, np.float64]


def f64(*arrays):
    """The inputs in float64, for computing the reference's answer to compare against."""
    return [None if a is None else np.asarray(a, dtype=np.float64) for a in arrays]


def assert_close(actual, expected, dtype=None):
    """actual has the reference's shape, the given dtype, and values within that dtype's tolerance."""
    dtype = np.dtype(dtype or expected.dtype)
    assert isinstance(actual, np.ndarray)
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    assert actual.dtype == dtype, (actual.dtype, dtype)
    np.testing.assert_allclose(actual, expected, **TOL[dtype])


@pytest.fixture(params=[name for name in MODULES if name != "numpy"])
def backend(request):
    """Each compiled backend's module; every kernel test runs once per backend."""
    status = silkattn.backends()[request.param]
    if not status.startswith("available"):
        pytest.fail(f"backend {request.param} is not available: {status}")
    return importlib.import_module(MODULES[request.param])


@pytest.fixture(params=[1, 2], ids=["1thread", "2threads"])
def threads(request):
    previous = silkattn.set_num_threads(request.param)
    yield request.param
    silkattn.set_num_threads(previous)


@pytest.fixture
def rng():
    return np.random.default_rng(20261129)
