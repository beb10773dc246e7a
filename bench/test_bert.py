"""bert (all-MiniLM-L6-v2 on a batch of 32 sentences): every contender on the shared case table
(silkattn._bench.cases); skipped when the model package or the bert extra is not installed."""
from conftest import cases_of, run_case


@cases_of("bert", full=True)
def test_bert(benchmark, contender, case):
    run_case(benchmark, contender, case)
