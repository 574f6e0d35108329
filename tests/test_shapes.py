"""Symbolic shape analysis and shape folding (engine.shapes): each folding checked on a small
ONNX graph with symbolic dimensions, at two input sizes against the original."""

import numpy as np
import onnx
import onnx.parser
import pytest
import sympy

from dsl import check, parse
from engine.shapes import analyze, fold_shapes
from frontends.onnx import export_model, import_model
from frontends.onnx.check import run
from vocab.ops import FAMILIES, OPS
from vocab.shape_registry import shape_rule
from vocab.shape_rules import RULES, rule_kind, rule_of
from vocab.symbolic import broadcast, simplify, symbol


def _model(text: str) -> onnx.ModelProto:
    m = onnx.parser.parse_model(text)
    onnx.checker.check_model(m, full_check=True)
    return m


def _fold(m):
    g = import_model(m)
    out, stats = fold_shapes(g)
    return export_model(out), stats


def _same_at(m, folded, shapes):
    """Run both models at each input shape (dict name -> shape) and compare exactly."""
    rng = np.random.default_rng(0)
    for shape in shapes:
        feeds = {k: rng.standard_normal(s).astype(np.float32) for k, s in shape.items()}
        want, got = run(m, feeds), run(folded, feeds)
        assert len(want) == len(got)
        for a, b in zip(want, got):
            assert a.shape == b.shape and np.array_equal(a, b)


HEADS = """<ir_version: 10, opset_import: ["" : 17]>
g (float[B, S, 8] x) => (float[B, 2, S, 4] y) {
  s = Shape(x)
  i0 = Constant<value = int64[1] {0}>()
  i1 = Constant<value = int64[1] {1}>()
  b = Gather<axis = 0>(s, i0)
  q = Gather<axis = 0>(s, i1)
  h = Constant<value = int64[1] {2}>()
  d = Constant<value = int64[1] {4}>()
  t = Concat<axis = 0>(b, q, h, d)
  r = Reshape(x, t)
  y = Transpose<perm = [0, 2, 1, 3]>(r)
}"""


def test_reshape_target_from_own_dims_becomes_constant():
    m = _model(HEADS)
    folded, stats = _fold(m)
    assert stats.reshape_targets == 1
    ops = [n.op_type for n in folded.graph.node]
    assert ops == ["Reshape", "Transpose"]  # Shape, Gather, Concat are gone
    target = {i.name: onnx.numpy_helper.to_array(i) for i in folded.graph.initializer}
    assert [list(v) for v in target.values()] == [[0, 0, 2, 4]]
    _same_at(m, folded, [{"x": (2, 5, 8)}, {"x": (3, 1, 8)}])


def test_expand_to_own_shape_disappears():
    m = _model("""<ir_version: 10, opset_import: ["" : 17]>
g (float[B, S] x) => (float[B, S] y) {
  s = Shape(x)
  e = Expand(x, s)
  y = Relu(e)
}""")
    folded, stats = _fold(m)
    assert stats.noops == 1 and [n.op_type for n in folded.graph.node] == ["Relu"]
    _same_at(m, folded, [{"x": (2, 3)}, {"x": (4, 1)}])


def test_concat_of_one_input_and_split_into_one_output_disappear():
    m = _model("""<ir_version: 10, opset_import: ["" : 18]>
g (float[B, S] x) => (float[B, S] y) {
  c = Concat<axis = 1>(x)
  p = Split<axis = 0, num_outputs = 1>(c)
  r = Relu(p)
  y = Concat<axis = 0>(r)
}""")
    folded, stats = _fold(m)
    assert stats.noops == 3
    # the output's Concat went away: the Relu writes the output under its name, no Identity
    assert [(n.op_type, list(n.input), list(n.output)) for n in folded.graph.node] == [
        ("Relu", ["x"], ["y"])
    ]
    _same_at(m, folded, [{"x": (2, 3)}, {"x": (4, 1)}])


