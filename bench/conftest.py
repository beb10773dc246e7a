"""pytest-benchmark suite: `pytest bench/ --benchmark-only` prints each op and shape's contenders
side by side.

The cases and each contender's call come from silkattn._bench.cases (the same table
`python -m silkattn bench` reads). Contenders: every installed silkattn backend, the NumPy
reference and PyTorch (skipped when torch is not importable). Each contender's answer must have
the reference's shape and dtype and agree with the reference computed in float64, checked outside
the timed call, so a fast wrong answer fails. Thread count: SILKATTN_BENCH_THREADS (default: all),
recorded in extra_info.
"""
import os
import re

import pytest

import silkattn
from silkattn._bench import cases as specs
from silkattn._testing import assert_matches

THREADS = int(os.environ.get("SILKATTN_BENCH_THREADS", silkattn.get_num_threads()))
OURS = [name for name, status in silkattn.backends().items()
        if name != "numpy" and status.startswith("available")]


# each rival contender's libraries: a contender without one of them is skipped (transformers reads a
# GGUF file only with accelerate installed)
LIBRARIES = {"torch": ("torch",), "sentence-transformers": ("sentence_transformers",),
             "onnxruntime": ("onnxruntime",), "llama.cpp": ("llama_cpp",),
             "transformers": ("transformers", "accelerate")}


@pytest.fixture
def contender(request):
    for library in LIBRARIES.get(request.param, ()):
        pytest.importorskip(library, reason=f"{library} is not installed")
    if request.param in ("torch", "sentence-transformers"):
        import torch
        torch.set_num_threads(THREADS)
    os.environ.setdefault("OMP_NUM_THREADS", str(THREADS))  # onnxruntime's session reads it
    silkattn.set_num_threads(THREADS)
    return request.param


def run_case(benchmark, contender, case):
    """Check the contender against the float64 reference, then time it."""
    if contender in OURS:
        silkattn.set_backend(contender)
    call = specs.build("silkattn" if contender in OURS else contender, case)
    if call is None:
        pytest.skip(f"{contender} has no {case['op']} call")
    reference = specs.build("numpy", dict(case, dtype="float64"))
    if reference is None:  # int8 weights: no reference call; near the float32 weights' embeddings
        assert case.get("weights") == "int8"
        out = call.result(call.run())
        assert specs.int8_embeddings_close(out, case, "silkattn" if contender in OURS else contender)
    else:
        assert_matches(call.result(call.run()), reference.run(), case["dtype"])
    benchmark.group = specs.case_name(case)
    benchmark.extra_info.update(threads=THREADS, contender=contender)
    benchmark.pedantic(call.run, warmup_rounds=2, rounds=10 if contender != "numpy" else 3, iterations=1)


def cases_of(op, full=False, match=None):
    """Parametrize a test over the op's cases (those whose name matches the regular expression
    `match`, if given) and the contenders that have a call for it."""
    contenders = pytest.mark.parametrize("contender", OURS + list(specs.OPS[op].rivals), indirect=True)
    cases = [c for c in specs.OPS[op].cases(full) if match is None or re.search(match, specs.case_name(c))]
    shapes = pytest.mark.parametrize("case", cases, ids=specs.case_name)
    return lambda test: shapes(contenders(test))


def pytest_terminal_summary(terminalreporter):
    terminalreporter.write_line(
        "note: torch runs in this process beside silkattn's OpenMP threads, and each runtime's idle "
        "spinning threads can slow the other; `python -m silkattn bench` times every contender in its "
        "own process, alternating over rounds.")
