"""attention's rules (grouped-query heads, a sliding window, ALiBi, a few queries after a cache)
beside the plain cases they are read against: every contender on the shared case table
(silkattn._bench.cases: attention_rule_cases, RULE_BASELINES). The full set's sizes: the window at
S = 16384 takes torch (a dense mask: S^2 work) some seconds a call."""
from silkattn._bench import cases as specs

from conftest import cases_of, run_case


@cases_of("attention", full=True, match=specs.RULES_MATCH)
def test_attention_rules(benchmark, contender, case):
    run_case(benchmark, contender, case)
