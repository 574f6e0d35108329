"""Effects in fx graphs (`frontends.fx.effects`): which nodes write, alias, draw random numbers
or switch global state, decided from ATen schemas; and what the importer does with them: pure
ops (attention without dropout, eval dropout) are rewritten around, in-place writes to shared
storage pin only the nodes that touch that storage, random draws keep their order, and only a
global switch leaves the whole graph unchanged."""

import operator

import pytest
import torch
import torch.nn.functional as F
from torch import fx, nn

from frontends.fx import effects, fx_op_counts, import_fx, optimize_fx

aten = torch.ops.aten


def _graph_of(fn, *args):
    """An fx graph with one call_function node `fn(*args)` over placeholders, and that node."""
    g = fx.Graph()
    phs = [g.placeholder(f"a{i}") if isinstance(a, str) else a for i, a in enumerate(args)]
    n = g.call_function(fn, tuple(phs))
    g.output(n)
    return fx.GraphModule(nn.Module(), g), n


# ---- classification from schemas -----------------------------------------------------------


@pytest.mark.parametrize(
    "fn, args, writes",
    [
        (aten.add_.Tensor, ("x", "y"), True),
        (aten.add.Tensor, ("x", "y"), False),
        (aten.copy_.default, ("x", "y"), True),
        (aten.index_put_.default, ("x", "i", "v"), True),
        (aten.view.default, ("x", [3]), False),
    ],
)
def test_writes_come_from_the_schema(fn, args, writes):
    gm, n = _graph_of(fn, *args)
    target = effects.written(n)
    assert (target is not None) == writes
    if writes:
        assert target.name == "a0"


@pytest.mark.parametrize(
    "fn, args, aliases",
    [
        (aten.view.default, ("x", [3]), True),
        (aten.transpose.int, ("x", 0, 1), True),
        (aten.slice.Tensor, ("x", 0, 0, 1), True),
        (aten.expand.default, ("x", [3, 3]), True),
        (aten.add.Tensor, ("x", "y"), False),
        (aten.mul.Tensor, ("x", "y"), False),
        (aten.linear.default, ("x", "w"), False),
        (aten.dropout.default, ("x", 0.1, False), True),  # returns its input in eval mode
        (torch.relu, ("x",), False),  # judged by its ATen form
        (torch.reshape, ("x", [3]), True),
        (torch.cumsum, ("x", 0), False),
    ],
)
def test_aliasing_comes_from_the_schema(fn, args, aliases):
    gm, n = _graph_of(fn, *args)
    assert effects.may_alias(n) == aliases


@pytest.mark.parametrize(
    "fn, args, kwargs, draws",
    [
        (aten.scaled_dot_product_attention.default, ("q", "k", "v"), {}, False),
        (aten.scaled_dot_product_attention.default, ("q", "k", "v", None, 0.0), {}, False),
        (aten.scaled_dot_product_attention.default, ("q", "k", "v", None, 0.1), {}, True),
        (aten.dropout.default, ("x", 0.1, False), {}, False),
        (aten.dropout.default, ("x", 0.0, True), {}, False),
        (aten.dropout.default, ("x", 0.1, True), {}, True),
        (aten.bernoulli.p, ("x", 0.0), {}, True),  # draws whatever p is
        (F.dropout, ("x",), {"training": False}, False),
        (F.dropout, ("x", 0.1), {}, True),  # F.dropout trains by default
        (F.scaled_dot_product_attention, ("q", "k", "v"), {"dropout_p": 0.2}, True),
        (F.scaled_dot_product_attention, ("q", "k", "v"), {}, False),
        (torch.rand_like, ("x",), {}, True),
        (aten.add.Tensor, ("x", "y"), {}, False),
    ],
)
def test_random_draws_are_ops_whose_randomness_is_on(fn, args, kwargs, draws):
    gm, n = _graph_of(fn, *args)
    n.kwargs = kwargs
    assert effects.random_draw(n) == draws
    effects.check_switch(n)  # neither a draw nor a pure op is a switch


def test_sdpa_is_impure_to_torch_but_pure_here():
    gm, n = _graph_of(aten.scaled_dot_product_attention.default, "q", "k", "v")
    assert n.is_impure()  # torch's answer: the nondeterministic_seeded tag
    order = effects.plan(gm)
    assert not order.pinned and not order.chain


# ---- the importer and the optimizer --------------------------------------------------------


class Attention(nn.Module):
    """Two projections, sdpa, an output projection; `x * 1.0` and a double transpose for
    the rules to remove around the attention."""

    def __init__(self, p: float = 0.0):
        super().__init__()
        self.qkv, self.out, self.p = nn.Linear(32, 96), nn.Linear(32, 32), p

    def forward(self, x):
        b, s = x.size(0), x.size(1)
        h = self.qkv(x * 1.0)
        q, k, v = (h[..., i : i + 32].reshape(b, s, 4, 8).transpose(1, 2) for i in (0, 32, 64))
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=self.p, is_causal=True)
        return self.out(y.transpose(1, 2).transpose(1, 2).transpose(1, 2).reshape(b, s, 32))


def _trained(model):
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.1)
    return model


