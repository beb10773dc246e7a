"""Shared test fixtures: the tolerance table, the backends under test, a seeded generator."""
import importlib

import numpy as np
import pytest

import silkattn
from silkattn._backends import MODULES
from silkattn._testing import TOL, assert_close  # noqa: F401  (one tolerance table, shared with bench/)

DTYPES = [np.float32, np.float64]


def f64(*arrays):
    """The inputs in float64, for computing the reference's answer to compare against."""
    return [None if a is None else np.asarray(a, dtype=np.float64) for a in arrays]


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
