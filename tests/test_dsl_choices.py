"""Choices in patterns (`dsl.expand.alternatives`): `(or ...)`, `Op?` and `absent`, one rule
per choice, guards kept where their captures are bound."""

import pytest

import dsl
from dsl import check, parse
from dsl.ir import Absent, Capture, OpNode


def _rules(text: str):
    return check(parse(text, "t.rules"))


def test_or_is_one_rule_per_alternative():
    rules = _rules("(simplify r (Abs (or (Abs @x) (Neg @x))) (Abs @x))")
    assert [r.name for r in rules] == ["r", "r-alt1"]
    assert [r.lhs.args[0].op for r in rules] == ["Abs", "Neg"]


def test_absent_or_zero_keeps_the_guard_where_the_capture_is_bound():
    rules = _rules(
        "(simplify r (Relu (Pad @x @p (or absent @z))) (if (all-equal @p 0) (all-equal @z 0))"
        " (Relu @x))"
    )
    pads = [r.lhs.args[0] for r in rules]
    assert pads[0].args[2] == Absent() and pads[1].args[2] == Capture("z")
    assert [[g.fn for g in r.guards] for r in rules] == [["all-equal"], ["all-equal", "all-equal"]]


def test_optional_op_is_the_op_or_its_first_input():
    rules = _rules("(simplify r (Neg (Neg (Identity? @x))) @x)")
    inner = [r.lhs.args[0].args[0] for r in rules]
    assert isinstance(inner[0], OpNode) and inner[0].op == "Identity"
    assert inner[1] == Capture("x")


def test_choices_multiply_and_commute():
    rules = _rules("(simplify r (Add:c (or (Neg @x) (Abs @x)) (Identity? @y)) (Add @x @y))")
    assert len(rules) == 8  # 2 x 2 choices, each in both operand orders


def test_a_result_needs_every_capture_in_every_alternative():
    with pytest.raises(dsl.UnboundCaptureError):
        _rules("(simplify r (Relu (or (Neg @x) (Abs @y))) (Relu @x))")


@pytest.mark.parametrize(
    "text",
    [
        "(simplify r (Relu @x) (Relu (or @x @x)))",
        "(simplify r (Relu @x) (Relu (Identity? @x)))",
        "(equal r (Relu (or (Neg @x) (Abs @x))) (Relu @x))",
    ],
)
def test_choices_only_in_simplify_patterns(text):
    with pytest.raises(dsl.RulesError, match="only allowed in a simplify rule's pattern"):
        _rules(text)


def test_absent_in_a_result_builds_without_the_input():
    (rule,) = _rules("(simplify r (Clip @x @lo @hi) (if (all-equal @hi 6)) (Clip @x @lo absent))")
    assert rule.rhs.args == (Capture("x"), Capture("lo"), Absent())


def test_printer_round_trips_choices():
    text = "(simplify r (Neg (Neg (Identity? @x))) (if (rank @x 2)) @x)"
    printed = dsl.format_file(parse(text, "t.rules"))
    assert "(Identity? @x)" in printed
    assert [r.lhs for r in _rules(printed)] == [r.lhs for r in _rules(text)]
    alt = "(simplify r (Abs (or (Abs @x) absent)) (Abs @x))"
    assert "(or (Abs @x) absent)" in dsl.format_file(parse(alt, "t.rules"))