def test_static_dims_of_a_dynamic_shape_fold():
    # the batch is symbolic, the spatial dims are not: H // 4 and (4 - H % 4) % 4 are numbers
    m = _model("""<ir_version: 10, opset_import: ["" : 17]>
g (float[B, 16, 16, 8] x) => (int64[2] y) {
  i0 = Constant<value = int64[1] {0}>()
  i1 = Constant<value = int64 {1}>()
  four = Constant<value = int64 {4}>()
  s = Shape(x)
  h = Gather<axis = 0>(s, i1)
  q = Div(h, four)
  m = Mod(h, four)
  p = Sub(four, m)
  pm = Mod(p, four)
  a = Unsqueeze(q, i0)
  c = Unsqueeze(pm, i0)
  y = Concat<axis = 0>(a, c)
}""")
    folded, stats = _fold(m)
    assert stats.constants >= 1
    (init,) = folded.graph.initializer
    assert list(onnx.numpy_helper.to_array(init)) == [4, 0]
    assert list(folded.graph.node) == []  # the output is the constant itself, same name


def test_symbolic_arithmetic():
    b, s = symbol("B"), symbol("S")
    assert broadcast([(b, sympy.Integer(1)), (sympy.Integer(1), s)]) == (b, s)
    assert broadcast([(b,), (s,)]) == (None,)  # either may be 1
    assert broadcast([(b,), (sympy.Integer(3),)]) == (sympy.Integer(3),)
    m = _model("""<ir_version: 10, opset_import: ["" : 17]>
g (float[B, S] x) => (int64[1] y) {
  one = Constant<value = int64[1] {1}>()
  two = Constant<value = int64[1] {2}>()
  s = Shape(x)
  y = Slice(s, one, two)
}""")
    g = import_model(m)
    a = analyze(g)
    y = next(i for i, v in enumerate(g.values) if v.name == "y")
    assert a.values[y].elems == (s,) and not a.values[y].known


def test_reversing_slice_is_not_a_noop():
    m = _model("""<ir_version: 10, opset_import: ["" : 17]>
g (float[B, 4] x) => (float[B, 4] y) {
  st = Constant<value = int64[1] {-1}>()
  en = Constant<value = int64[1] {-9223372036854775807}>()
  ax = Constant<value = int64[1] {1}>()
  sp = Constant<value = int64[1] {-1}>()
  y = Slice(x, st, en, ax, sp)
}""")
    folded, stats = _fold(m)
    assert stats.noops == 0 and [n.op_type for n in folded.graph.node] == ["Slice"]
    _same_at(m, folded, [{"x": (2, 4)}])


@pytest.mark.parametrize("allowzero", [0, 1])
def test_reshape_target_with_or_without_allowzero(allowzero):
    # allowzero=1 with no literal 0 in the target means the same as allowzero=0
    m = _model(HEADS.replace("r = Reshape(x, t)", f"r = Reshape<allowzero = {allowzero}>(x, t)"))
    folded, stats = _fold(m)
    (init,) = folded.graph.initializer
    assert list(onnx.numpy_helper.to_array(init)) == [0, 0, 2, 4]
    (reshape,) = [n for n in folded.graph.node if n.op_type == "Reshape"]
    assert all(a.i == 0 for a in reshape.attribute if a.name == "allowzero")
    _same_at(m, folded, [{"x": (2, 5, 8)}, {"x": (1, 3, 8)}])


def test_allowzero_target_without_zero_switches_to_copying_zeros():
    # the dynamo exporter writes allowzero=1; with no literal 0 in the target it means the
    # same as allowzero=0, which can then copy the input's dims: [B*S, 8] -> [B, S, 2, 4]
    m = _model(
        HEADS.replace("r = Reshape(x, t)", "r = Reshape<allowzero = 1>(x, t)").replace(
            "h = Constant<value = int64[1] {2}>()", "h = Constant<value = int64[1] {-1}>()"
        )
    )
    folded, stats = _fold(m)
    assert stats.reshape_targets == 1
    (init,) = folded.graph.initializer
    assert list(onnx.numpy_helper.to_array(init)) == [0, 0, -1, 4]
    (reshape,) = [n for n in folded.graph.node if n.op_type == "Reshape"]
    assert all(a.i == 0 for a in reshape.attribute if a.name == "allowzero")
    _same_at(m, folded, [{"x": (2, 5, 8)}, {"x": (1, 3, 8)}])


