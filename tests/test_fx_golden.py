"""One rule file, two frontends: the same golden cases through ONNX and through torch.fx.

Each case is a small graph written twice, as ONNX text and as torch code over the same
constants. Both are optimized with the shipped library; the ops left (canonical names, opaque
ops as "opaque") must be the same, the case's rule must fire in both (or, for a negative case,
in neither), and for symbolic_trace graphs the same rules must fire. The torch code runs as a
`symbolic_trace` graph and as a `torch.export` graph; both must match eager outputs.
"""

import re

import numpy as np
import onnx
import onnx.parser
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from dsl import load_rules, shipped_rules_dir
from frontends.fx import import_fx, optimize_fx
from frontends.onnx import optimize_model

RULES = load_rules([shipped_rules_dir()])
R = ("exact", "reassoc")
W34 = "float[3,4] w = {1.,2.,3.,4.,5.,6.,7.,8.,9.,1.,2.,3.}, float[4] b = {1.,2.,3.,4.}"
CONV = "float[2,2,1,1] w = {1.,2.,3.,4.}"
BN = (
    f"{CONV}, float[2] s = {{0.5, 2.}}, float[2] bb = {{0.1, 0.2}}, float[2] m = {{1., -1.}}, "
    "float[2] v = {4., 0.25}"
)


@torch.fx.wrap
def custom(x):
    """An op no frontend knows: opaque in fx, like a custom-domain node in ONNX."""
    return x * 2


