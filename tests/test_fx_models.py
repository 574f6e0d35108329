"""Model-level tests of the fx frontend on real architectures (transformers configs, random
weights, nothing downloaded): ResNet as a symbolic_trace, torch.export and torch.compile graph,
BERT and GPT-2 as torch.export and torch.compile graphs.

For each: the optimized module's outputs equal eager outputs (tolerance of the loosest numeric
class that fired), the fx node count goes down, untouched nodes keep their names and metadata,
and BatchNorm is folded into the convolutions of ResNet. torch.compile(backend="rewrite") runs
ResNet through inductor and BERT through eager and matches eager outputs.
"""

import functools
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "examples"))

pytestmark = pytest.mark.slow
R = ("reassoc",)  # numeric classes allowed beyond exact
CASES = [
    ("resnet", "symbolic_trace"),
    ("resnet", "export"),
    ("resnet", "dynamo"),
    ("bert", "export"),
    ("bert", "dynamo"),
    ("gpt2", "export"),
    ("gpt2", "dynamo"),
]


@functools.cache
def _optimized(name: str, dialect: str):
    import fx_bench

    from frontends.fx import optimize_fx

    graph, example, model, inputs = fx_bench.graph_of(name, dialect)
    out, report = optimize_fx(graph, example, allow=R, freeze=dialect == "dynamo")
    return graph, example, model, inputs, out, report


@pytest.fixture(params=CASES, ids=[f"{m}-{d}" for m, d in CASES])
def optimized(request):
    return request.param, _optimized(*request.param)


def _run(module, inputs):
    if isinstance(module, torch.export.ExportedProgram):
        module = module.module()
    with torch.no_grad():
        return torch.utils._pytree.tree_leaves(module(*inputs))


def _tolerance(fp: str):
    from frontends.onnx.check import TOLERANCES

    return TOLERANCES[fp][1]  # float32


def test_outputs_match_eager(optimized):
    (name, dialect), (graph, example, model, inputs, out, report) = optimized
    rtol, atol = _tolerance(report.fp)
    want = _run(model, inputs)
    got = _run(out, example if dialect == "dynamo" else inputs)
    assert len(got) == len(want)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=rtol, atol=atol)


@pytest.mark.parametrize("case", [c for c in CASES if c[1] != "dynamo"], ids=lambda c: "-".join(c))
def test_outputs_match_eager_on_new_random_inputs(case):
    """Shapes came from the example inputs; values must not matter: fresh random inputs (floats
    normal, integers 0 or 1: valid ids and masks) give eager's outputs too."""
    graph, example, model, inputs, out, report = _optimized(*case)
    gen = torch.Generator().manual_seed(1)
    fresh = tuple(
        torch.randn(x.shape, generator=gen).to(x.dtype)
        if x.is_floating_point()
        else torch.randint(0, 2, x.shape, generator=gen).to(x.dtype)
        for x in inputs
    )
    rtol, atol = _tolerance(report.fp)
    for a, b in zip(_run(out, fresh), _run(model, fresh)):
        torch.testing.assert_close(a, b, rtol=rtol, atol=atol)


def test_node_count_goes_down(optimized):
    (name, dialect), (*_, out, report) = optimized
    assert report.stop_reason == "saturated" and report.changed, report.extra
    assert report.nodes_after < report.nodes_before, (report.ops_before, report.ops_after)


def test_untouched_nodes_keep_names_and_meta(optimized):
    (name, dialect), (graph, *_, out, report) = optimized
    before = graph.graph if hasattr(graph, "graph") else graph.graph_module.graph
    after = out.graph
    old = {n.name: n for n in before.nodes}
    kept = [
        n
        for n in after.nodes
        if n.name in old and n.op != "placeholder" and n.target == old[n.name].target
    ]
    assert len(kept) >= report.nodes_after // 3
    for n in kept:
        assert n.meta.get("stack_trace") == old[n.name].meta.get("stack_trace"), n.name
        assert n.meta.get("nn_module_stack") == old[n.name].meta.get("nn_module_stack"), n.name


@pytest.mark.parametrize("dialect", ["symbolic_trace", "export", "dynamo"])
def test_resnet_batchnorm_folded_into_conv(dialect):
    *_, out, report = _optimized("resnet", dialect)
    ops = report.ops_after
    assert not any("batch_norm" in op.lower() for op in ops), ops
    assert sum(c for op, c in ops.items() if "conv" in op.lower()) == 6
    assert report.fired.get("fold-batchnorm-into-conv", 0) == 6
    buffers = [n for n in out.graph.nodes if n.name.startswith("_folded_")]
    assert len(buffers) == 12 and all("weight" in n.name or "bias" in n.name for n in buffers)


