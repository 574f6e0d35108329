"""engine.fold's evaluators: a batch of constant nodes folds under onnxruntime, or under the
reference evaluator when onnxruntime cannot run it; a batch neither runs stays unfolded, never
an error; and the parts onnxruntime is slow on (a per-axis QuantizeLinear) go to the
reference."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import onnx.parser
import pytest
from onnx import helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from engine import fold as F
from frontends.onnx import export_model, import_model
from frontends.onnx.check import run
from vocab.graph import Node, components

MODEL = """
<ir_version: 10, opset_import: ["" : 18]>
g (float[2, 3] x) => (float[2, 3] y) <float[3] a = {0.5, -1.5, 2.5}, float[3] b = {2.0, 3.0, 4.0}>
{
  s = Mul(a, b)
  r = Round(s)
  e = Exp(r)
  y = Add(x, e)
}
"""

# two weights: w1's per-column QuantizeLinear (the dynamic rules' form) and w2's TopK chain
# (the weight-only rules' form); one Constant read by both
SPLIT = """
<ir_version: 10, opset_import: ["" : 18]>
g (float[2, 4] x) => (float[2, 3] y, float[2, 3] z2)
  <float[4, 3] w1 = {1., -2., 3., -4., 5., -6., 7., -8., 9., -10., 11., -12.},
   float[3] s1 = {0.1, 0.2, 0.3},
   float[4, 3] w2 = {1., -2., 3., -4., 5., -6., 7., -8., 9., -10., 11., -12.},
   float[3] b3 = {0.5, 0.25, 0.125}>
{
  c = Constant <value_float = 2.0> ()
  h = Mul(w1, c)
  q = QuantizeLinear <axis = 1> (h, s1)
  d = DequantizeLinear <axis = 1> (q, s1)
  y = MatMul(x, d)
  k = Constant <value_ints = [1]> ()
  m, i = TopK <axis = 0> (w2, k)
  v = Div(w2, m)
  u = Mul(v, c)
  z = MatMul(x, u)
  z2 = Add(z, b3)
}
"""


def broken(*args, **kwargs):
    raise RuntimeError("cannot run")


@pytest.mark.parametrize("evaluator", ["onnxruntime", "reference"])
def test_a_batch_folds_under_either_evaluator(monkeypatch, evaluator):
    """onnxruntime alone (the reference broken), or the reference alone (onnxruntime broken):
    the same constants, the graph down to the Add."""
    if evaluator == "onnxruntime":
        monkeypatch.setattr(F, "ReferenceEvaluator", broken)
    else:
        monkeypatch.setattr(F, "_run_onnxruntime", broken)
    model = onnx.parser.parse_model(MODEL)
    out = export_model(F.fold(import_model(model)))
    assert [n.op_type for n in out.graph.node] == ["Add"]
    x = {"x": np.arange(6, dtype=np.float32).reshape(2, 3)}
    want = x["x"] + np.exp(np.float32([1.0, -4.0, 10.0]))  # Round(-4.5) is -4: half to even
    np.testing.assert_allclose(run(out, x)[0], want, rtol=1e-6)
    np.testing.assert_allclose(run(model, x)[0], want, rtol=1e-6)


def test_a_batch_neither_runs_stays_unfolded(monkeypatch):
    monkeypatch.setattr(F, "ReferenceEvaluator", broken)
    monkeypatch.setattr(F, "_run_onnxruntime", broken)
    out = export_model(F.fold(import_model(onnx.parser.parse_model(MODEL))))
    assert [n.op_type for n in out.graph.node] == ["Mul", "Round", "Exp", "Add"]


def with_constant_node(g, name: str):
    """`g` with its constant `name` made by a Constant node instead (what a rule's
    `(Constant ...)` leaves after extraction; the importer folds a model's own)."""
    vid = next(i for i, v in enumerate(g.values) if v.name == name)
    proto = helper.make_node(
        "Constant", [], [name], value=numpy_helper.from_array(g.constants[vid])
    )
    node = Node("Constant", (), (vid,), opaque=True, payload=proto)
    constants = {k: v for k, v in g.constants.items() if k != vid}
    return replace(g, nodes=(node, *g.nodes), constants=constants)


def test_per_axis_quantize_parts_go_to_the_reference_the_rest_to_onnxruntime():
    model = onnx.parser.parse_model(SPLIT)
    # c is read by both parts; b3 by no node of the batch (an Add on x): onnxruntime's part
    g = with_constant_node(with_constant_node(import_model(model), "c"), "b3")
    by_ort, by_reference = F._split([n for n in g.nodes if n.op not in ("MatMul", "Add")], g)
    # the Constant both parts read goes with each
    assert [n.op for n in by_reference] == ["Constant", "Mul", "QuantizeLinear", "DequantizeLinear"]
    assert [n.op for n in by_ort] == ["Constant", "Constant", "TopK", "Div", "Mul"]
    out = export_model(F.fold(g))  # an 8-bit weight's DequantizeLinear stays (KEPT_UNFOLDED)
    assert [n.op_type for n in out.graph.node] == ["DequantizeLinear", "MatMul", "MatMul", "Add"]
    x = {"x": np.arange(8, dtype=np.float32).reshape(2, 4)}
    for got, want in zip(run(out, x), run(model, x)):
        np.testing.assert_allclose(got, want, rtol=1e-6)


def test_components_label_each_item_by_the_smallest_of_its_component():
    assert components(6, [(4, 1), (2, 3), (1, 0)]) == [0, 0, 2, 2, 0, 5]
    assert components(3, []) == [0, 1, 2]


def test_integer_division_folds_under_the_reference():
    """onnxruntime's int32 Div(-2**31, -1) ends the process (SIGFPE); the reference evaluator
    folds integer Div and Mod, float Div stays with onnxruntime."""
    text = """
    <ir_version: 10, opset_import: ["" : 18]>
    g (int32[2] x, float[2] f) => (int32[2] y, float[2] z)
      <int32[2] a = {-2147483648, 7}, int32[2] b = {-1, 2}, float[2] c = {1.0, 4.0}>
    {
      q = Div(a, b)
      y = Add(x, q)
      d = Div(c, c)
      z = Add(f, d)
    }
    """
    g = import_model(onnx.parser.parse_model(text))
    by_ort, by_reference = F._split([n for n in g.nodes if n.op == "Div"], g)
    assert [g.values[n.inputs[0]].name for n in by_reference] == ["a"]
    assert [g.values[n.inputs[0]].name for n in by_ort] == ["c"]
    out = export_model(F.fold(g))
    assert [n.op_type for n in out.graph.node] == ["Add", "Add"]


TOPK = """
<ir_version: 10, opset_import: ["" : 18]>
g (float[2, 3] x) => (float[2, 3] y)
  <float[4, 3] w = {1., -2., 3., -4., 5., -6., 7., -8., 9., -10., 11., -12.}>
{
  k = Constant <value_ints = [1]> ()
  m, i = TopK <axis = 0> (w, k)
  y = Add(x, m)
}
"""


def asked_of_onnxruntime(monkeypatch) -> list[set[str]]:
    """A list that gets the output names of each model the fold runs under onnxruntime."""
    asked: list[set[str]] = []
    evaluate = F._run_onnxruntime

    def recording(model, feeds):
        asked.append({o.name for o in model.graph.output})
        return evaluate(model, feeds)

    monkeypatch.setattr(F, "_run_onnxruntime", recording)
    return asked


def test_a_batch_computes_only_the_values_read_after_it(monkeypatch):
    """The evaluator is asked for the values a node left after folding reads, not each step
    of a folded chain (each would be a buffer of its own). The folded graphs compute what
    the originals do."""
    asked = asked_of_onnxruntime(monkeypatch)
    for text, want, ops in (
        (MODEL, [{"e"}], ["Add"]),  # s = Mul(a, b) and r = Round(s) are steps
        (TOPK, [{"m"}], ["Add"]),  # TopK's values (its indices, read by none, are not)
    ):
        asked.clear()
        model = onnx.parser.parse_model(text)
        out = export_model(F.fold(import_model(model)))
        assert asked == want
        assert [n.op_type for n in out.graph.node] == ops
        x = {"x": np.arange(6, dtype=np.float32).reshape(2, 3)}
        np.testing.assert_allclose(run(out, x)[0], run(model, x)[0], rtol=1e-6)
    # the weight-only chain of SPLIT (TopK, Div, Mul): only its end, which a MatMul reads
    asked.clear()
    model = onnx.parser.parse_model(SPLIT)
    out = export_model(F.fold(with_constant_node(import_model(model), "c")))
    assert asked == [{"u"}]
    x = {"x": np.arange(8, dtype=np.float32).reshape(2, 4)}
    for got, want in zip(run(out, x), run(model, x)):
        np.testing.assert_allclose(got, want, rtol=1e-6)


# weight-only's standard-ONNX packing as the saturation leaves it: the levels rounded in float,
# cast to int4, then moved (onnxruntime has no int4 Transpose or Reshape, nor returns int4)
FOUR_BIT = """
<ir_version: 10, opset_import: ["" : 21]>
g (float[2, 4] x) => (float[2, 3] y)
  <float[3, 4] w = {1., -2., 3., -4., 5., -6., 7., -8., 9., -10., 11., -12.},
   float[1] s = {1.5}, int64[2] shape = {4, 3}>
{
  lo = Constant <value_float = -8.0> ()
  hi = Constant <value_float = 7.0> ()
  r = Div(w, s)
  l = Round(r)
  c = Clip(l, lo, hi)
  q = Cast <to = 22> (c)
  t = Transpose <perm = [1, 0]> (q)
  m = Reshape(t, shape)
  d = DequantizeLinear(m, s)
  y = MatMul(x, d)
}
"""


def test_a_four_bit_tail_folds_by_the_reference_after_onnxruntime(monkeypatch):
    """The rounding (Div, Round, Clip) by onnxruntime, which is asked for its end only; the
    Cast to int4 and its moves by the reference evaluator: the values the reference alone
    gives."""
    model = onnx.parser.parse_model(FOUR_BIT)
    asked = asked_of_onnxruntime(monkeypatch)
    g = import_model(model)
    head, tail = F._four_bit_tail(
        [n for n in g.nodes if n.op not in ("DequantizeLinear", "MatMul")], g
    )
    assert [n.op for n in tail] == ["Cast", "Transpose", "Reshape"]
    out = export_model(F.fold(g))
    assert asked == [{"c"}]
    assert [n.op_type for n in out.graph.node] == ["DequantizeLinear", "MatMul"]
    monkeypatch.setattr(F, "_run_onnxruntime", broken)
    alone = export_model(F.fold(import_model(model)))  # the reference evaluator alone
    for a, b in zip(out.graph.initializer, alone.graph.initializer):
        assert a.SerializeToString() == b.SerializeToString()
    x = {"x": np.arange(8, dtype=np.float32).reshape(2, 4)}  # onnxruntime cannot load model
    want = ReferenceEvaluator(model).run(None, x)[0]
    np.testing.assert_allclose(run(out, x)[0], want, rtol=1e-6)
