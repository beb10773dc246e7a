"""multi_head: every contender on the shared case table (silkattn._bench.cases)."""
from conftest import cases_of, run_case


@cases_of("multi_head")
def test_multi_head(benchmark, contender, case):
    run_case(benchmark, contender, case)
