"""pytest-benchmark suite: `pytest bench/ --benchmark-only` prints each op and shape's contenders side by side.

Contenders: every installed silkattn backend, the NumPy reference and PyTorch (skipped when torch
is not importable). Each contender's answer is checked against the reference (in float64) outside
the timed call, so a fast wrong answer fails. Thread count: SILKATTN_BENCH_THREADS (default: all),
recorded in extra_info.
"""
import os

import numpy as np
import pytest

import silkattn
from silkattn import _bench
from silkattn._testing import TOL

THREADS = int(os.environ.get("SILKATTN_BENCH_THREADS", silkattn.get_num_threads()))
CONTENDERS = [name for name, status in silkattn.backends().items()
              if name != "numpy" and status.startswith("available")] + ["numpy", "torch"]


@pytest.fixture(params=CONTENDERS)
def contender(request):
    if request.param == "torch":
        torch = pytest.importorskip("torch", reason="PyTorch is not installed (pip install torch==2.13.0)")
        torch.set_num_threads(THREADS)
    silkattn.set_num_threads(THREADS)
    return request.param


def run_case(benchmark, contender, case):
    """Check the contender against the float64 reference, then time it."""
    fn = _bench._callable(contender, case)
    result = np.asarray(fn())
    expected = np.asarray(_bench._callable("numpy", dict(case, dtype="float64"))())
    np.testing.assert_allclose(result, expected, **TOL[np.dtype(case["dtype"])])
    benchmark.group = _bench.case_name(case)
    benchmark.extra_info.update(threads=THREADS, contender=contender)
    benchmark.pedantic(fn, warmup_rounds=2, rounds=10 if contender != "numpy" else 3, iterations=1)


def pytest_terminal_summary(terminalreporter):
    terminalreporter.write_line(
        "note: torch runs in this process beside silkattn's OpenMP threads, and each runtime's idle "
        "spinning threads can slow the other; `python -m silkattn bench` times every contender in its "
        "own process, alternating over rounds.")
