"""PyTorch 2 export quantization in the fx frontend: the quantized_decomposed ops that
`quantize_pt2e` leaves in a graph are QuantizeLinear/DequantizeLinear to the rules
(frontends/fx/spellings.py), so the exact QDQ rules of patterns/quant/qdq.rules clean a
PT2E-quantized graph, export writes torch's ops back (frontends/fx/raising.py), and the result
still compiles with inductor."""

import warnings

import pytest
import torch
import torch.ao.quantization.fx._decomposed  # registers the quantized_decomposed ops
from torch import nn

import rewrite

qd = torch.ops.quantized_decomposed


def _ops(gm) -> list[str]:
    """call_function targets, the quantized_decomposed ones by their short names."""
    out = []
    for n in gm.graph.nodes:
        if n.op == "call_function":
            name = str(n.target)
            out.append(name.split(".")[1] if name.startswith("quantized_decomposed") else name)
    return out


class ConvNet(nn.Module):
    """conv -> relu -> conv -> relu -> max_pool -> flatten -> linear, trained-like biases."""

    def __init__(self):
        super().__init__()
        self.c1, self.c2 = nn.Conv2d(3, 8, 3, padding=1), nn.Conv2d(8, 8, 3, padding=1)
        self.fc = nn.Linear(8 * 8 * 8, 4)
        with torch.no_grad():
            for m in (self.c1, self.c2, self.fc):
                m.bias.normal_(0, 0.2)

    def forward(self, x):
        y = torch.relu(self.c2(torch.relu(self.c1(x))))
        return self.fc(torch.flatten(nn.functional.max_pool2d(y, 2), 1))


def pt2e_quantized(model: nn.Module, x: torch.Tensor):
    """`model` quantized by torchao's PT2E flow with the x86 inductor quantizer, calibrated
    on x and 7 more inputs."""
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e
    from torchao.quantization.pt2e.quantizer.x86_inductor_quantizer import (
        X86InductorQuantizer,
        get_default_x86_inductor_quantization_config,
    )

    quantizer = X86InductorQuantizer()
    quantizer.set_global(get_default_x86_inductor_quantization_config())
    prepared = prepare_pt2e(torch.export.export(model, (x,)).module(), quantizer)
    gen = torch.Generator().manual_seed(1)
    for xi in [x, *(torch.randn(x.shape, generator=gen) for _ in range(7))]:
        prepared(xi)
    return convert_pt2e(prepared)


@pytest.fixture(scope="module")
def quantized():
    torch.manual_seed(0)
    model, x = ConvNet().eval(), torch.randn(1, 3, 16, 16)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return pt2e_quantized(model, x), x


def test_a_pt2e_graph_is_cleaned_by_the_qdq_rules_and_stays_quantized(quantized):
    gm, x = quantized
    before = _ops(gm)
    assert before.count("dequantize_per_channel") == 3  # the int8 weights
    out, report = rewrite.optimize_fx(gm, (x,))
    after = _ops(out)
    # the Relu between conv1 and the uint8 QuantizeLinear (zero point 0) is what the
    # quantization does anyway: dropped, exactly
    assert report.fired.get("quantize-of-relu") == 1
    assert after.count("aten.relu.default") == before.count("aten.relu.default") - 1
    # still PT2E's form: every quantize/dequantize op kept, the int8 weights not folded to float
    for op in ("quantize_per_tensor", "dequantize_per_tensor", "dequantize_per_channel"):
        assert after.count(op) == before.count(op), op
    want = gm(x)
    assert want.std() > 0.05 * want.abs().max()  # not a degenerate output
    assert torch.equal(out(x), want)


@pytest.mark.slow
def test_the_cleaned_pt2e_graph_compiles_with_inductor(quantized):
    gm, x = quantized
    out, _ = rewrite.optimize_fx(gm, (x,))
    torch._dynamo.reset()
    compiled = torch.compile(out, backend="inductor")
    torch.testing.assert_close(compiled(x), gm(x), rtol=1e-4, atol=1e-4)


class Moves(nn.Module):
    """Quantized activations moved (permute, flatten) between quantize/dequantize pairs of one
    scale, as a quantizer that shares parameters through movement ops writes them; a per-channel
    pair on a constant; and a narrow int8 range, which ONNX cannot say."""

    def __init__(self):
        super().__init__()
        self.register_buffer("w", torch.randn(4, 6))
        self.register_buffer("ws", torch.tensor([0.02, 0.03, 0.05, 0.01]))
        self.register_buffer("wz", torch.zeros(4, dtype=torch.int64))

    def forward(self, x):
        q = qd.quantize_per_tensor.default(x, 0.05, 128, 0, 255, torch.uint8)
        d = qd.dequantize_per_tensor.default(q, 0.05, 128, 0, 255, torch.uint8)
        t = d.permute(0, 2, 1)
        q2 = qd.quantize_per_tensor.default(t, 0.05, 128, 0, 255, torch.uint8)
        d2 = qd.dequantize_per_tensor.default(q2, 0.05, 128, 0, 255, torch.uint8)
        wq = qd.quantize_per_channel.default(self.w, self.ws, self.wz, 0, -128, 127, torch.int8)
        w = qd.dequantize_per_channel.default(wq, self.ws, self.wz, 0, -128, 127, torch.int8)
        narrow = qd.quantize_per_tensor.default(x, 0.05, 0, -127, 127, torch.int8)
        return d2 @ w.t(), narrow


def test_quantized_decomposed_ops_map_both_ways_and_q_of_dq_goes(tmp_path):
    torch.manual_seed(2)
    m, x = Moves().eval(), torch.randn(2, 6, 5)
    gm = torch.export.export(m, (x,)).module()
    out, report = rewrite.optimize_fx(gm, (x,))
    fired = report.fired
    # DQ moved after the permute (the permute runs on uint8), then Q(DQ(q)) of one scale is q
    assert fired.get("transpose-before-dequantize-alt1") and fired.get("quantize-of-dequantize")
    after = _ops(out)
    assert after.count("quantize_per_tensor") == 2  # x's, and the narrow one left as it was
    assert after.count("dequantize_per_tensor") == 1  # written back by export, after the permute
    permute = next(n for n in out.graph.nodes if "permute" in str(n.target))
    assert "quantize_per_tensor" in str(permute.args[0].target)  # on the uint8 values
    # the per-channel pair on a constant weight: the quantize folds, the dequantize stays
    assert after.count("dequantize_per_channel") == 1 and "quantize_per_channel" not in after
    for got, want in zip(out(x), gm(x)):
        assert torch.equal(got, want)
