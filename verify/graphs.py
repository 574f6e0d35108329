"""A Hypothesis strategy for random valid ONNX graphs (`onnx_graphs`), to fuzz the optimizer.

A graph is built one move at a time over a pool of typed values (graph inputs, initializers,
node outputs; static and symbolic dimensions), so every node gets inputs it accepts and every
value may be used many times (shared values, fan-out). A move is one op of the op table
(`vocab.ops`) applied to values from the pool, or a motif: a few nodes in the shape that a
shipped rule matches (a Transpose undone by another, x * 1, Conv then BatchNormalization,
MatMul + Add, the decomposed Gelu and LayerNormalization of torch exports, widening Casts,
...), so that rules fire, and fire together. Constants lean towards the values rules look for
(0, 1, -1, 0.5, 2, sqrt 2). Ops outside the op table (Concat) appear too: rules must leave
them alone and still match around them.

Dtypes: mostly float32, also float16, float64, int64, int32 and bool, each only in ops that
accept it (and integer division never by a value that may be 0: that is undefined in ONNX and
kills onnxruntime). Symbolic dimensions are named `N`; inputs get `SYMBOLIC_SIZE` there.

    from hypothesis import given
    from verify.graphs import onnx_graphs

    @given(onnx_graphs())
    def test(model): ...
"""

from __future__ import annotations

import onnx
from hypothesis import strategies as st

from verify.graph_builder import (
    BOOL,
    DIMS,
    DOUBLE,
    FLOAT,
    HALF,
    INT32,
    INT64,
    SYMBOLIC_SIZE,
    Builder,
    Val,
)
from verify.graph_moves import MOVES

__all__ = ["SYMBOLIC_SIZE", "onnx_graphs"]


@st.composite
def onnx_graphs(draw, min_nodes: int = 5, max_nodes: int = 80) -> onnx.ModelProto:
    """Random valid ONNX models (see the module docstring): `min_nodes` to `max_nodes` nodes
    (Constant nodes included), default-domain opset 18 or 20, IR version 10, every input and
    output typed with its shape. Shrinks towards fewer nodes, float32 and the most recent
    values."""
    opset = draw(st.sampled_from((18, 20)))
    b = Builder(draw, opset)
    for _ in range(draw(st.integers(1, 3))):
        dtype = draw(
            st.sampled_from((FLOAT, FLOAT, FLOAT, FLOAT, INT64, HALF, DOUBLE, INT32, BOOL))
        )
        rank = draw(st.integers(0, 4))
        shape = tuple(draw(st.sampled_from(DIMS)) for _ in range(rank))
        if rank and draw(st.integers(0, 3)) == 0:
            shape = ("N", *shape[1:])
        b.input(dtype, shape)
    if not any(v.dtype == FLOAT for v in b.pool):
        b.input(FLOAT, (2, 3, 4, 4) if draw(st.booleans()) else (2, 8))
    target = draw(st.integers(min_nodes, max_nodes))
    tries = 0
    while len(b.nodes) < target and tries < 4 * max_nodes:
        tries += 1
        draw(st.sampled_from(MOVES))(b)
    return b.model(_outputs(b))


def _outputs(b: Builder) -> list[Val]:
    """The values no node reads (the last one always), and now and then one that is read."""
    read = {i for n in b.nodes for i in n.input}
    made = [v for v in b.pool if v.op] or [
        b.add("Identity", [b.pool[0]], b.pool[0].dtype, b.pool[0].shape)
    ]
    outs = [v for v in made if v.name not in read]
    if made and b.draw(st.booleans()):
        outs.append(b.pick(lambda v: bool(v.op) and v not in outs) or made[-1])
    return list({v.name: v for v in outs if v is not None}.values()) or [made[-1]]
