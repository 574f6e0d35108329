"""Depth: no stage recurses once per level of a graph (issue 7).

A 100k-node chain, a 1,000-block residual stack (ONNX) and a 1,000-block residual module
(torch.fx) are optimized with Python's default recursion limit; each must come back smaller
(the shipped rules have work to do in every block) and, for the small enough ones, compute the
same outputs.
"""

import sys

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

from dsl import load_rules, shipped_rules_dir
from frontends.onnx import compare, optimize_model

pytestmark = pytest.mark.slow


@pytest.fixture(autouse=True)
def default_recursion_limit():
    old = sys.getrecursionlimit()
    sys.setrecursionlimit(1000)  # CPython's default
    yield
    sys.setrecursionlimit(old)


def _model(nodes, out, inits=()):
    vi = lambda name: helper.make_tensor_value_info(name, TensorProto.FLOAT, ["B", 8])  # noqa: E731
    g = helper.make_graph(nodes, "deep", [vi("x")], [vi(out)], list(inits))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 10
    return m


def chain(n: int) -> onnx.ModelProto:
    """x -> Relu -> Neg -> Abs -> Sigmoid -> ... (n nodes): Abs(Neg(.)) loses its Neg."""
    ops = ["Relu", "Neg", "Abs", "Sigmoid"]
    nodes, prev = [], "x"
    for i in range(n):
        nodes.append(helper.make_node(ops[i % 4], [prev], [f"v{i}"]))
        prev = f"v{i}"
    return _model(nodes, prev)


def residual(n: int) -> onnx.ModelProto:
    """n blocks of y = Tanh(x + Relu(Relu(MatMul(x, W) + b))) (the second Relu goes; Tanh
    keeps the values bounded, so the output comparison compares numbers, not infinities)."""
    rng = np.random.default_rng(0)
    inits = [
        numpy_helper.from_array((rng.standard_normal((8, 8)) * 0.1).astype(np.float32), "W"),
        numpy_helper.from_array(rng.standard_normal(8).astype(np.float32), "b"),
    ]
    nodes, prev = [], "x"
    for i in range(n):
        nodes += [
            helper.make_node("MatMul", [prev, "W"], [f"m{i}"]),
            helper.make_node("Add", [f"m{i}", "b"], [f"a{i}"]),
            helper.make_node("Relu", [f"a{i}"], [f"r{i}"]),
            helper.make_node("Relu", [f"r{i}"], [f"s{i}"]),
            helper.make_node("Add", [prev, f"s{i}"], [f"t{i}"]),
            helper.make_node("Tanh", [f"t{i}"], [f"o{i}"]),
        ]
        prev = f"o{i}"
    return _model(nodes, prev, inits)


def test_chain_100k():
    model = chain(100_000)
    out, report = optimize_model(model, load_rules([shipped_rules_dir()]))
    assert report.nodes_after == 75_000
    onnx.checker.check_model(out)


def test_residual_1000_blocks():
    model = residual(1000)
    out, report = optimize_model(model, load_rules([shipped_rules_dir()]))
    assert report.nodes_after < report.nodes_before
    diffs = compare(model, out)
    assert diffs and all(d.ok for d in diffs)


def test_fx_residual_1000_blocks():
    import rewrite

    class Stack(torch.nn.Module):
        def __init__(self, n):
            super().__init__()
            self.n, self.lin = n, torch.nn.Linear(8, 8)

        def forward(self, x):
            for _ in range(self.n):
                x = torch.tanh(x + torch.relu(torch.relu(self.lin(x))))
            return x

    model = Stack(1000).eval()
    x = torch.randn(2, 8)
    gm, report = rewrite.optimize_fx(torch.fx.symbolic_trace(model), (x,))
    assert report.nodes_after < report.nodes_before
    want = model(x)
    assert float(want.std()) > 1e-3  # not a degenerate output
    torch.testing.assert_close(gm(x), want)
