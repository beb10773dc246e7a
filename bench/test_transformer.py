"""transformer: every contender on the shared case table (silkattn._bench.cases)."""
from conftest import cases_of, run_case


@cases_of("transformer")
def test_transformer(benchmark, contender, case):
    run_case(benchmark, contender, case)
