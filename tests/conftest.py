"""Shared test fixtures: the tolerance table, the backends under test, a seeded generator."""
import importlib

import numpy as np
import pytest

import silkattn
from silkattn._backends import MODULES
from silkattn._testing import TOL, assert_close  # noqa: F401  (one tolerance table, shared with bench/)

# the tests marked `blas` run under every OpenBLAS setting, in child pytests (tests/blas_settings.py)
from blas_settings import pytest_configure, pytest_pyfunc_call, pytest_runtest_logreport  # noqa: F401

DTYPES = [np.float32, np.float64]
COMPILED = [name for name in MODULES if name != "numpy"]


def f64(*arrays):
    """The inputs in float64, for computing the reference's answer to compare against."""
    return [None if a is None else np.asarray(a, dtype=np.float64) for a in arrays]


def backend_module(name):
    """A backend's module (its ops run on its kernels alone); a failure if it is not available."""
    status = silkattn.backends()[name]
    if not status.startswith("available"):
        pytest.fail(f"backend {name} is not available: {status}")
    return importlib.import_module(MODULES[name])


@pytest.fixture(params=COMPILED)
def backend(request):
    """Each compiled backend's module: every kernel test runs once per backend."""
    return backend_module(request.param)


@pytest.fixture(params=list(MODULES))
def any_backend(request):
    """Each backend's module, the numpy one (the reference behind the same checks) included."""
    return backend_module(request.param)


@pytest.fixture(params=list(MODULES))
def on_backend(request):
    """Runs the test with each backend as the current one (for the top-level API and the models)."""
    backend_module(request.param)
    with silkattn.use_backend(request.param):
        yield request.param


@pytest.fixture(params=[1, 2], ids=["1thread", "2threads"])
def threads(request):
    previous = silkattn.set_num_threads(request.param)
    yield request.param
    silkattn.set_num_threads(previous)


@pytest.fixture
def rng():
    return np.random.default_rng(20261129)
