"""Real architectures exported with dynamic axes (TorchScript exporter, opset 17, batch and
sequence symbolic), mid-size with their full structure (examples/make_models.py `dynamic`):
the shape analysis must fold their shape arithmetic, and the optimized model must compute
what the original computes at the export's shape *and* at a second shape (batch 3, sequence
halved), since a folded shape must never stand for one particular input size.
"""

import functools
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest

from frontends.onnx.check import TOLERANCES, _diff, run

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "examples"))

pytestmark = pytest.mark.slow

MODELS = ["bert", "gpt2", "llama", "t5", "vit", "swin", "mobilenetv2"]
SHAPE_OPS = {"Shape", "Gather", "Unsqueeze", "Concat", "ConstantOfShape", "Range", "Cast"}


@functools.cache
def _optimized(name: str):
    import make_models

    from dsl import load_rules, shipped_rules_dir
    from frontends.onnx import optimize_model

    model = make_models.dynamic(name)
    result, report = optimize_model(
        model, load_rules([shipped_rules_dir()]), fp=("exact", "reassoc")
    )
    return model, result, report


def _feeds(model: onnx.ModelProto, batch: int, seq: int, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    feeds = {}
    for vi in model.graph.input:
        dims = [
            d.dim_value if d.HasField("dim_value") else batch if k == 0 else seq
            for k, d in enumerate(vi.type.tensor_type.shape.dim)
        ]
        if vi.type.tensor_type.elem_type == onnx.TensorProto.FLOAT:
            feeds[vi.name] = rng.standard_normal(dims).astype(np.float32)
        elif vi.name == "attention_mask":
            mask = np.ones(dims, np.int64)
            mask[-1, dims[1] // 2 :] = 0  # padding in the last row
            feeds[vi.name] = mask
        else:
            feeds[vi.name] = rng.integers(0, 1000, dims).astype(np.int64)
    return feeds


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("batch, seq", [(2, 16), (3, 8)])
def test_outputs_match_at_two_shapes(name, batch, seq):
    model, result, report = _optimized(name)
    feeds = _feeds(model, batch, seq)
    want, got = run(model, feeds), run(result, feeds)
    for vi, a, b in zip(model.graph.output, want, got):
        assert float(np.std(a)) > 1e-3, "the reference output is near-constant"
        d = _diff(vi.name, vi.type.tensor_type.elem_type, b, a, TOLERANCES[report.fp])
        assert d.ok, (name, batch, seq, d)


@pytest.mark.parametrize("name", MODELS)
def test_shape_arithmetic_folds(name):
    model, result, report = _optimized(name)
    onnx.checker.check_model(result, full_check=True)
    compute = lambda m: [n.op_type for n in m.graph.node if n.op_type != "Constant"]  # noqa: E731
    before, after = compute(model), compute(result)
    assert len(after) < len(before)
    shape_before = sum(op in SHAPE_OPS for op in before)
    shape_after = sum(op in SHAPE_OPS for op in after)
    # what is left computes from truly dynamic sizes (e.g. the position ids' Range)
    assert shape_after <= shape_before // 2 or shape_before == 0, (shape_before, shape_after)
    if name == "mobilenetv2":  # opset 17: Pad-13 is in the op table, so the Pads join the Convs
        assert "Pad" in before and "Pad" not in after
