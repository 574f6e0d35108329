"""engine.fold: a batch of constant nodes folds into constants (the reference evaluator, with
its Round half to even), and a batch the evaluator cannot run stays unfolded, never an
error."""

from __future__ import annotations

import numpy as np
import onnx.parser

from engine import fold as F
from frontends.onnx import export_model, import_model
from frontends.onnx.check import run

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


def test_a_batch_folds_into_constants():
    model = onnx.parser.parse_model(MODEL)
    out = export_model(F.fold(import_model(model)))
    assert [n.op_type for n in out.graph.node] == ["Add"]
    x = {"x": np.arange(6, dtype=np.float32).reshape(2, 3)}
    want = x["x"] + np.exp(np.float32([1.0, -4.0, 10.0]))  # Round(-4.5) is -4: half to even
    np.testing.assert_allclose(run(out, x)[0], want, rtol=1e-6)
    np.testing.assert_allclose(run(model, x)[0], want, rtol=1e-6)


def test_a_batch_the_evaluator_cannot_run_stays_unfolded(monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("cannot run")

    monkeypatch.setattr(F, "ReferenceEvaluator", broken)
    out = export_model(F.fold(import_model(onnx.parser.parse_model(MODEL))))
    assert [n.op_type for n in out.graph.node] == ["Mul", "Round", "Exp", "Add"]