def test_integer_overflow_is_not_folded_as_a_mathematical_value():
    m = _model("""<ir_version: 10, opset_import: ["" : 17]>
g (float[3] x) => (int32[1] y) {
  big = Constant<value = int32[1] {2147483647}>()
  s = Shape(x)
  s32 = Cast<to = 6>(s)
  y = Add(s32, big)
}""")
    g = import_model(m)
    a = analyze(g)
    y = next(i for i, v in enumerate(g.values) if v.name == "y")
    assert y not in a.values  # 3 + 2^31-1 wraps in int32: not a value the analysis may claim
    folded, _ = _fold(m)
    _same_at(m, folded, [{"x": (3,)}])


# ---- the registry of shape rules (vocab.shape_rules) -----------------------------------------


def test_shape_rules_are_registered_by_family_and_name():
    # every rule names an op of the table (onnxruntime's default-domain fused op excepted)
    # (OPS.get loads onnxruntime's contrib ops on first use; OPS.names() lists them only after)
    assert {op for op in RULES if OPS.get(op) is None} == {"SimplifiedLayerNormalization"}
    for family in ("SAME_SHAPE", "BROADCASTING", "REDUCTION"):
        assert all(rule_of(op).shape is not None for op in FAMILIES[family]), family
    assert all(rule_of(op).type is not None for op in FAMILIES["SAME_TYPE"])
    shape_ops = "Shape Size Gather Slice Concat Unsqueeze Squeeze Reshape Flatten Transpose Range"
    assert all(rule_of(op).value is not None for op in shape_ops.split())
    assert rule_of("Split#1") is rule_of("Split") and rule_of("LayerNormalization#1") is None


def test_rule_kind_says_whether_an_op_has_its_own_shape_rule():
    assert [rule_kind(op) for op in ("Add", "Cast", "Reshape", "PRelu", "Split#1", "Conv")] == [
        "direct",
        "direct",
        "symbolic",
        "symbolic",
        "symbolic",
        "onnx",
    ]
    # onnxruntime's contrib elementwise ops have the same-type rule; its other ops have none
    assert rule_kind("com.microsoft.Gelu") == "direct"
    assert rule_kind("com.microsoft.Attention") == "onnx"


def test_an_op_has_one_shape_rule():
    with pytest.raises(ValueError, match="two shape rules for Reshape"):
        shape_rule("Reshape")(lambda c: None)


def test_simplify_skips_only_what_sympy_returns_as_it_is():
    """`vocab.symbolic.simplify` skips sympy for monomials (with division) and a monomial
    plus an integer: for those, `sympy.simplify` gives the same expression back; the rest
    still go to it."""
    a, b, c = sympy.symbols("a b c", positive=True, integer=True)
    skipped = [a, sympy.Integer(64), 197 * a, a * b**2, 64 * a * b / c, a * b / c, a / c**2, a + 1]
    for e in skipped:
        assert simplify(e) is e
        assert sympy.simplify(e) == e
    assert simplify(a / c + 1) == sympy.simplify(a / c + 1)
    assert simplify(a * b / (a * c)) == b / c
    assert simplify((a * b + a) / a) == b + 1