def test_bert_attention_scale_folded_and_dropout_gone():
    *_, report = _optimized("bert", "export")
    assert "torch.ops.aten.dropout.default" not in report.ops_after
    assert "torch.ops.aten.mul.Tensor" not in report.ops_after
    assert report.ops_after["torch.ops.aten.linear.default"] == 13


def test_compile_resnet_with_inductor():
    from fx_bench import resnet

    from frontends.fx import backend

    model, inputs = resnet()
    torch._dynamo.reset()
    with torch.no_grad():
        got = torch.compile(model, backend="rewrite")(*inputs)
        want = model(*inputs)
    rtol, atol = _tolerance("reassoc")
    torch.testing.assert_close(got.last_hidden_state, want.last_hidden_state, rtol=rtol, atol=atol)
    torch.testing.assert_close(got.pooler_output, want.pooler_output, rtol=rtol, atol=atol)
    assert backend.REPORTS[-1].fired.get("fold-batchnorm-into-conv") == 6


def test_compile_vit_with_inductor_caches(monkeypatch, tmp_path):
    """With inductor's caches on, the rewritten graph is cacheable: AOTAutograd's cache does not
    bypass it (the rewrite's nodes get dynamo's fake `example_value`s; without them a method
    call such as `.view` on a rewritten linear makes the cache refuse the graph), and a second
    compile hits the cache."""
    import fx_models
    from torch._dynamo.utils import counters

    from frontends.fx import backend

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("TORCHINDUCTOR_FORCE_DISABLE_CACHES", raising=False)
    case = fx_models.build("vit", "test")
    model, inputs = case.model, case.inputs
    with (
        torch.no_grad(),
        torch._inductor.config.patch(fx_graph_cache=True, force_disable_caches=False),
        torch._functorch.config.patch(enable_autograd_cache=True),
    ):
        want = model(*inputs)
        seen = []
        for _ in range(2):
            torch._dynamo.reset()
            counters.clear()
            got = torch.compile(model, backend="rewrite")(*inputs)
            seen.append(dict(counters["aot_autograd"]))
    rtol, atol = _tolerance("reassoc")
    torch.testing.assert_close(got, want, rtol=rtol, atol=atol)
    assert all(float(w.std()) > 1e-2 for w in want)
    assert [c.get("autograd_cache_bypass", 0) for c in seen] == [0, 0], seen
    assert seen[0].get("autograd_cache_miss") == 1 and seen[1].get("autograd_cache_hit") == 1, seen
    assert backend.REPORTS[-1].changed


def test_constants_as_inputs():
    """get_attr tensors become trailing placeholders; the module computes the same."""
    from frontends.fx.backend import constants_as_inputs

    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("w", torch.randn(4, 4))
            self.register_buffer("b", torch.randn(4))

        def forward(self, x, y):
            return torch.nn.functional.linear(x, self.w, self.b) + y

    gm = torch.fx.symbolic_trace(M())
    x, y = torch.randn(3, 4), torch.randn(3, 4)
    out, tensors = constants_as_inputs(gm)
    assert not [n for n in out.graph.nodes if n.op == "get_attr"]
    assert [n.op for n in out.graph.nodes][:4] == ["placeholder"] * 4
    assert [t is getattr(gm, n) for t, n in zip(tensors, ("w", "b"))] == [True, True]
    torch.testing.assert_close(out(x, y, *tensors), gm(x, y), rtol=0, atol=0)
    assert constants_as_inputs(out)[1] == []


def test_compile_bert_with_eager():
    from fx_bench import bert

    from frontends.fx import backend

    model, inputs = bert()
    torch._dynamo.reset()
    with torch.no_grad():
        got = torch.compile(model, backend="rewrite", options={"backend": "eager"})(*inputs)
        want = model(*inputs)
    rtol, atol = _tolerance("reassoc")
    torch.testing.assert_close(got.last_hidden_state, want.last_hidden_state, rtol=rtol, atol=atol)
    report = backend.REPORTS[-1]
    assert report.changed and report.nodes_after < report.nodes_before
