"""generate: every contender on the shared case table (silkattn._bench.cases); the full set (the
reference recomputes the whole forward pass for each of the 64 new tokens: about a minute)."""
from conftest import cases_of, run_case


@cases_of("generate", full=True)
def test_generate(benchmark, contender, case):
    run_case(benchmark, contender, case)
