"""torch.export programs with dynamic shapes (batch and sequence as `Dim`s) through the fx
frontend: SymInt sizes become symbolic dimensions of the types the rules see, views whose
sizes are computed at run time lower to Reshapes with ONNX's 0/-1, and the optimized program
still runs at other sizes.

Models are `bench/fx_models.py`'s mid-size configs (random trained-like weights); each program
is checked at the example size (batch 2, sequence 16) and at batch 3, sequence 11 against the
eager model.
"""

import sys
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.export import Dim

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

import fx_models  # noqa: E402

from frontends.fx import import_fx, optimize_fx  # noqa: E402

R = ("reassoc",)  # numeric classes allowed beyond exact


def test_symbolic_sizes_become_symbols_without_specializing_the_program():
    """Reading the types must not guard on the example sizes (int() of a SymInt does): the
    program's shape environment keeps its symbols free."""

    class M(nn.Module):
        def forward(self, x):
            b, s, _ = x.shape
            return (x * 1.0).view(b, s, 2, 4).transpose(1, 2).transpose(1, 2).reshape(b, s, 8)

    x = torch.randn(2, 5, 8)
    ep = torch.export.export(M(), (x,), dynamic_shapes=({0: Dim("b"), 1: Dim("s")},))
    g = import_fx(ep, (x,))
    dims = g.values[g.inputs[0]].type.shape
    assert all(isinstance(d, str) for d in dims[:2]) and dims[2] == 8, dims
    reshapes = [g.constants[n.inputs[1]].tolist() for n in g.nodes if n.op == "Reshape"]
    assert reshapes == [[0, 0, 2, 4], [0, 0, 8]]
    val = next(n for n in ep.graph.nodes if n.op == "placeholder").meta["val"]
    assert not val.shape[0].node.expr.is_number  # still a symbol, not 2
    out, report = optimize_fx(ep, (x,))
    assert {"mul-one", "transpose-transpose"} <= set(report.fired)
    for shape in [(2, 5, 8), (7, 3, 8)]:
        y = torch.randn(shape)
        torch.testing.assert_close(out.module()(y), M()(y), rtol=0, atol=0)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_dynamic_program_is_rewritten_and_runs_at_two_sizes(name):
    case = fx_models.build(name, "test")
    ep = torch.export.export(case.model, case.inputs, dynamic_shapes=case.dynamic_shapes)
    out, report = optimize_fx(ep, case.inputs, allow=R)
    assert "skipped" not in report.extra
    assert report.nodes_after < report.nodes_before * 0.85, (
        report.nodes_before,
        report.nodes_after,
    )
    assert out.range_constraints.keys() == ep.range_constraints.keys()
    for inputs in (case.inputs, case.second):
        with torch.no_grad():
            want, got = case.model(*inputs), out.module()(*inputs)
        for a, b in zip(got, want, strict=True):
            assert a.shape == b.shape and b.std() > 0.1
            torch.testing.assert_close(a, b, rtol=1e-3, atol=1e-4)