@pytest.mark.parametrize("dialect", ["export", "symbolic_trace"])
def test_graph_with_sdpa_is_rewritten_around_it(dialect):
    model, x = _trained(Attention()).eval(), torch.randn(2, 6, 32)
    graph = (
        torch.export.export(model, (x,)) if dialect == "export" else torch.fx.symbolic_trace(model)
    )
    out, report = optimize_fx(graph, (x,))
    assert "skipped" not in report.extra and "in_order" not in report.extra
    assert report.changed and report.nodes_after < report.nodes_before
    assert {"mul-one", "transpose-transpose"} <= set(report.fired), report.fired
    assert any("scaled_dot_product_attention" in op for op in report.ops_after)
    run = out.module() if dialect == "export" else out
    want = model(x)
    assert want.std() > 0.1
    torch.testing.assert_close(run(x), want, rtol=1e-5, atol=1e-6)


def test_random_draws_keep_their_order():
    """Two dropouts in training read one generator; the rewritten graph draws in the same
    order, so the same seed gives the same outputs. The output tuple lists the second draw
    first: data flow alone would let it run first."""

    class M(nn.Module):
        def forward(self, x):
            a = F.dropout(x, 0.5, training=True)
            b = F.dropout(torch.relu(torch.relu(x)), 0.5, training=True)
            return b * 1.0, a

    gm, x = torch.fx.symbolic_trace(M()), torch.randn(64)
    out, report = optimize_fx(gm, (x,), check=False)
    assert report.changed and {"mul-one", "idempotent-relu"} <= set(report.fired)
    drops = [n.name for n in out.graph.nodes if n.target is F.dropout]
    assert drops == ["dropout", "dropout_1"]
    g = import_fx(gm, (x,))
    second = next(n for n in g.nodes if n.name == "dropout_1")
    assert len(second.implicit) == 1
    for seed in (0, 1):
        torch.manual_seed(seed)
        want = gm(x)
        torch.manual_seed(seed)
        got = out(x)
        assert not torch.equal(want[0], want[1])
        for a, b in zip(got, want):
            torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_in_place_write_to_an_input_pins_its_readers_only():
    class M(nn.Module):
        def forward(self, x, w):
            y = x * 1.0  # must stay a copy: x changes below
            x.add_(1.0)
            z = torch.relu(torch.relu(w * 1.0))  # nothing to do with x: rewritten
            return y + x, z

    gm = torch.fx.symbolic_trace(M())
    x, w = torch.randn(5), torch.randn(5)
    out, report = optimize_fx(gm, (x.clone(), w), check=False)
    assert "skipped" not in report.extra
    assert "in-place add_ on x" in report.extra["in_order"]
    assert {"mul-one", "idempotent-relu"} <= set(report.fired)
    muls = [n for n in out.graph.nodes if n.target is operator.mul]
    assert [n.args for n in muls] == [(out.graph.find_nodes(op="placeholder")[0], 1.0)]
    assert fx_op_counts(out)["torch.relu"] == 1
    x1, x2 = x.clone(), x.clone()
    want, got = gm(x1, w), out(x2, w)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    torch.testing.assert_close(x2, x1, rtol=0, atol=0)  # the write to x still happens
    torch.testing.assert_close(x1, x + 1, rtol=0, atol=0)


def test_in_place_write_through_a_view_pins_the_storage_it_views():
    """`a` is written through a view: a * 1.0 must stay a copy of x (else x is written), and
    readers of the view see the write."""

    class M(nn.Module):
        def forward(self, x):
            a = x * 1.0
            t = a.transpose(0, 1)
            t.mul_(2.0)
            return a.transpose(0, 1).transpose(0, 1) + 0.0, torch.relu(torch.relu(x))

    gm, x = torch.fx.symbolic_trace(M()), torch.randn(3, 4)
    before = x.clone()
    out, report = optimize_fx(gm, (x,), check=False)
    assert "idempotent-relu" in report.fired
    assert fx_op_counts(out)["_operator.mul"] == 1  # a * 1.0 stays a copy of x
    assert "in-place mul_ on transpose" in report.extra["in_order"]
    got, want = out(x), gm(before.clone())
    torch.testing.assert_close(x, before, rtol=0, atol=0)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    torch.testing.assert_close(got[0], 2 * x)


def test_in_place_op_without_a_pure_form_pins_what_it_writes():
    """`y.clamp_(min=t)` on a fresh value: lowered pure when it can be; `index_fill_` has no
    canonical form, so its target's producer must stay a copy (not become x)."""

    class M(nn.Module):
        def forward(self, x):
            y = x * 1.0
            return y.index_fill_(0, torch.tensor([0]), 5.0)

    gm, x = torch.fx.symbolic_trace(M()), torch.randn(3)
    before = x.clone()
    out, report = optimize_fx(gm, (x,), check=False)
    assert fx_op_counts(out)["_operator.mul"] == 1  # y stays a copy of x
    assert "index_fill_" in report.extra["in_order"]
    torch.testing.assert_close(out(x), gm(before.clone()), rtol=0, atol=0)
    torch.testing.assert_close(x, before, rtol=0, atol=0)


def test_grad_mode_switch_leaves_the_graph_unchanged():
    class M(nn.Module):
        def forward(self, x):
            with torch.no_grad():
                y = torch.relu(torch.relu(x))
            return y * 2

    seen = []

    def grab(gm, example_inputs):
        seen.append((gm, example_inputs))
        return gm.forward

    torch._dynamo.reset()
    x = torch.randn(3, requires_grad=True)
    torch.compile(M(), backend=grab)(x)
    gm, example = seen[0]
    assert any(n.target is torch._C._set_grad_enabled for n in gm.graph.nodes)
    out, report = optimize_fx(gm, example)
    assert out is gm and "_set_grad_enabled" in report.extra["skipped"]
