"""The benchmark case table (silkattn._bench.cases): every contender's call, on every op, returns
the reference's shape and dtype and agrees with it. Sizes are shrunk to test speed; torch is the
stand-in of fake_torch.py, so the rivals' glue is checked without torch installed."""
import sys

import pytest

import silkattn
from silkattn._bench import cases as specs
from silkattn._testing import assert_matches

import fake_torch
from conftest import COMPILED

SMALL = {"S": 40, "rows": 12, "prompt": 12, "sentences": 5, "max_words": 20}
SMALL_NEW = 4  # tokens a shrunk generate case writes


def shrink(c):
    small = {k: v for k, v in SMALL.items() if k in c}
    return dict(c, **small, **({"new": min(c["new"], SMALL_NEW)} if "new" in c else {}))


CASES = [shrink(c) for op in specs.OPS.values() for c in op.cases(True)]


@pytest.fixture
def torch_stand_in(monkeypatch):
    for name, module in fake_torch.MODULES.items():
        monkeypatch.setitem(sys.modules, name, module)


# every contender with a call for the case's op; sentence-transformers and onnxruntime need the
# libraries themselves (the torch stand-in cannot serve them): the bench/ suite checks those
PAIRS = [pytest.param(contender, case, id=f"{contender}-{specs.case_name(case)}") for case in CASES
         for contender in COMPILED + [r for r in specs.OPS[case["op"]].rivals if r in ("numpy", "torch")]]


@pytest.mark.parametrize("contender, case", PAIRS)
def test_every_call_returns_the_references_shape_and_dtype(torch_stand_in, contender, case):
    expected = specs.build("numpy", dict(case, dtype="float64")).run()
    if contender in COMPILED:
        with silkattn.use_backend(contender):
            call = specs.build("silkattn", case)
            out = call.result(call.run())
    else:
        call = specs.build(contender, case)
        out = call.result(call.run())
    assert_matches(out, expected, case["dtype"])


def test_every_op_has_cases_names_and_the_reference():
    names = [specs.case_name(c) for c in specs.all_cases(full=True)]
    assert len(names) == len(set(names))  # --match and the tables tell cases apart by name
    assert all(c in specs.all_cases(full=True) for c in specs.all_cases(full=False))
    for op in specs.OPS.values():
        assert "numpy" in op.rivals and set(op.rivals) <= set(specs.RIVALS), op.name


def test_memory_is_measured_only_for_contenders_with_the_call(monkeypatch):
    """`bench --full` measures one attention call's memory per contender: a rival with no attention
    (sentence-transformers, onnxruntime) must be left out, not crash the run."""
    import silkattn._bench as bench
    asked = []
    monkeypatch.setattr(bench, "_run_worker", lambda python, spec: asked.append(spec["contender"]) or
                        {"memory_mib": 1.0})
    mib = bench.memory(["cython", "numba", "numpy", "torch", "sentence-transformers", "onnxruntime"])
    assert asked == ["cython", "numba", "numpy", "torch"] and set(mib) == set(asked)


def test_plot_leaves_out_contenders_without_attention(tmp_path):
    pytest.importorskip("matplotlib")
    import silkattn._bench as bench
    cases = [dict(op="attention", S=S, heads=0, dk=64, causal=causal, dtype="float32")
             for causal in (False, True) for S in (128, 512)]
    times = [1e-3] * len(cases)
    results = {2: {"cython": times, "sentence-transformers": [None] * len(cases), "sgemm": 100.0}}
    bench.plot(cases, results, ["cython", "sentence-transformers"], tmp_path / "plot.png")
    assert (tmp_path / "plot.png").stat().st_size > 0
