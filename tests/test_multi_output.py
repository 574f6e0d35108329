"""Multi-output ops (`vocab.ops`: output K of an op is the projection `Op#K`): the importer
makes one term per output read, rules match and write projections, and the exporter writes
the projections of one application as one node that onnxruntime runs."""

import dataclasses

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from dsl import check, load_rules, parse, shipped_rules_dir
from dsl.ir import RuleSet
from frontends.onnx import optimize_model
from frontends.onnx.check import run
from frontends.onnx.exporter import merge_projections
from frontends.onnx.importer import import_model
from vocab.types import TensorType

RULES = load_rules([shipped_rules_dir()])


def _model(nodes, inputs, outputs, inits=(), opset=18):
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 10
    return m


def _info(name, shape):
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)


def _rules(text: str) -> RuleSet:
    return RuleSet(tuple(check(parse(text, "t.rules"))), ("t.rules",))


def _split_model():
    """x -> Split into 3 along axis 1 -> Relu(Relu(each)): the idempotent-relu rule fires on
    every output, and the Split must come back as one node with three outputs."""
    nodes = [helper.make_node("Split", ["x"], ["a", "b", "c"], axis=1, num_outputs=3)]
    for o in "abc":
        nodes += [
            helper.make_node("Relu", [o], [f"{o}1"]),
            helper.make_node("Relu", [f"{o}1"], [f"{o}2"]),
        ]
    outs = [_info(f"{o}2", [2, 2]) for o in "abc"]
    return _model(nodes, [_info("x", [2, 6])], outs)


def test_each_output_read_is_a_term():
    g = import_model(_split_model())
    split = [n for n in g.nodes if n.op.startswith("Split")]
    assert [n.op for n in split] == ["Split", "Split#1", "Split#2"]
    assert not any(n.opaque for n in split) and len({n.inputs for n in split}) == 1


def test_projections_of_one_application_export_as_one_node():
    model = _split_model()
    out, report = optimize_model(model, RULES)
    assert "idempotent-relu" in report.fired  # (fired counts matches over iterations)
    splits = [n for n in out.graph.node if n.op_type == "Split"]
    assert len(splits) == 1 and len(splits[0].output) == 3
    assert [n.op_type for n in out.graph.node].count("Relu") == 3
    x = np.random.default_rng(0).standard_normal((2, 6)).astype(np.float32)
    for got, want in zip(run(out, {"x": x}), run(model, {"x": x})):
        np.testing.assert_array_equal(got, want)


def test_a_rule_matches_and_writes_a_projection():
    """Split#1 of a Concat of two equal-shaped halves is the second half; the first output
    is not read, so the optimized model has no Split at all."""
    rules = _rules(
        "(simplify split-concat-second (Split#1 (Concat @a @b :axis @k) :axis @k :num_outputs 2)"
        " (if (same-type @a @b)) @b)"
    )
    nodes = [
        helper.make_node("Concat", ["a", "b"], ["c"], axis=0),
        helper.make_node("Split", ["c"], ["", "s1"], axis=0, num_outputs=2),
        helper.make_node("Relu", ["s1"], ["y"]),
    ]
    model = _model(nodes, [_info("a", [2, 3]), _info("b", [2, 3])], [_info("y", [2, 3])])
    out, report = optimize_model(model, rules)
    assert report.fired == {"split-concat-second": 1}
    assert [n.op_type for n in out.graph.node] == ["Relu"] and out.graph.node[0].input[0] == "b"


def test_an_unread_optional_output_stays_absent():
    """LayerNormalization with its Mean read: two terms, one node, InvStdDev absent."""
    inits = [
        numpy_helper.from_array(np.linspace(0.5, 1.5, 4).astype(np.float32), "w"),
        numpy_helper.from_array(np.linspace(-1, 1, 4).astype(np.float32), "b"),
    ]
    nodes = [
        helper.make_node("LayerNormalization", ["x", "w", "b"], ["y", "mean"], axis=-1),
        helper.make_node("Identity", ["y"], ["y1"]),
        helper.make_node("Identity", ["mean"], ["m1"]),
    ]
    model = _model(nodes, [_info("x", [3, 4])], [_info("y1", [3, 4]), _info("m1", [3, 1])], inits)
    assert [n.op for n in import_model(model).nodes][:2] == [
        "LayerNormalization",
        "LayerNormalization#1",
    ]
    out, _ = optimize_model(model, RULES)
    ln = [n for n in out.graph.node if n.op_type == "LayerNormalization"]
    assert len(ln) == 1 and len(ln[0].output) == 2 and all(ln[0].output)
    x = np.random.default_rng(1).standard_normal((3, 4)).astype(np.float32)
    for got, want in zip(run(out, {"x": x}), run(model, {"x": x})):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def test_merge_keeps_nodes_that_would_write_one_position_twice():
    a = helper.make_node("Split", ["x"], ["p", ""], axis=0, num_outputs=2)
    b = helper.make_node("Split", ["x"], ["q", ""], axis=0, num_outputs=2)
    c = helper.make_node("Split", ["x"], ["", "r"], axis=0, num_outputs=2)
    merged = merge_projections([a, b, c])
    assert len(merged) == 3  # p and q both at position 0: the group stays as it was
    merged = merge_projections([a, c])
    assert len(merged) == 1 and list(merged[0].output) == ["p", "r"]
    onnx.checker.check_node(merged[0])


def test_shape_analysis_gives_every_projection_its_shape():
    """Found on GPT-2 (TorchScript): once Split was a term per output, the symbolic analysis
    gave its outputs no shape (it expected one node with three outputs), the shape
    computations after it stayed, and the optimized model had 125 more nodes."""
    from engine.shapes import analyze

    nodes = [
        helper.make_node("Split", ["x"], ["a", "b", "c"], axis=1, num_outputs=3),
        helper.make_node("Relu", ["a"], ["ya"]),
        helper.make_node("Relu", ["b"], ["yb"]),
        helper.make_node("Relu", ["c"], ["yc"]),
    ]
    model = _model(nodes, [_info("x", ["n", 7])], [_info(f"y{o}", None) for o in "abc"])
    g = import_model(model)
    # as after a Reshape whose target only the analysis computes: ONNX inference left the
    # outputs' types unknown, so their shapes must come from the analysis itself
    split_outs = {n.outputs[0] for n in g.nodes if n.op.startswith("Split")}
    values = tuple(
        dataclasses.replace(v, type=TensorType()) if i in split_outs else v
        for i, v in enumerate(g.values)
    )
    a = analyze(dataclasses.replace(g, values=values))
    shapes = {n.op: a.shapes.get(n.outputs[0]) for n in g.nodes if n.op.startswith("Split")}
    assert {k: [str(d) for d in v] for k, v in shapes.items()} == {
        "Split": ["n", "3"],
        "Split#1": ["n", "3"],
        "Split#2": ["n", "1"],  # 7 in chunks of 3: the last is smaller (ONNX Split-18)
    }
