"""layer_norm: every contender on the shared case table (silkattn._bench.cases)."""
from conftest import cases_of, run_case


@cases_of("layer_norm")
def test_layer_norm(benchmark, contender, case):
    run_case(benchmark, contender, case)
