"""Dynamic int8 quantization as rules: `rewrite quantize` and `optimize_model(quantize=...)`
(patterns/quant/dynamic.rules). The rules' bounds are verified like every shipped rule (the
pytest plugin, and tests/wrong_rules/quant.rules for the planted wrong ones); here the whole
path: the engine picks the quantized form where it pays, onnxruntime runs it, and a single
MatMul's measured error stays within its rule's bound."""

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import rewrite
from frontends.onnx.api import OptionError
from rewrite.cli import main
from vocab.registry import BOUNDS

RNG = np.random.default_rng(0)
# trained-like: weights of varied column scales, a nonzero bias
W1 = (RNG.normal(0, 0.05, (256, 256)) * RNG.uniform(0.2, 2.0, 256)).astype(np.float32)
W2 = RNG.normal(0, 0.05, (256, 64)).astype(np.float32)
B1 = RNG.normal(0, 0.1, 256).astype(np.float32)


def mlp(layers: int = 2) -> onnx.ModelProto:
    """x[64, 256] -> MatMul W1 -> Add B1 -> Relu (-> MatMul W2): static shapes, so that the cost
    model sees the products' sizes."""
    nodes = [
        helper.make_node("MatMul", ["x", "W1"], ["h"]),
        helper.make_node("Add", ["h", "B1"], ["h2"]),
        helper.make_node("Relu", ["h2"], ["y" if layers == 1 else "h3"]),
    ]
    inits = [numpy_helper.from_array(W1, "W1"), numpy_helper.from_array(B1, "B1")]
    if layers == 2:
        nodes.append(helper.make_node("MatMul", ["h3", "W2"], ["y"]))
        inits.append(numpy_helper.from_array(W2, "W2"))
    width = 64 if layers == 2 else 256
    graph = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [64, 256])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [64, width])],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)


def run(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    s = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return s.run(None, {"x": x})[0]


def ops(model: onnx.ModelProto) -> list[str]:
    return [n.op_type for n in model.graph.node]


@pytest.mark.parametrize("per_channel", [False, True], ids=["per-tensor", "per-channel"])
def test_quantize_dynamic_writes_integer_matmuls_that_onnxruntime_runs(per_channel):
    q, report = rewrite.optimize_model(mlp(), quantize="dynamic", per_channel=per_channel)
    assert ops(q).count("MatMulInteger") == 2 and ops(q).count("DynamicQuantizeLinear") == 2
    assert "MatMul" not in ops(q)
    rule = "quantize-matmul-dynamic" + ("-per-column" if per_channel else "")
    assert report.fired.get(rule) == 2
    weights = [i for i in q.graph.initializer if i.data_type == TensorProto.INT8]
    assert len(weights) == 2  # folded ahead of time, not QuantizeLinear nodes
    assert all(np.abs(numpy_helper.to_array(w)).max() == 63 for w in weights)  # 7-bit range
    x = RNG.normal(0, 1, (64, 256)).astype(np.float32)
    want, got = run(mlp(), x), run(q, x)
    assert want.std() > 0.05  # not a degenerate output
    assert np.abs(got - want).max() / np.abs(want).max() < 0.05


@pytest.mark.parametrize("per_channel", [False, True], ids=["per-tensor", "per-channel"])
def test_one_matmul_stays_within_its_rules_bound_on_onnxruntime(per_channel):
    model = mlp(layers=1)
    model.graph.node.pop()  # x @ W1 + B1 only: the bound is the MatMul's, the Add is exact
    model.graph.node.pop()
    model.graph.node[0].output[0] = "y"
    q, _ = rewrite.optimize_model(model, quantize="dynamic", per_channel=per_channel)
    assert "MatMulInteger" in ops(q)
    name = "matmul-dynamic-7bit" + ("-per-column" if per_channel else "")
    for seed in range(4):
        x = np.random.default_rng(seed).normal(0, 3, (64, 256)).astype(np.float32)
        err = np.abs(run(q, x) - run(model, x))
        bound = BOUNDS[name].fn(x, W1)
        assert np.all(err <= bound)
        assert err.max() > 0  # it did quantize


def test_without_quantize_nothing_is_quantized():
    optimized, _ = rewrite.optimize_model(mlp())
    assert "MatMulInteger" not in ops(optimized)


def test_an_unknown_mode_is_an_option_error():
    with pytest.raises(OptionError, match="unknown mode 'static'"):
        rewrite.optimize_model(mlp(), quantize="static")


def test_cli_quantize(tmp_path, capsys):
    src, dst = tmp_path / "m.onnx", tmp_path / "q.onnx"
    onnx.save(mlp(), src)
    assert main(["quantize", str(src), str(dst)]) == 0
    out = capsys.readouterr().out
    assert "quantize-matmul-dynamic" in out and "quant rules fired" in out
    assert "MatMulInteger" in ops(onnx.load(dst))
    bad = tmp_path / "bad.onnx"
    assert main(["quantize", str(src), str(bad), "--mode", "static"]) == 1
    err = capsys.readouterr().err
    assert (
        err.startswith("error: ") and "unknown mode 'static'" in err and len(err.splitlines()) == 1
    )
    assert not bad.exists()