# id, "inputs => outputs", initializers, ONNX body, torch code, the rule (None: none may fire), fp
CASES = [
    (
        "identity",
        "float[2,3] x => float[2,3] y",
        "",
        "t = Identity(x) y = Relu(t)",
        lambda m, x: torch.relu(m.ident(x)),
        "identity",
    ),
    (
        "dropout-inference",
        "float[2,3] x => float[2,3] y",
        "",
        "t = Dropout(x) y = Relu(t)",
        lambda m, x: torch.relu(F.dropout(x, 0.1, training=False)),
        "dropout-inference",
    ),
    (
        "transpose-transpose-cancel",
        "float[2,3,4] x => float[2,3,4] y",
        "",
        "a = Transpose<perm=[0,2,1]>(x) b = Transpose<perm=[0,2,1]>(a) y = Relu(b)",
        lambda m, x: torch.relu(x.permute(0, 2, 1).permute(0, 2, 1)),
        "transpose-transpose",
    ),
    (
        "transpose-transpose-merge",
        "float[2,3,4] x => float[4,3,2] y",
        "",
        "a = Transpose<perm=[1,0,2]>(x) b = Transpose<perm=[2,0,1]>(a) y = Relu(b)",
        lambda m, x: torch.relu(x.transpose(0, 1).permute(2, 0, 1)),
        "transpose-transpose",
    ),
    (
        "no-transpose-real-perm",
        "float[2,3] x => float[3,2] y",
        "",
        "a = Transpose<perm=[1,0]>(x) y = Relu(a)",
        lambda m, x: torch.relu(x.t()),
        None,
    ),
    (
        "reshape-reshape",
        "float[2,3,4] x => float[4,6] y",
        "int64[2] s1 = {6, 4}, int64[2] s2 = {4, 6}",
        "a = Reshape(x, s1) b = Reshape(a, s2) y = Relu(b)",
        lambda m, x: torch.relu(x.reshape(6, 4).view(4, 6)),
        "reshape-of-reshape",
    ),
    (
        "noop-reshape",
        "float[2,3] x => float[2,3] y",
        "int64[2] s = {2, 3}",
        "a = Reshape(x, s) y = Relu(a)",
        lambda m, x: torch.relu(x.reshape(2, 3)),
        "noop-Reshape",
    ),
    (
        "noop-expand",
        "float[2,3] x => float[2,3] y",
        "int64[2] s = {2, 3}",
        "a = Expand(x, s) y = Relu(a)",
        lambda m, x: torch.relu(x.expand(2, 3)),
        "noop-Expand",
    ),
    (
        "no-expand-that-grows",
        "float[1,3] x => float[2,3] y",
        "int64[2] s = {2, 3}",
        "a = Expand(x, s) y = Relu(a)",
        lambda m, x: torch.relu(x.expand(2, -1)),
        None,
    ),
    (
        "cast-of-widening-cast",
        "float16[2,3] x => double[2,3] y",
        "",
        "a = Cast<to=1>(x) y = Cast<to=11>(a)",
        lambda m, x: x.float().double(),
        "cast-of-widening-cast",
    ),
    (
        "no-cast-of-narrowing-cast",
        "float[2,3] x => float[2,3] y",
        "",
        "a = Cast<to=10>(x) b = Cast<to=1>(a) y = Relu(b)",
        lambda m, x: torch.relu(x.half().to(torch.float32)),
        None,
    ),
    (
        "squeeze-unsqueeze",
        "float[2,3] x => float[2,3] y",
        "int64[1] ax = {1}",
        "a = Unsqueeze(x, ax) b = Squeeze(a, ax) y = Relu(b)",
        lambda m, x: torch.relu(x.unsqueeze(1).squeeze(1)),
        "squeeze-unsqueeze",
    ),
    (
        "add-zero",
        "float[2,3] x => float[2,3] y",
        "float[3] z = {-0.0, -0.0, -0.0}",
        "a = Add(z, x) y = Relu(a)",
        lambda m, x: torch.relu(m.z + x),
        "add-zero",
    ),
    (
        "no-add-zero-that-broadcasts",
        "float[3] x => float[2,3] y",
        "float[2,3] z = {0.0, 0.0, 0.0, 0.0, 0.0, 0.0}",
        "a = Add(x, z) y = Relu(a)",
        lambda m, x: torch.relu(x + m.z),
        None,
    ),
    (
        "mul-one",
        "float[2,3] x => float[2,3] y",
        "float[1] o = {1.0}",
        "a = Mul(x, o) y = Relu(a)",
        lambda m, x: torch.relu(x * m.o),
        "mul-one",
    ),
    (
        "div-one-scalar",
        "float[2,3] x => float[2,3] y",
        "float o = {1.0}",
        "a = Div(x, o) y = Relu(a)",
        lambda m, x: torch.relu(x / 1.0),
        "div-one",
    ),
    (
        "no-one-div-x",
        "float[2,3] x => float[2,3] y",
        "float o = {1.0}",
        "a = Div(o, x) y = Relu(a)",
        lambda m, x: torch.relu(1.0 / x),
        "div-one-left",
    ),
    (
        "neg-neg",
        "float[2,3] x => float[2,3] y",
        "",
        "a = Neg(x) b = Neg(a) y = Relu(b)",
        lambda m, x: torch.relu(torch.neg(-x)),
        "neg-neg",
    ),
    (
        "matmul-add-to-gemm",
        "float[2,3] x => float[2,4] y",
        W34,
        "t = MatMul(x, w) y = Add(t, b)",
        lambda m, x: torch.matmul(x, m.w) + m.b,
        "matmul-add-to-gemm",
    ),
    (
        "no-gemm-when-matmul-shared",
        "float[2,3] x => float[2,4] y, float[2,4] t",
        W34,
        "t = MatMul(x, w) y = Add(t, b)",
        lambda m, x: (lambda t: (t + m.b, t))(torch.matmul(x, m.w)),
        None,
    ),
    (
        "conv-add-bias",
        "float[1,2,4,4] x => float[1,2,4,4] y",
        f"{CONV}, float[2,1,1] b = {{0.5, -1.}}",
        "c = Conv(x, w) y = Add(c, b)",
        lambda m, x: F.conv2d(x, m.w) + m.b,
        "conv-add-bias",
    ),
    (
        "no-conv-add-non-channel-bias",
        "float[1,2,4,4] x => float[1,2,4,4] y",
        f"{CONV}, float[4] b = {{0.5, -1., 1., 2.}}",
        "c = Conv(x, w) y = Add(c, b)",
        lambda m, x: F.conv2d(x, m.w) + m.b,
        None,
    ),
    (
        "fold-batchnorm-into-conv",
        "float[1,2,4,4] x => float[1,2,4,4] y",
        BN,
        "c = Conv(x, w) y = BatchNormalization<epsilon=0.001>(c, s, bb, m, v)",
        lambda m, x: F.batch_norm(F.conv2d(x, m.w), m.m, m.v, m.s, m.bb, False, 0.1, 1e-3),
        "fold-batchnorm-into-conv",
        R,
    ),
    (
        "no-batchnorm-fold-without-reassoc",
        "float[1,2,4,4] x => float[1,2,4,4] y",
        BN,
        "c = Conv(x, w) y = BatchNormalization<epsilon=0.001>(c, s, bb, m, v)",
        lambda m, x: F.batch_norm(F.conv2d(x, m.w), m.m, m.v, m.s, m.bb, False, 0.1, 1e-3),
        None,
    ),
    (
        "batchnorm-fold-strided-conv",
        "float[1,2,4,4] x => float[1,2,2,2] y",
        BN,
        "c = Conv<strides=[2,2]>(x, w) y = BatchNormalization(c, s, bb, m, v)",
        lambda m, x: F.batch_norm(F.conv2d(x, m.w, stride=2), m.m, m.v, m.s, m.bb),
        "fold-batchnorm-into-conv",
        R,
    ),
    (
        "opaque-op-passes-through",
        "float[2,3] x => float[2,3] y",
        "",
        "a = Identity(x) b = CustomOp(a) y = Relu(b)",
        lambda m, x: torch.relu(custom(m.ident(x))),
        "identity",
    ),
]
DTYPES = {
    "float": torch.float32,
    "float16": torch.float16,
    "double": torch.float64,
    "int64": torch.int64,
}


