"""attention: every contender on the shared case table (silkattn._bench)."""
import pytest

from conftest import run_case
from silkattn import _bench


@pytest.mark.parametrize("case", _bench.attention_cases(full=False), ids=_bench.case_name)
def test_attention(benchmark, contender, case):
    run_case(benchmark, contender, case)
