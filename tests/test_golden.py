"""Golden cases per rule: a small ONNX graph (ONNX text syntax) -> the ops left after
optimizing with the shipped library. Negative cases (the rule must not fire) sit beside the
positive ones. Every case also checks the output under onnxruntime against the input model.
"""

import numpy as np
import onnx
import onnx.parser
import pytest

from dsl import load_rules, shipped_rules_dir
from frontends.onnx import compare, optimize_model

RULES = load_rules([shipped_rules_dir()])
R = ("exact", "reassoc")

# id, signature "inputs => outputs", initializers, body, expected ops in order, numeric classes
BN_INITS = (
    "float[2,2,1,1] w = {1.,2.,3.,4.}, float[2] s = {0.5, 2.}, float[2] bb = {0.1, 0.2}, "
    "float[2] m = {1., -1.}, float[2] v = {4., 0.25}"
)
CASES = [
    ("identity", "float[2,3] x => float[2,3] y", "", "t = Identity(x) y = Relu(t)", ["Relu"]),
    ("identity-output-kept", "float[2,3] x => float[2,3] y", "", "y = Identity(x)", ["Identity"]),
    (
        "dropout-inference",
        "float[2,3] x => float[2,3] y",
        "",
        "t = Dropout(x) y = Relu(t)",
        ["Relu"],
    ),
    (
        "transpose-transpose-cancel",
        "float[2,3,4] x => float[2,3,4] y",
        "",
        "a = Transpose<perm=[0,2,1]>(x) b = Transpose<perm=[0,2,1]>(a) y = Relu(b)",
        ["Relu"],
    ),
    (
        "transpose-transpose-merge",
        "float[2,3,4] x => float[4,3,2] y",
        "",
        "a = Transpose<perm=[1,0,2]>(x) b = Transpose<perm=[2,0,1]>(a) y = Relu(b)",
        ["Transpose", "Relu"],
    ),
    (
        "transpose-identity-perm",
        "float[2,3] x => float[2,3] y",
        "",
        "a = Transpose<perm=[0,1]>(x) y = Relu(a)",
        ["Relu"],
    ),
    (
        "no-transpose-real-perm",
        "float[2,3] x => float[3,2] y",
        "",
        "a = Transpose<perm=[1,0]>(x) y = Relu(a)",
        ["Transpose", "Relu"],
    ),
    (
        "reshape-reshape",
        "float[2,3,4] x => float[4,6] y",
        "int64[2] s1 = {6, 4}, int64[2] s2 = {4, 6}",
        "a = Reshape(x, s1) b = Reshape(a, s2) y = Relu(b)",
        ["Reshape", "Relu"],
    ),
    (
        "no-reshape-reshape-zero-dim",
        "float[2,3,4] x => float[6,2,2] y",
        "int64[2] s1 = {6, 4}, int64[3] s2 = {0, 2, 2}",
        "a = Reshape(x, s1) b = Reshape(a, s2) y = Relu(b)",
        ["Reshape", "Reshape", "Relu"],
    ),
    (
        "noop-reshape",
        "float[2,3] x => float[2,3] y",
        "int64[2] s = {2, 3}",
        "a = Reshape(x, s) y = Relu(a)",
        ["Relu"],
    ),
    (
        "noop-expand",
        "float[2,3] x => float[2,3] y",
        "int64[2] s = {2, 3}",
        "a = Expand(x, s) y = Relu(a)",
        ["Relu"],
    ),
    (
        "no-expand-that-grows",
        "float[1,3] x => float[2,3] y",
        "int64[2] s = {2, 3}",
        "a = Expand(x, s) y = Relu(a)",
        ["Expand", "Relu"],
    ),
    (
        "noop-slice",
        "float[2,3] x => float[2,3] y",
        "int64[1] st = {0}, int64[1] en = {3}, int64[1] ax = {1}",
        "a = Slice(x, st, en, ax) y = Relu(a)",
        ["Relu"],
    ),
    (
        "no-slice-reverse",
        "float[2,3] x => float[2,3] y",
        "int64[1] st = {-1}, int64[1] en = {-9}, int64[1] ax = {1}, int64[1] stp = {-1}",
        "a = Slice(x, st, en, ax, stp) y = Relu(a)",
        ["Slice", "Relu"],
    ),
    (
        "pad-zero",
        "float[2,3] x => float[2,3] y",
        "int64[4] p = {0, 0, 0, 0}",
        "a = Pad(x, p) y = Relu(a)",
        ["Relu"],
    ),
    (
        "no-pad-shift",
        "float[2,3] x => float[2,3] y",
        "int64[4] p = {0, 1, 0, -1}",
        "a = Pad(x, p) y = Relu(a)",
        ["Pad", "Relu"],
    ),
    (
        "cast-same-dtype",
        "float[2,3] x => float[2,3] y",
        "",
        "a = Cast<to=1>(x) y = Relu(a)",
        ["Relu"],
    ),
    (
        "cast-of-widening-cast",
        "float16[2,3] x => double[2,3] y",
        "",
        "a = Cast<to=1>(x) y = Cast<to=11>(a)",
        ["Cast"],
    ),
    (
        "no-cast-of-narrowing-cast",
        "float[2,3] x => float[2,3] y",
        "",
        "a = Cast<to=10>(x) b = Cast<to=1>(a) y = Relu(b)",
        ["Cast", "Cast", "Relu"],
    ),
    (
        "squeeze-unsqueeze",
        "float[2,3] x => float[2,3] y",
        "int64[1] ax = {1}",
        "a = Unsqueeze(x, ax) b = Squeeze(a, ax) y = Relu(b)",
        ["Relu"],
    ),
    (
        "add-zero",
        "float[2,3] x => float[2,3] y",
        "float[3] z = {-0.0, -0.0, -0.0}",
        "a = Add(z, x) y = Relu(a)",
        ["Relu"],
    ),
    (  # exact only with -0.0: -0.0 + +0.0 is +0.0 (add-zero-signed, reassoc, does this one)
        "no-exact-add-plus-zero",
        "float[2,3] x => float[2,3] y",
        "float[3] z = {0.0, 0.0, 0.0}",
        "a = Add(z, x) y = Relu(a)",
        ["Add", "Relu"],
    ),
    (
        "no-add-zero-that-broadcasts",
        "float[3] x => float[2,3] y",
        "float[2,3] z = {0.0, 0.0, 0.0, 0.0, 0.0, 0.0}",
        "a = Add(x, z) y = Relu(a)",
        ["Add", "Relu"],
    ),
    (
        "no-add-nonzero",
        "float[2,3] x => float[2,3] y",
        "float[1] z = {0.5}",
        "a = Add(x, z) y = Relu(a)",
        ["Add", "Relu"],
    ),
    (
        "mul-one",
        "float[2,3] x => float[2,3] y",
        "float[1] o = {1.0}",
        "a = Mul(x, o) y = Relu(a)",
        ["Relu"],
    ),
    (
        "div-one",
        "float[2,3] x => float[2,3] y",
        "float o = {1.0}",
        "a = Div(x, o) y = Relu(a)",
        ["Relu"],
    ),
    (
        "no-one-div-x",
        "float[2,3] x => float[2,3] y",
        "float o = {1.0}",
        "a = Div(o, x) y = Relu(a)",
        ["Reciprocal", "Relu"],
    ),
    ("neg-neg", "float[2,3] x => float[2,3] y", "", "a = Neg(x) b = Neg(a) y = Relu(b)", ["Relu"]),
    (
        "matmul-add-to-gemm",
        "float[2,3] x => float[2,4] y",
        "float[3,4] w = {1.,2.,3.,4.,5.,6.,7.,8.,9.,1.,2.,3.}, float[4] b = {1.,2.,3.,4.}",
        "m = MatMul(x, w) y = Add(m, b)",
        ["Gemm"],
    ),
    (
        "no-gemm-for-3d",
        "float[5,2,3] x => float[5,2,4] y",
        "float[3,4] w = {1.,2.,3.,4.,5.,6.,7.,8.,9.,1.,2.,3.}, float[4] b = {1.,2.,3.,4.}",
        "m = MatMul(x, w) y = Add(m, b)",
        ["MatMul", "Add"],
    ),
    (
        "no-gemm-when-matmul-shared",
        "float[2,3] x => float[2,4] y, float[2,4] m",
        "float[3,4] w = {1.,2.,3.,4.,5.,6.,7.,8.,9.,1.,2.,3.}, float[4] b = {1.,2.,3.,4.}",
        "m = MatMul(x, w) y = Add(m, b)",
        ["MatMul", "Add"],
    ),
    (
        "conv-add-bias",
        "float[1,2,4,4] x => float[1,2,4,4] y",
        "float[2,2,1,1] w = {1.,2.,3.,4.}, float[2,1,1] b = {0.5, -1.}",
        "c = Conv(x, w) y = Add(c, b)",
        ["Conv"],
    ),
    (
        "no-conv-add-non-channel-bias",
        "float[1,2,4,4] x => float[1,2,4,4] y",
        "float[2,2,1,1] w = {1.,2.,3.,4.}, float[4] b = {0.5, -1., 1., 2.}",
        "c = Conv(x, w) y = Add(c, b)",
        ["Conv", "Add"],
    ),
    (
        "fold-batchnorm-into-conv",
        "float[1,2,4,4] x => float[1,2,4,4] y",
        BN_INITS,
        "c = Conv(x, w) y = BatchNormalization<epsilon=0.001>(c, s, bb, m, v)",
        ["Conv"],
        R,
    ),
    (
        "no-batchnorm-fold-without-reassoc",
        "float[1,2,4,4] x => float[1,2,4,4] y",
        BN_INITS,
        "c = Conv(x, w) y = BatchNormalization<epsilon=0.001>(c, s, bb, m, v)",
        ["Conv", "BatchNormalization"],
    ),
    (
        "no-batchnorm-fold-strided-conv-attrs-kept",
        "float[1,2,4,4] x => float[1,2,2,2] y",
        BN_INITS,
        "c = Conv<strides=[2,2]>(x, w) y = BatchNormalization(c, s, bb, m, v)",
        ["Conv"],
        R,
    ),
    (
        "opaque-op-passes-through",
        "float[2,3] x => float[2,3] y",
        "",
        "a = Identity(x) b = CustomOp<alpha=1.0>(a) y = Identity(b)",
        ["CustomOp", "Identity"],
    ),
]


