"""Multi-root rules (`(roots ...)` on both sides): checking, matching distinct roots once per
set, joint extraction of their results, and the shipped Q/K/V packing rule."""

from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import dsl
from frontends.onnx import optimize_model
from verify.runner import verify_rules

PACKING = Path(__file__).resolve().parent.parent / "examples" / "packing.rules"
LIBRARY = dsl.load_rules([dsl.shipped_rules_dir(), PACKING])


def _rules(text: str):
    return dsl.check(dsl.parse(text, file="t.rules"))


@pytest.mark.parametrize(
    "text, message",
    [
        ("(simplify a (roots (Relu @x) (Neg @x)) (Relu @x))", "needs 2 results"),
        ("(simplify a (Relu @x) (roots (Relu @x) (Neg @x)))", "needs a pattern of several"),
        ("(simplify a (roots (Relu @x) (Neg @x)) (roots @x @x @x))", "needs 2 results, got 3"),
        ("(simplify a (roots (Relu @x) @y) (roots @x @x))", "must be an operator application"),
    ],
)
def test_misused_roots_are_located_errors(text, message):
    with pytest.raises(dsl.RulesError) as info:
        _rules(text)
    assert message in str(info.value)
    assert str(info.value).startswith("t.rules:1:")


def test_a_multi_root_rule_binds_its_other_roots():
    (rule,) = _rules("(simplify a (roots (Relu @x) (Neg@n @x) (Abs @x)) (roots @x @n @x))")
    assert [t.bind for t in rule.roots] == ["n", "_root2"]
    assert rule.needs_host and rule.lhs_ops == {"Relu", "Neg", "Abs"}
    assert len(rule.pairs) == 3


def _qkv_model(rows: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    d = 64
    inits = [
        numpy_helper.from_array((rng.standard_normal((d, d)) * 0.1).astype(np.float32), f"w{i}")
        for i in range(3)
    ]
    inits += [numpy_helper.from_array(rng.standard_normal(d).astype(np.float32), "bias")]
    nodes = [helper.make_node("MatMul", ["x", f"w{i}"], [f"m{i}"]) for i in range(3)]
    nodes += [
        helper.make_node("Mul", ["m0", "m1"], ["qk"]),
        helper.make_node("Add", ["qk", "m2"], ["s"]),
        helper.make_node("Add", ["s", "bias"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "qkv",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, (1, rows, d))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, (1, rows, d))],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)


def _run(model, x):
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, {"x": x})[0]


def _ops(model):
    return sorted(n.op_type for n in model.graph.node)


def test_three_matmuls_of_one_input_are_packed_when_the_cost_model_says_it_pays():
    model = _qkv_model(rows=1)
    out, report = optimize_model(model, LIBRARY)
    assert report.fired["pack-three-matmuls"] == 1  # one set of roots, not 6 permutations
    assert _ops(out) == ["Add", "Add", "MatMul", "Mul", "Split"]
    assert report.cost_after < report.cost_before
    packed = next(i for i in out.graph.initializer if tuple(i.dims) == (64, 192))
    assert packed is not None
    x = np.random.default_rng(1).standard_normal((1, 1, 64)).astype(np.float32)
    want = _run(model, x)
    assert np.ptp(want) > 0.1
    np.testing.assert_allclose(_run(out, x), want, rtol=1e-5, atol=1e-5)


def test_packing_that_does_not_pay_is_not_extracted():
    # 512 rows: the cost model prices the Split's copy above the two nodes it saves
    model = _qkv_model(rows=512)
    out, report = optimize_model(model, LIBRARY)
    assert report.fired["pack-three-matmuls"] == 1
    assert _ops(out).count("MatMul") == 3 and "Split" not in _ops(out)


def test_roots_that_are_one_value_are_not_packed():
    model = _qkv_model(rows=1)
    for n in model.graph.node[:3]:
        n.input[1] = "w0"  # three MatMuls by one weight: one value in the e-graph
    out, report = optimize_model(model, LIBRARY)
    assert "pack-three-matmuls" not in report.fired
    assert "Split" not in _ops(out)


def test_the_packing_rule_verifies():
    rules = dsl.RuleSet(
        tuple(r for r in LIBRARY.rules if r.name == "pack-three-matmuls"), LIBRARY.files
    )
    (result,) = verify_rules(rules, examples=30)
    assert result.status == "pass" and result.examples >= 30
