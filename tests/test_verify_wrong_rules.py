"""`rewrite verify` must be able to fail: every deliberately wrong rule under
tests/wrong_rules/ is rejected with a shrunk counterexample (wrong constants, a dropped
broadcast, swapped operands, a permutation composed the wrong way round, a reduction over the
wrong axis, a guard missing so the rule fires on NaN, ignored attributes, "same type" taken for
"no-op", ...). The number of examples each needed is recorded as a test property (`-rA` or
junit-xml shows it) and printed by `python bench/verify_rules.py tests/wrong_rules`."""

from pathlib import Path

import pytest

from dsl import load_rules
from verify.runner import DEFAULT_EXAMPLES, verify_rule

CORPUS = Path(__file__).parent / "wrong_rules"
RULES = load_rules([CORPUS])


def test_the_corpus_is_big_enough():
    assert len(RULES.rules) >= 12


@pytest.mark.slow
@pytest.mark.parametrize("rule", RULES.rules, ids=RULES.names())
def test_wrong_rule_is_rejected(rule, record_property):
    res = verify_rule(rule, RULES, examples=DEFAULT_EXAMPLES, seed=0)
    assert res.status == "FAIL", f"{rule.name} passed {res.examples} examples"
    f = res.failure
    record_property("examples_to_catch", f.caught_after)
    assert f.caught_after is not None and f.caught_after <= DEFAULT_EXAMPLES
    assert "counterexample (shrunk)" in f.text and "left side:" in f.text
    # under CI the command carries CI=1, which selects the same (derandomized) profile
    assert res.repro.removeprefix("CI=1 ").startswith("rewrite verify ")
    assert f"--rule {rule.name}" in res.repro