def _model(sig: str, inits: str, body: str) -> onnx.ModelProto:
    ins, outs = (s.strip() for s in sig.split("=>"))
    init_text = f" <{inits}>" if inits else ""
    head = '<ir_version: 10, opset_import: ["" : 18, "custom" : 1]>'
    text = f"{head} g ({ins}) => ({outs}){init_text} {{ {body} }}"
    model = onnx.parser.parse_model(text)
    for n in model.graph.node:
        if n.op_type == "CustomOp":
            n.domain = "custom"
    return model


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_golden(case):
    name, sig, inits, body, expected, *fp = case
    model = _model(sig, inits, body)
    result, report = optimize_model(model, RULES, fp=fp[0] if fp else ("exact",))
    assert [n.op_type for n in result.graph.node] == expected, report.fired
    onnx.checker.check_model(result, full_check=True)
    if any(n.domain == "custom" for n in model.graph.node):
        return  # onnxruntime has no kernel for the made-up custom op
    diffs = compare(model, result, fp=report.fp)
    assert all(d.ok for d in diffs), diffs


def test_strided_conv_keeps_its_attributes():
    _, sig, inits, body, *_ = next(
        c for c in CASES if c[0] == "no-batchnorm-fold-strided-conv-attrs-kept"
    )
    result, _ = optimize_model(_model(sig, inits, body), RULES, fp=R)
    conv = result.graph.node[0]
    assert {a.name: list(a.ints) for a in conv.attribute} == {"strides": [2, 2]}


