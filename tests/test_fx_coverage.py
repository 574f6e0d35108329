"""Which ops of real transformers the rules see, per model, as torch.export and torch.compile
produce them (`bench/fx_models.py`: BERT, DistilBERT, GPT-2, a Llama-style decoder, ViT, T5,
Whisper; mid-size configs with the full structure, transformers' default sdpa attention).

`OPAQUE` lists the call targets each graph may keep opaque, each with the reason below, and the
counts seen with transformers 5.x. Any other op must be lowered: an op that regresses to opaque
fails the test, and so does a new op a transformers or torch release brings (decide: map it, or
list it here with a reason). The counts of a listed target are not asserted: they follow how a
transformers release writes its modules (Llama's RoPE writes 4 `cat`s with one release and 5
with the next), which the product does not control; attention stays whole, one node per layer.
torch.export's `_assert_tensor_metadata` checks of `to` inputs are decided at export time and
dropped by the importer (they count as seen). Run with `-s` to print the coverage
table. Each exported model is also optimized, its output checked against the input program's
(`optimize_fx`'s check) at the example inputs; Llama's and T5's RMSNorms become one op.
"""

import functools
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

import fx_bench  # noqa: E402
import fx_models  # noqa: E402

from frontends.fx import op_coverage, optimize_fx  # noqa: E402

pytestmark = pytest.mark.slow
A = "torch.ops.aten."
SDPA = {
    "export": f"{A}scaled_dot_product_attention.default",
    "dynamo": "torch._C._nn.scaled_dot_product_attention",
}

# Why each op stays opaque (rules still match around it).
WHY = {
    "scaled_dot_product_attention": "kept whole: no op-table form (ONNX Attention is opset 23) "
    "and no rule rewrites inside attention; pure, so not pinned",
    "_log_api_usage_once": "torch's usage logging: an effect, kept",
    "new_ones": "a fill of a shape only known at run time (no ConstantOfShape in the op table)",
    "full_like": "same as new_ones",
    "zeros_like": "same as new_ones",
    "index": "advanced indexing with tensors (Gather takes one index tensor)",
    "getitem": "advanced indexing with tensors, or an item of a higher-order op's tuple",
    "gather": "GatherElements is not in the op table",
    "min": "ONNX Min takes any number of inputs (not in the op table)",
    "silu": "no single ONNX op (x * Sigmoid(x) would write two nodes back)",
    "diff": "not in the op table",
    "cumsum": "not in the op table",
    "ne": "no NotEqual in ONNX (Not(Equal) would write two nodes back)",
    "wrap_with_set_grad_enabled": "a higher-order op with a subgraph (RoPE under no_grad)",
}

_COMMON = {
    "export": {f"{A}new_ones.default": 1, f"{A}index.Tensor": 1},
    "dynamo": {"Tensor.new_ones": 1, "_operator.getitem": 1},
}
OPAQUE = {
    ("bert", "export"): {**_COMMON["export"], f"{A}gather.default": 1},
    ("bert", "dynamo"): {**_COMMON["dynamo"], "torch.gather": 1},
    ("distilbert", "export"): _COMMON["export"],
    ("distilbert", "dynamo"): _COMMON["dynamo"],
    ("gpt2", "export"): _COMMON["export"],
    ("gpt2", "dynamo"): _COMMON["dynamo"],
    ("llama", "export"): {
        **_COMMON["export"],
        "torch.ops.higher_order.wrap_with_set_grad_enabled": 1,
        "_operator.getitem": 2,
        f"{A}silu.default": 2,
    },
    ("llama", "dynamo"): {
        **_COMMON["dynamo"],
        "torch._C._log_api_usage_once": 1,
        "torch.nn.functional.silu": 2,
    },
    ("vit", "export"): {},
    ("vit", "dynamo"): {},
    ("t5", "export"): {
        f"{A}new_ones.default": 2,
        f"{A}index.Tensor": 2,
        f"{A}full_like.default": 2,
        f"{A}min.other": 3,
        f"{A}zeros_like.default": 1,
    },
    ("t5", "dynamo"): {
        "Tensor.new_ones": 2,
        "_operator.getitem": 2,
        "torch.full_like": 2,
        "torch.min": 3,
        "torch.zeros_like": 1,
    },
    ("whisper", "export"): {
        f"{A}new_ones.default": 1,
        f"{A}index.Tensor": 5,
        f"{A}diff.default": 1,
        f"{A}ne.Scalar": 1,
        f"{A}cumsum.default": 1,
    },
    ("whisper", "dynamo"): {
        "Tensor.new_ones": 1,
        "_operator.getitem": 5,
        "torch.diff": 1,
        "_operator.ne": 1,
        "Tensor.cumsum": 1,
    },
}
ATTENTION = {"bert": 2, "distilbert": 2, "gpt2": 2, "llama": 2, "vit": 2, "t5": 6, "whisper": 6}
CASES = sorted(OPAQUE)


@functools.cache
def _case(name: str):
    return fx_models.build(name, "test")


@functools.cache
def _graph(name: str, dialect: str):
    case = _case(name)
    if dialect == "export":
        return torch.export.export(case.model, case.inputs), case.inputs
    return fx_bench.capture(case.model, case.inputs)


def _table(name, dialect, cov) -> str:
    rows = [
        f"{name} ({dialect}): {sum(n - o for n, o in cov.values())} of "
        f"{sum(n for n, _ in cov.values())} call nodes lowered"
    ]
    rows += [
        f"  {op:60} {n:4} {'opaque ' + str(o) if o else ''}" for op, (n, o) in sorted(cov.items())
    ]
    return "\n".join(rows)


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(c))
def test_only_the_listed_ops_stay_opaque(case):
    name, dialect = case
    graph, example = _graph(name, dialect)
    cov = op_coverage(graph, example, freeze=dialect == "dynamo")
    print("\n" + _table(name, dialect, cov))
    opaque = {op: o for op, (_, o) in cov.items() if o}
    allowed = {**OPAQUE[case], SDPA[dialect]: ATTENTION[name]}
    unexpected = sorted(set(opaque) - set(allowed))
    assert not unexpected, f"opaque and not listed: {unexpected}\n{_table(name, dialect, cov)}"
    assert opaque.get(SDPA[dialect]) == ATTENTION[name], _table(name, dialect, cov)
    for op in opaque:
        assert any(word in op for word in WHY), f"{op} has no reason in WHY"


@pytest.mark.parametrize("name", fx_models.NAMES)
def test_exported_model_is_rewritten_around_attention(name):
    """The whole graph is optimized (no skip), nodes go, and the output matches the input
    program's on the example inputs (`optimize_fx` raises FxCheckError if not)."""
    graph, example = _graph(name, "export")
    out, report = optimize_fx(graph, example, allow=["reassoc"])
    assert "skipped" not in report.extra and "in_order" not in report.extra
    assert report.nodes_after < report.nodes_before * 0.9, (report.nodes_before, report.nodes_after)
    assert report.ops_after.get(SDPA["export"]) == ATTENTION[name]
    norms = {"llama": 5, "t5": 5 + 7}.get(name, 0)  # 2 per layer + final; T5's decoder: 3
    assert report.ops_after.get(f"{A}rms_norm.default", 0) == norms, report.ops_after
    with torch.no_grad():
        want = _case(name).model(*example)[0]
    assert want.std() > 0.1  # not a degenerate reference