def test_a_broadcast_of_two_symbols_loses_only_that_dimension():
    """Attention scores [B, H, 2S, S] plus a mask [B, 1, 1, T] whose sequence symbol T is not
    S (an exporter's own name for it): either may be 1, so the last axis gets a symbol of its
    own, and the batch, head and query axes stay known (they used to be lost with it). The
    scores come from a Reshape to [B, 4, -1, S], whose third dimension ONNX shape inference
    does not know and the analysis does (2S)."""
    m = _model(
        """<ir_version: 10, opset_import: ["" : 17]>
        g (float[B, 8, S, S] x, float[B, 1, 1, T] mask) => (float[B, 4, N, M] y) {
          s = Shape(x)
          i0 = Constant<value = int64[1] {0}>()
          i1 = Constant<value = int64[1] {1}>()
          i3 = Constant<value = int64[1] {3}>()
          i4 = Constant<value = int64[1] {4}>()
          rest = Constant<value = int64[1] {-1}>()
          b = Slice(s, i0, i1)
          last = Slice(s, i3, i4)
          t = Concat<axis = 0>(b, i4, rest, last)
          scores = Reshape(x, t)
          a = Add(scores, mask)
          y = Softmax<axis = -1>(a)
        }"""
    )
    g = import_model(m)
    a = analyze(g)
    b, s, t = symbol("B"), symbol("S"), symbol("T")
    shape = a.shapes[g.outputs[0]]
    assert shape[:3] == (b, sympy.Integer(4), 2 * s)
    assert shape[3] not in (s, t) and not shape[3].is_number


def test_a_declared_op_keeps_the_symbolic_shape_its_body_gives():
    """A declared op (`vocab.declared`) is followed through its body's shape rules: a
    com.acme.Swish of x[B, S, 8] is [B, S, 8] symbolically, so a Reshape of its output to
    its own dims folds, where ONNX shape inference gives the op's output fresh dimensions."""
    check(parse("(op com.acme.Swish (@x) :cost elementwise (Mul @x (Sigmoid @x)))", "a.rules"))
    m = onnx.parser.parse_model(
        """<ir_version: 10, opset_import: ["" : 17, "com.acme" : 1]>
        g (float[B, S, 8] x) => (float[B, S, 8] y) {
          w = com.acme.Swish(x)
          s = Shape(w)
          y = Reshape(x, s)
        }"""
    )
    g = import_model(m)
    a = analyze(g)
    swish = next(n for n in g.nodes if "Swish" in n.op)
    assert a.shapes[swish.outputs[0]] == (symbol("B"), symbol("S"), sympy.Integer(8))
    out, stats = fold_shapes(g)
    assert stats.noops == 1  # the Reshape of x to Swish(x)'s shape is x


def test_gather_elements_and_scatter_shapes_follow_the_spec():
    """GatherElements has its indices' shape, ScatterElements and ScatterND their data's
    (ONNX spec). Without rules of their own these ops took the type the model declared, a
    fresh symbol per dimension in a TorchScript export, so a Shape of them stayed unknown
    once --input-shape fixed the inputs (BERT at batch 1: 106 nodes left against 74)."""
    m = _model("""<ir_version: 10, opset_import: ["" : 17]>
g (float[B, 8] x, int64[B, 4] i, float[B, 4] u, int64[B, 1] k) => (int64[6] y) {
  e = GatherElements<axis = 1>(x, i)
  se = ScatterElements<axis = 1>(x, i, u)
  sn = ScatterND(x, k, x)
  a = Shape(e)
  b = Shape(se)
  c = Shape(sn)
  y = Concat<axis = 0>(a, b, c)
}""")
    # the exporter's declarations: a symbol of its own for each dimension
    for name, rank in (("e", 2), ("se", 2), ("sn", 2)):
        dims = [f"{name}_dim_{k}" for k in range(rank)]
        m.graph.value_info.append(onnx.helper.make_tensor_value_info(name, 1, dims))
    g = import_model(m)
    a = analyze(g)
    by_name = {v.name: vid for vid, v in enumerate(g.values)}
    b = symbol("B")
    assert a.shapes[by_name["e"]] == (b, 4)
    assert a.shapes[by_name["se"]] == (b, 8) and a.shapes[by_name["sn"]] == (b, 8)
    assert [str(d) for d in a.values[by_name["y"]].elems] == ["B", "4", "B", "8", "B", "8"]
    folded, _ = _fold(m)
    rng = np.random.default_rng(0)
    for n in (1, 3):
        feeds = {
            "x": rng.standard_normal((n, 8)).astype(np.float32),
            "i": rng.integers(0, 8, (n, 4)),
            "u": rng.standard_normal((n, 4)).astype(np.float32),
            "k": rng.integers(0, n, (n, 1)),
        }
        assert np.array_equal(run(m, feeds)[0], run(folded, feeds)[0])
