"""`engine.optimize.reachable`: only rules that can match a graph are compiled into egglog."""

import numpy as np
import onnx.parser
from onnx.reference import ReferenceEvaluator

from dsl import load_rules
from engine.optimize import reachable
from frontends.onnx import optimize_model

RULES = """
(ruleset test)

;; Neg(Neg(x)) -> x
(simplify neg-neg (Neg (Neg @x)) @x)

;; Abs(x) -> Relu(x) + Relu(-x), a rule that adds Relu and Neg
(simplify abs-split (Abs @x) (Add (Relu @x) (Relu (Neg @x))))

;; Relu(Relu(x)) -> Relu(x)
(simplify relu-relu (Relu (Relu @x)) (Relu @x))

;; Exp(Log(x)) <-> Log(Exp(x)), both ways
(equal exp-log (Exp (Log @x)) (Log (Exp @x)))
"""


def _rules(tmp_path):
    path = tmp_path / "t.rules"
    path.write_text(RULES)
    return load_rules([path]).rules


def _names(rules, ops):
    return [r.name for r in reachable(list(rules), set(ops))]


def test_rule_without_its_ops_is_left_out(tmp_path):
    rules = _rules(tmp_path)
    assert _names(rules, {"Neg"}) == ["neg-neg"]
    assert _names(rules, {"Sigmoid"}) == []


def test_ops_added_by_a_rule_make_others_reachable(tmp_path):
    """Abs brings Relu and Neg in, so the Relu and Neg rules can match what it builds."""
    rules = _rules(tmp_path)
    assert _names(rules, {"Abs"}) == ["neg-neg", "abs-split", "relu-relu"]


def test_equal_rule_either_side(tmp_path):
    rules = _rules(tmp_path)
    assert _names(rules, {"Log", "Exp"}) == ["exp-log"]
    assert _names(rules, {"Log"}) == []


def test_rule_enabled_by_another_still_fires(tmp_path):
    """End to end: relu-relu matches only once neg-neg has removed the Negs between the two
    Relus; both are compiled, and the rules whose ops are absent are not."""
    path = tmp_path / "t.rules"
    path.write_text(RULES)
    rules = load_rules([path])
    model = onnx.parser.parse_model(
        '<ir_version: 10, opset_import: ["" : 18]> g (float[3] x) => (float[3] y) '
        "{ a = Relu(x) n = Neg(a) m = Neg(n) y = Relu(m) }"
    )
    result, report = optimize_model(model, rules)
    assert [n.op_type for n in result.graph.node] == ["Relu"]
    assert set(report.fired) == {"neg-neg", "relu-relu"}
    x = np.array([-1.0, 0.0, 2.0], dtype=np.float32)
    np.testing.assert_array_equal(
        ReferenceEvaluator(result).run(None, {"x": x})[0], np.maximum(x, 0)
    )