def test_nothing_cheaper_returns_the_input_unchanged():
    model = _model("float[2,3] x => float[2,3] y", "", "y = Relu(x)")
    result, report = optimize_model(model, RULES)
    assert result is model and not report.changed and report.stop_reason == "saturated"


def test_untouched_nodes_keep_names_and_metadata():
    model = _model("float[2,3] x => float[2,3] y", "", "t = Identity(x) a = Relu(t) y = Sigmoid(a)")
    model.graph.node[1].name = "my_relu"
    model.graph.node[1].doc_string = "keep me"
    result, _ = optimize_model(model, RULES)
    relu = result.graph.node[0]
    assert (relu.name, relu.doc_string, list(relu.output)) == ("my_relu", "keep me", ["a"])


def test_folded_weights_are_computed():
    _, sig, inits, body, *_ = next(c for c in CASES if c[0] == "fold-batchnorm-into-conv")
    result, _ = optimize_model(_model(sig, inits, body), RULES, fp=R)
    w = next(
        onnx.numpy_helper.to_array(i) for i in result.graph.initializer if i.dims == [2, 2, 1, 1]
    )
    k = np.array([0.5, 2.0]) / np.sqrt(np.array([4.0, 0.25]) + 0.001)
    np.testing.assert_allclose(w.reshape(2, 2), np.array([[1, 2], [3, 4]]) * k[:, None], rtol=1e-6)