class Case(nn.Module):
    def __init__(self, fn, consts: dict[str, np.ndarray]):
        super().__init__()
        self.fn, self.ident = fn, nn.Identity()
        for name, value in consts.items():
            self.register_buffer(name, torch.from_numpy(value.copy()))

    def forward(self, x):
        return self.fn(self, x)


def _onnx(sig: str, inits: str, body: str) -> onnx.ModelProto:
    ins, outs = (s.strip() for s in sig.split("=>"))
    init_text = f" <{inits}>" if inits else ""
    text = (
        f'<ir_version: 10, opset_import: ["" : 18, "custom" : 1]> g ({ins}) => ({outs})'
        f"{init_text} {{ {body} }}"
    )
    model = onnx.parser.parse_model(text)
    for n in model.graph.node:
        if n.op_type == "CustomOp":
            n.domain = "custom"
    return model


def _inputs(sig: str) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(0)
    out = []
    for dtype, dims in re.findall(r"(\w+)\[([\d,]+)\] \w+", sig.split("=>")[0]):
        shape = [int(d) for d in dims.split(",")]
        out.append(torch.randn(shape, generator=gen).to(DTYPES[dtype]))
    return tuple(out)


def _ops(names: list[str], opaque: set[str]) -> list[str]:
    return ["opaque" if n in opaque else n for n in names]


def _fx_ops(module, inputs) -> list[str]:
    g = import_fx(module, inputs)
    return _ops([n.op for n in g.nodes], {n.op for n in g.nodes if n.opaque})


def _case(case):
    name, sig, inits, body, fn, rule, *fp = case
    model = _onnx(sig, inits, body)
    consts = {i.name: onnx.numpy_helper.to_array(i) for i in model.graph.initializer}
    return model, Case(fn, consts).eval(), _inputs(sig), rule, fp[0] if fp else ("exact",)


def _fired(report, rule: str) -> bool:
    """True if `rule`, or a variant the checker made of it (`add-zero-c1`), fired."""
    return any(name.lower().startswith(rule.lower()) for name in report.fired)


@pytest.mark.parametrize("dialect", ["symbolic_trace", "export"])
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_same_rewrites(case, dialect):
    model, module, inputs, rule, fp = _case(case)
    onnx_out, onnx_report = optimize_model(model, RULES, fp=fp)
    if dialect == "symbolic_trace":
        graph = torch.fx.symbolic_trace(module)
    else:
        graph = torch.export.export(module, inputs, strict=False)
    fx_out, fx_report = optimize_fx(graph, inputs, RULES, allow=fp)
    onnx_ops = lambda m: _ops([n.op_type for n in m.graph.node], {"CustomOp"})  # noqa: E731
    same_input = _fx_ops(graph, inputs) == onnx_ops(model)
    if dialect == "symbolic_trace":  # torch.export normalizes some spellings (1 / x, Identity)
        assert same_input, (_fx_ops(graph, inputs), onnx_ops(model))
        assert set(fx_report.fired) == set(onnx_report.fired)
    if same_input:
        assert _fx_ops(fx_out, inputs) == onnx_ops(onnx_out), (fx_report.fired, onnx_report.fired)
    assert fx_report.nodes_after <= fx_report.nodes_before
    if rule is None:
        assert not onnx_report.changed and (not fx_report.changed or not same_input)
    else:
        assert _fired(onnx_report, rule), onnx_report.fired
    runnable = fx_out.module() if dialect == "export" else fx_out
    for got, exp in zip(
        torch.utils._pytree.tree_leaves(runnable(*inputs)),
        torch.utils._pytree.tree_leaves(module(*inputs)),
    ):
        torch.testing.assert_close(got, exp, rtol=1e-3, atol=1e-4)
