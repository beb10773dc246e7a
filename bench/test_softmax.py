"""softmax: every contender on the shared case table (silkattn._bench.cases)."""
from conftest import cases_of, run_case


@cases_of("softmax")
def test_softmax(benchmark, contender, case):
    run_case(benchmark, contender, case)
