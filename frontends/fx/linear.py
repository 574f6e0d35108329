"""Writing matrix products back the way torch spells them: F.linear.

ONNX has no linear op, so `x @ w.T + b` is imported as MatMul (by the transposed weight) and
Add, or as Gemm; rules may also turn a batched MatMul + Add into Reshape, Gemm, Reshape. Written
back one canonical node at a time that would be up to four torch calls and a transposed copy of
the weight, where the source had one `linear`. Before export, `plan_linears` finds these shapes
among rewritten nodes and plans one F.linear for each:

    Add(MatMul(x, W), b)                    -> linear(x, W.T, b)   W a 2-D constant, b 1-D
    MatMul(x, W)                            -> linear(x, W.T)
    Gemm(x, B, c) (alpha = beta = 1)        -> linear(x, B if transB else B.T, c)
    Reshape(Gemm(Reshape(x, (-1, K)), ..), s)  -> linear(x, ...), reshaped to s if needed

W.T is the source parameter itself when W was imported as its transpose, otherwise a new buffer
holding the transposed values; a W that is an untransposed source parameter is left to matmul.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from vocab.graph import ABSENT


@dataclass(frozen=True)
class Linear:
    """One planned F.linear: input x, the constant `weight` (transposed first if `transpose`),
    an optional bias, the nodes that name them, and an optional reshape of the result."""

    x: int
    weight: int
    transpose: bool
    weight_user: object
    bias: int | None = None
    bias_user: object = None
    bias_slot: int = 0
    reshape: int | None = None  # shape constant to reshape the result to


def plan_linears(ex, copied: set[int]) -> tuple[set[int], dict[int, Linear]]:
    """(ids of nodes folded into a linear, id of the node that writes it -> its plan)."""
    g = ex.g
    producer = {n.outputs[0]: n for n in g.nodes}
    single = lambda v: len(ex.users[v]) == 1 and v not in g.outputs  # noqa: E731
    plans: dict[int, Linear] = {}
    skip: set[int] = set()
    for n in g.nodes:
        if id(n) in copied:
            continue
        if n.op == "MatMul" and _weight_ok(ex, n.inputs[1], True):
            plans[id(n)] = Linear(n.inputs[0], n.inputs[1], True, n)
        elif n.op == "Gemm" and _gemm_ok(ex, n):
            c = None if n.inputs[2] == ABSENT else n.inputs[2]
            plans[id(n)] = Linear(n.inputs[0], n.inputs[1], not n.attr("transB"), n, c, n, 2)
        elif n.op == "Add":
            for slot, (m, b) in enumerate(((n.inputs[0], n.inputs[1]), (n.inputs[1], n.inputs[0]))):
                mm = producer.get(m)
                plan = plans.get(id(mm)) if mm is not None and mm.op == "MatMul" else None
                if plan is not None and single(m) and _bias_ok(ex, b, plan.weight):
                    plans[id(n)] = replace(plan, bias=b, bias_user=n, bias_slot=1 - slot)
                    del plans[id(mm)]
                    skip.add(id(mm))
                    break
        elif n.op == "Reshape":
            _through_reshapes(ex, n, producer, single, plans, skip, copied)
    return skip, plans


def _through_reshapes(ex, n, producer, single, plans, skip, copied) -> None:
    """Reshape(Gemm(Reshape(x, (-1, K))), s) -> linear(x), reshaped to s unless s is already
    x.shape[:-1] + (N,). The inner Reshape stays when something else reads it."""
    gemm = producer.get(n.inputs[0])
    plan = plans.get(id(gemm)) if gemm is not None else None
    inner = producer.get(plan.x) if plan is not None else None
    if inner is None or inner.op != "Reshape" or not single(gemm.outputs[0]):
        return
    x, mid, out = (ex.g.values[v].type for v in (inner.inputs[0], inner.outputs[0], n.outputs[0]))
    if not (x.static and mid.static and out.static) or x.rank < 2 or mid.shape[-1] != x.shape[-1]:
        return
    direct = out.shape == (*x.shape[:-1], ex.g.values[gemm.outputs[0]].type.shape[1])
    plans[id(n)] = replace(plan, x=inner.inputs[0], reshape=None if direct else n.inputs[1])
    del plans[id(gemm)]
    skip.add(id(gemm))
    if single(inner.outputs[0]) and id(inner) not in copied:
        skip.add(id(inner))


def _gemm_ok(ex, n) -> bool:
    if n.attr("alpha") != 1.0 or n.attr("beta") != 1.0 or n.attr("transA"):
        return False
    c = n.inputs[2]
    if c != ABSENT and not _bias_ok(ex, c, n.inputs[1], n.attr("transB")):
        return False
    return bool(n.attr("transB")) or _weight_ok(ex, n.inputs[1], True)


def _weight_ok(ex, vid: int, transpose: bool) -> bool:
    """A 2-D constant whose transpose export can write without a transpose node."""
    t, src = ex.g.values[vid].type, ex.source(vid)
    if vid not in ex.g.constants or t.rank != 2:
        return False
    return not transpose or src is None or src.kind == "value" or src.transposed


def _bias_ok(ex, vid: int, weight: int, transposed: bool = False) -> bool:
    t, w = ex.g.values[vid].type, ex.g.values[weight].type
    n = w.shape[0] if transposed else w.shape[1]
    return t.rank == 1 and t.shape[0] == n and t.dtype == w.dtype
