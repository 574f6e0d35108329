"""Rules over onnxruntime's contrib ops (`com.microsoft`) are verified against onnxruntime's
kernels: their type constraints come from onnxruntime's schemas, the models `verify` builds
import the domain, and the side with a contrib op runs on onnxruntime (onnx.reference has no
kernel for it)."""

import dsl
from verify.runner import verify_rules


def _verify(text: str, examples: int = 30):
    rules = dsl.RuleSet(tuple(dsl.check(dsl.parse(text, "t.rules"))), ("t.rules",))
    return verify_rules(rules, examples=examples)


def test_a_rule_writing_a_contrib_op_is_compared_on_its_kernel():
    (res,) = _verify(
        "(ruleset ort :domain com.microsoft)"
        "(simplify gelu-as-contrib-kernel :fp approx"
        "  (Gelu @x) (if (has-dtype @x 1)) (com.microsoft.Gelu @x))"
    )
    assert res.status == "pass" and res.examples >= 30
    assert any("com.microsoft" in note for note in res.notes)  # not on onnx.reference


def test_a_rule_matching_a_contrib_op_draws_it():
    (res,) = _verify(
        "(ruleset from-ort :opset 20)"
        "(simplify contrib-gelu-as-gelu :fp approx (com.microsoft.Gelu @x) (Gelu @x))"
    )
    assert res.status == "pass" and res.examples >= 30


def test_a_contrib_op_with_other_numbers_is_refused():
    # QuickGelu is x * sigmoid(1.702 x), not the exact Gelu: wrong as an exact rule
    (res,) = _verify(
        "(ruleset ort :domain com.microsoft)"
        "(simplify gelu-as-quick-gelu (Gelu @x) (if (has-dtype @x 1))"
        "  (com.microsoft.QuickGelu @x))"
    )
    assert res.status == "FAIL"
    assert "two sides differ" in res.failure.reason


def test_a_contrib_op_without_its_dtype_guard_is_refused():
    # com.microsoft.Gelu's schema allows float64, onnxruntime has no kernel for it: without a
    # dtype guard the rewritten model would not run
    (res,) = _verify(
        "(ruleset ort :domain com.microsoft)"
        "(simplify gelu-as-contrib-kernel :fp approx (Gelu @x) (com.microsoft.Gelu @x))"
    )
    assert res.status == "FAIL"
