"""Shared test fixtures: the tolerance table, the backends under test, a seeded generator."""
import importlib

import numpy as np
import pytest

import silkattn
from silkattn._backends import MODULES

# One table per dtype: how far a kernel may stray from the float64-accumulating reference.
TOL = {
    np.dtype(np.float32): dict(rtol=2e-5, atol=2e-6),
    np.dtype(np.float64): dict(rtol=1e-11, atol=1e-13),
}
DTYPES = [np.float32, np.float64]


def assert_close(actual, expected, dtype=None):
    """Same shape and dtype as the reference's answer, and values within the dtype's tolerance."""
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
