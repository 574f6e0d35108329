"""`(with (@name VALUE) ...)` bindings: a result term written in place, a builder value shared
by guards and result attributes, and their located errors."""

import pytest

import dsl
from verify.runner import verify_rules


def _one(text: str):
    (rule,) = dsl.check(dsl.parse(text, "t.rules"))
    return rule


def test_a_term_binding_is_the_result_written_out():
    bound = _one("(simplify a (Mul @x @y) (with (@k (Add @x @y))) (Mul @k @k))")
    plain = _one("(simplify a (Mul @x @y) (Mul (Add @x @y) (Add @x @y)))")
    assert bound.rhs == plain.rhs and bound.term_captures == plain.term_captures


def test_a_builder_binding_is_shared_by_guard_and_result():
    rule = _one(
        "(simplify a (Transpose (Transpose @x :perm @p) :perm @q)"
        " (with (@pq (compose-perm @p @q))) (if (not (identity-perm @pq)))"
        " (Transpose @x :perm @pq))"
    )
    (guard,) = rule.guards
    assert (
        guard.args[0]
        == dict(rule.rhs.attrs)["perm"]
        == dsl.ir.Call("compose-perm", (dsl.ir.Capture("p"), dsl.ir.Capture("q")))
    )


def test_bindings_see_the_ones_before_them():
    rule = _one("(simplify a (Neg @x) (with (@a (Abs @x)) (@b (Neg @a))) (Add @a @b))")
    assert rule.rhs.args[1].args[0] == rule.rhs.args[0]


@pytest.mark.parametrize(
    "text, message",
    [
        ("(simplify a (Neg @x) (with (@x (Abs @x))) @x)", "already bound"),
        ("(simplify a (Neg @x) (with (@k (Abs @x))) (if (is-constant @k)) @k)", "not built"),
        (
            "(simplify a (Transpose @x :perm @p) (with (@c (compose-perm @p @p))) @c)",
            "cannot be a term",
        ),
        ("(simplify a (Neg @x) (with (@k (Abs @x))) (Transpose @x :perm @k))", "attribute"),
        ("(simplify a (Neg @x) (with (@k (Abs @y))) @k)", "@y is not bound"),
    ],
)
def test_misused_bindings_are_located_errors(text, message):
    with pytest.raises(dsl.RulesError) as info:
        dsl.check(dsl.parse(text, "t.rules"))
    assert message in str(info.value) and str(info.value).startswith("t.rules:1:")


def test_a_rule_with_a_builder_binding_in_its_guard_verifies():
    text = (
        "(simplify cancel (Transpose (Transpose @x :perm @p) :perm @q)"
        " (with (@pq (compose-perm @p @q))) (if (identity-perm @pq)) @x)"
    )
    (res,) = verify_rules(dsl.RuleSet(tuple(dsl.check(dsl.parse(text, "t.rules"))), ()), 30)
    assert res.status == "pass"


def test_a_builder_that_raises_on_its_arguments_cannot_build(monkeypatch):
    """A builder given arguments it cannot take (a rule writing them in another order) raised
    out of the engine's match (verify printed its traceback as the rule's failure): it cannot
    build, as when it returns None, and the report keeps why."""
    import onnx.parser

    from dsl import RuleSet, check, parse
    from frontends.onnx import optimize_model
    from vocab import registry

    def raises(x):
        raise ValueError("cannot convert float NaN to integer")

    monkeypatch.setitem(
        registry.BUILDERS, "shape-of", registry.HostFn("shape-of", raises, ("term",), "builder")
    )
    text = "(simplify r (Relu (Relu @x)) (Reshape (Relu @x) (Constant :value_ints (shape-of @x))))"
    rules = RuleSet(tuple(check(parse(text, file="t.rules"))), ("t.rules",))
    model = onnx.parser.parse_model(
        """<ir_version: 10, opset_import: ["" : 18]>
        g (float[2, 3] x) => (float[2, 3] y) { r = Relu (x) y = Relu (r) }"""
    )
    _, report = optimize_model(model, rules)
    why = report.rejected["r"]
    assert why == {"shape-of (ValueError: cannot convert float NaN to integer) could not build": 1}
