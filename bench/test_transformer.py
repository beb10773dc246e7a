"""transformer: every contender on the shared case table (silkattn._bench)."""
import pytest

from conftest import run_case
from silkattn import _bench


@pytest.mark.parametrize("case", [c for c in _bench.model_cases(full=True) if c["op"] == "transformer"], ids=_bench.case_name)
def test_transformer(benchmark, contender, case):
    run_case(benchmark, contender, case)
