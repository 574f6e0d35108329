"""engine.fold's TopK and Round: the reference evaluator's TopK with a fast path for k = 1 over
NaN-free floats (the quant rules' column and block maxima), and Round without the reference's
copy. Both must agree with the reference exactly, ties included (TopK: lowest index first, and
the smallest with largest=0; Round: half to even)."""

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from engine.fold import Round, TopK


def topk_model(x: np.ndarray, k: int, **attrs) -> onnx.ModelProto:
    node = helper.make_node("TopK", ["x", "k"], ["v", "i"], **attrs)
    outs = [helper.make_value_info(n, onnx.TypeProto()) for n in ("v", "i")]
    inits = [numpy_helper.from_array(x, "x"), numpy_helper.from_array(np.array([k]), "k")]
    graph = helper.make_graph([node], "g", [], outs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


@pytest.mark.parametrize(
    "x",
    [
        np.random.default_rng(0).integers(-3, 3, (5, 7, 3)).astype(np.float32),  # many ties
        np.random.default_rng(1).normal(size=(4, 6, 2)).astype(np.float64),
        np.array([[1.0, np.nan, 3.0], [2.0, 2.0, -1.0]], np.float32),  # NaN: the reference
        np.random.default_rng(2).integers(0, 9, (3, 4)).astype(np.int64),  # ints: the reference
    ],
    ids=["ties", "float64", "nan", "int64"],
)
@pytest.mark.parametrize("k", [1, 2])
@pytest.mark.parametrize("largest", [1, 0])
def test_fold_topk_agrees_with_the_reference(x, k, largest):
    for axis in range(-x.ndim, x.ndim):
        if x.shape[axis] < k:
            continue
        model = topk_model(x, k, axis=axis, largest=largest)
        want = ReferenceEvaluator(model).run(None, {})
        evaluator = ReferenceEvaluator(model, new_ops=[TopK])
        assert type(evaluator.rt_nodes_[0]) is TopK  # ours runs, not the reference's
        got = evaluator.run(None, {})
        for w, g in zip(want, got):
            assert w.dtype == g.dtype and w.shape == g.shape
            np.testing.assert_array_equal(w, g)


@pytest.mark.parametrize(
    "x",
    [
        np.array([-2.5, -1.5, -0.5, 0.5, 1.5, 2.5, 3.5, -0.0, 126.5, -127.5], np.float32),
        np.random.default_rng(3).normal(scale=50, size=(6, 9)).astype(np.float32),
        np.array([np.nan, np.inf, -np.inf, 1e30], np.float64),
        np.float16([0.5, 1.5, 2.4, -2.6]),
        np.arange(-3, 4, dtype=np.int32),
    ],
    ids=["ties", "normal", "special", "float16", "int32"],
)
def test_fold_round_agrees_with_the_reference(x):
    """engine.fold's Round (np.rint): half to even, dtype kept, as the reference's Round."""
    node = helper.make_node("Round", ["x"], ["y"])
    graph = helper.make_graph(
        [node],
        "g",
        [],
        [helper.make_value_info("y", onnx.TypeProto())],
        [numpy_helper.from_array(x, "x")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    (want,) = ReferenceEvaluator(model).run(None, {})
    evaluator = ReferenceEvaluator(model, new_ops=[Round])
    assert type(evaluator.rt_nodes_[0]) is Round
    (got,) = evaluator.run(None, {})
    assert want.dtype == got.dtype and want.shape == got.shape
    np.testing.assert_array_equal(want, got)
