"""attention_backward: every contender on the shared case table (silkattn._bench.cases), its full
set (the quick `python -m silkattn bench` has no backward case)."""
from conftest import cases_of, run_case


@cases_of("attention_backward", full=True)
def test_attention_backward(benchmark, contender, case):
    run_case(benchmark, contender, case)