def test_subgraph_op_is_opaque_and_survives():
    from onnx import TensorProto, helper

    then = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["t"])],
        "then",
        [],
        [helper.make_tensor_value_info("t", TensorProto.FLOAT, [2, 3])],
    )
    other = helper.make_graph(
        [helper.make_node("Neg", ["x"], ["e"])],
        "else",
        [],
        [helper.make_tensor_value_info("e", TensorProto.FLOAT, [2, 3])],
    )
    nodes = [
        helper.make_node("Identity", ["x"], ["x1"]),
        helper.make_node("If", ["c"], ["r"], then_branch=then, else_branch=other),
        helper.make_node("Relu", ["r"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3]),
            helper.make_tensor_value_info("c", TensorProto.BOOL, []),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 10
    result, report = optimize_model(model, RULES)
    assert [n.op_type for n in result.graph.node] == ["If", "Relu"]  # the dead Identity is gone
    assert result.graph.node[0].attribute == model.graph.node[1].attribute  # subgraphs untouched
    assert all(d.ok for d in compare(model, result))


@pytest.mark.parametrize(
    "defs",
    ["x0 = Identity(x) x1 = Relu(x0)", "x0 = Relu(x) x1 = Identity(x0)"],
    ids=["kept", "renamed-by-rewrite"],
)
def test_values_read_by_subgraphs_are_kept(defs):
    """x1 is read only inside the If's branch (by name): it must survive, under its name."""
    text = f"""<ir_version: 10, opset_import: ["" : 18]>
    g (float[2,3] x, bool c) => (float[2,3] y) {{
      {defs}
      r = If(c) <then_branch = g1 () => (float[2,3] t) {{ t = Identity(x1) }},
                 else_branch = g2 () => (float[2,3] e) {{ e = Neg(x1) }}>
      y = Relu(r)
    }}"""
    model = onnx.parser.parse_model(text)
    result, _ = optimize_model(model, RULES)
    onnx.checker.check_model(result, full_check=True)
    assert "x1" in {o for n in result.graph.node for o in n.output}
    assert all(d.ok for d in compare(model, result))
