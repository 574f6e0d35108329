"""Generate deep, synthetic-but-realistic ONNX graphs for scalability benchmarks.

``deep_model(n_nodes)`` stacks Llama-style decoder blocks (built directly with
``onnx.helper``; exporting ``LlamaModel`` with torch takes ~0.4 s per layer, far
too slow for 50k nodes) until the graph has about ``n_nodes`` nodes.  Each block
uses only primitive ops, in the shapes a torch export produces:

* RMSNorm as Pow/ReduceMean/Add/Sqrt/Reciprocal/Mul/Mul,
* q/k/v projections (MatMul, Reshape, Transpose), rotary embeddings
  (Mul/Slice/Slice/Neg/Concat/Mul/Add), scaled masked Softmax attention,
* SwiGLU MLP with SiLU spelled as Sigmoid * x.

Every block also carries the peephole opportunities typically left behind by
exporters (all of them semantically neutral):

* ``Identity`` of a shared (deduplicated) norm weight, as the TorchScript
  exporter emits for tied parameters,
* ``Transpose(0,2,1,3)`` immediately undone by another ``Transpose(0,2,1,3)``
  (the q heads are transposed, then transposed back for rotary in BSHD layout),
* ``Reshape`` straight into another ``Reshape`` ([1,S,H] -> [S,H]),
* a 2-D ``MatMul`` followed by a bias ``Add`` (the o_proj; fusable into Gemm),
* ``Mul`` by a constant 1.0 (a Granite-style ``residual_multiplier``),
* an inference-mode ``Dropout`` on the attention probabilities.

Weights are shared between blocks: block ``i`` uses weight set ``i % WEIGHT_SETS``
(shape constants and rotary tables are shared by all blocks), so 50k nodes stay
a few MB.  Models pin IR version 10 and default-domain opset 18.

Usage::

    python bench/make_deep.py N OUT.onnx [--no-check]
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 18
IR_VERSION = 10
BATCH, SEQ, HIDDEN, HEADS, FFN, VOCAB = 1, 16, 32, 2, 64, 100
HEAD_DIM = HIDDEN // HEADS
WEIGHT_SETS = 4
NODES_PER_BLOCK = 62
NODES_OUTSIDE_BLOCKS = 8  # embedding Gather + final RMSNorm (7)
INT64_MAX = np.iinfo(np.int64).max


class _Builder:
    """Accumulates nodes and initializers with legacy-exporter style names."""

    def __init__(self, rng: np.random.Generator):
        self.rng, self.nodes, self.inits, self.counts = rng, [], {}, {}

    def const(self, name: str, value) -> str:
        """Register an initializer once (later calls reuse it) and return its name."""
        if name not in self.inits:
            self.inits[name] = numpy_helper.from_array(np.asarray(value), name)
        return name

    def weight(self, name: str, *shape: int) -> str:
        """A random float32 weight initializer (std 0.02, like HF init)."""
        if name not in self.inits:
            self.const(name, (self.rng.standard_normal(shape) * 0.02).astype(np.float32))
        return name

    def norm_weight(self, name: str) -> str:
        """A norm scale initializer: ones plus a little noise."""
        if name not in self.inits:
            self.const(name, (1 + self.rng.standard_normal(HIDDEN) * 0.02).astype(np.float32))
        return name

    def op(self, scope: str, op_type: str, *inputs: str, out: str | None = None, **attrs) -> str:
        """Add node ``scope/OpType[_k]`` and return its (single) output name."""
        key = f"{scope}/{op_type}"
        k = self.counts.get(key, 0)
        self.counts[key] = k + 1
        name = f"{key}_{k}" if k else key
        out = out or f"{name}_output_0"
        self.nodes.append(helper.make_node(op_type, list(inputs), [out], name=name, **attrs))
        return out


def _shared_constants(b: _Builder) -> dict:
    """Scalars, shape tensors, causal mask and rotary tables used by every block."""
    c = {
        k: b.const(k, np.array(v, np.float32))
        for k, v in [
            ("two", 2.0),
            ("eps", 1e-6),
            ("one", 1.0),
            ("scale", HEAD_DIM**-0.5),
            ("dropout_ratio", 0.1),
        ]
    }
    for k, v in [
        ("axes_last", [-1]),
        ("shape_bshd", [BATCH, SEQ, HEADS, HEAD_DIM]),
        ("shape_bsh", [BATCH, SEQ, HIDDEN]),
        ("shape_2d", [BATCH * SEQ, HIDDEN]),
        ("half_start", [0]),
        ("half_mid", [HEAD_DIM // 2]),
        ("half_end", [INT64_MAX]),
        ("step_1", [1]),
    ]:
        c[k] = b.const(k, np.array(v, np.int64))
    mask = np.triu(np.full((SEQ, SEQ), np.finfo(np.float32).min, np.float32), 1)
    c["mask"] = b.const("causal_mask", mask.reshape(1, 1, SEQ, SEQ))
    inv_freq = 1.0 / 10000 ** (np.arange(0, HEAD_DIM, 2) / HEAD_DIM)
    angles = np.outer(np.arange(SEQ), inv_freq)
    angles = np.concatenate([angles, angles], -1).reshape(1, SEQ, 1, HEAD_DIM)
    c["cos"] = b.const("rotary.cos", np.cos(angles).astype(np.float32))
    c["sin"] = b.const("rotary.sin", np.sin(angles).astype(np.float32))
    return c


def _rms_norm(b: _Builder, c: dict, scope: str, x: str, weight: str, out: str | None = None) -> str:
    """RMSNorm decomposed into primitives (7 nodes)."""
    sq = b.op(scope, "Pow", x, c["two"])
    mean = b.op(scope, "ReduceMean", sq, c["axes_last"], keepdims=1)
    rstd = b.op(scope, "Reciprocal", b.op(scope, "Sqrt", b.op(scope, "Add", mean, c["eps"])))
    return b.op(scope, "Mul", weight, b.op(scope, "Mul", x, rstd), out=out)


def _rotary(b: _Builder, c: dict, scope: str, x: str) -> str:
    """x * cos + rotate_half(x) * sin on a [B, S, heads, head_dim] tensor (7 nodes)."""
    x1 = b.op(scope, "Slice", x, c["half_start"], c["half_mid"], c["axes_last"], c["step_1"])
    x2 = b.op(scope, "Slice", x, c["half_mid"], c["half_end"], c["axes_last"], c["step_1"])
    rot = b.op(scope, "Concat", b.op(scope, "Neg", x2), x1, axis=-1)
    return b.op(scope, "Add", b.op(scope, "Mul", x, c["cos"]), b.op(scope, "Mul", rot, c["sin"]))


def _block(b: _Builder, c: dict, i: int, x: str) -> str:
    """One decoder layer (``NODES_PER_BLOCK`` nodes); returns its output name."""
    s, w = f"/layers.{i}", f"layers.{i % WEIGHT_SETS}"
    perm = dict(perm=[0, 2, 1, 3])
    # Pre-attention RMSNorm; its weight is an Identity of a shared initializer.
    norm_w = b.op(f"{s}/input_layernorm", "Identity", b.norm_weight("input_layernorm.weight"))
    h = _rms_norm(b, c, f"{s}/input_layernorm", x, norm_w)
    a = f"{s}/self_attn"

    def heads(name: str) -> str:
        proj = b.op(f"{a}/{name}", "MatMul", h, b.weight(f"{w}.{name}.weight", HIDDEN, HIDDEN))
        return b.op(a, "Reshape", proj, c["shape_bshd"])

    q = b.op(a, "Transpose", b.op(a, "Transpose", heads("q_proj"), **perm), **perm)
    q = b.op(a, "Transpose", _rotary(b, c, f"{a}/rotary_q", q), **perm)
    k_t = b.op(a, "Transpose", _rotary(b, c, f"{a}/rotary_k", heads("k_proj")), perm=[0, 2, 3, 1])
    v = b.op(a, "Transpose", heads("v_proj"), **perm)
    scores = b.op(a, "Add", b.op(a, "Mul", b.op(a, "MatMul", q, k_t), c["scale"]), c["mask"])
    probs = b.op(a, "Dropout", b.op(a, "Softmax", scores, axis=-1), c["dropout_ratio"])
    ctx = b.op(
        a, "Reshape", b.op(a, "Transpose", b.op(a, "MatMul", probs, v), **perm), c["shape_bsh"]
    )
    o = f"{a}/o_proj"
    flat = b.op(o, "Reshape", ctx, c["shape_2d"])
    proj = b.op(o, "MatMul", flat, b.weight(f"{w}.o_proj.weight", HIDDEN, HIDDEN))
    proj = b.op(o, "Add", proj, b.weight(f"{w}.o_proj.bias", HIDDEN))
    proj = b.op(o, "Reshape", proj, c["shape_bsh"])
    x = b.op(s, "Add", x, b.op(s, "Mul", proj, c["one"]))  # residual_multiplier = 1.0
    # SwiGLU MLP.
    norm_w = b.op(
        f"{s}/post_attention_layernorm",
        "Identity",
        b.norm_weight("post_attention_layernorm.weight"),
    )
    h = _rms_norm(b, c, f"{s}/post_attention_layernorm", x, norm_w)
    m = f"{s}/mlp"
    gate = b.op(m, "MatMul", h, b.weight(f"{w}.mlp.gate_proj.weight", HIDDEN, FFN))
    silu = b.op(m, "Mul", gate, b.op(m, "Sigmoid", gate))
    up = b.op(m, "MatMul", h, b.weight(f"{w}.mlp.up_proj.weight", HIDDEN, FFN))
    down = b.op(
        m, "MatMul", b.op(m, "Mul", silu, up), b.weight(f"{w}.mlp.down_proj.weight", FFN, HIDDEN)
    )
    return b.op(s, "Add", x, down)


def deep_model(n_nodes: int, seed: int = 0) -> onnx.ModelProto:
    """A Llama-like decoder with about ``n_nodes`` nodes (at least one block).

    Input ``input_ids`` int64 [1, 16]; output ``last_hidden_state`` float32
    [1, 16, 32].  Deterministic for a given ``seed``.
    """
    n_blocks = max(1, round((n_nodes - NODES_OUTSIDE_BLOCKS) / NODES_PER_BLOCK))
    b = _Builder(np.random.default_rng(seed))
    c = _shared_constants(b)
    x = b.op(
        "/embed_tokens",
        "Gather",
        b.weight("embed_tokens.weight", VOCAB, HIDDEN),
        "input_ids",
        axis=0,
    )
    for i in range(n_blocks):
        x = _block(b, c, i, x)
    _rms_norm(b, c, "/norm", x, b.norm_weight("norm.weight"), out="last_hidden_state")
    assert len(b.nodes) == NODES_OUTSIDE_BLOCKS + n_blocks * NODES_PER_BLOCK
    graph = helper.make_graph(
        b.nodes,
        f"deep_llama_{n_blocks}_layers",
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64, [BATCH, SEQ])],
        [
            helper.make_tensor_value_info(
                "last_hidden_state", TensorProto.FLOAT, [BATCH, SEQ, HIDDEN]
            )
        ],
        initializer=list(b.inits.values()),
    )
    model = helper.make_model(
        graph, producer_name="bench/make_deep.py", opset_imports=[helper.make_opsetid("", OPSET)]
    )
    model.ir_version = IR_VERSION
    return model


def check(model: onnx.ModelProto) -> float:
    """Run onnx.checker (full_check) and one onnxruntime CPU inference.

    Returns the seconds spent; raises if either step fails.
    """
    import onnxruntime as ort

    start = time.perf_counter()
    onnx.checker.check_model(model, full_check=True)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    ids = np.random.default_rng(0).integers(0, VOCAB, (BATCH, SEQ)).astype(np.int64)
    (out,) = sess.run(None, {"input_ids": ids})
    assert out.shape == (BATCH, SEQ, HIDDEN) and np.isfinite(out).all()
    return time.perf_counter() - start


def main(argv=None) -> None:
    """CLI: ``make_deep.py N OUT.onnx`` writes a model with about N nodes."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("n_nodes", type=int)
    parser.add_argument("out")
    parser.add_argument(
        "--no-check", action="store_true", help="skip onnx.checker and the onnxruntime smoke run"
    )
    args = parser.parse_args(argv)
    start = time.perf_counter()
    model = deep_model(args.n_nodes)
    built = time.perf_counter() - start
    onnx.save_model(model, args.out, save_as_external_data=False)
    msg = (
        f"{len(model.graph.node)} nodes, {len(model.graph.initializer)} initializers, "
        f"{os.path.getsize(args.out) / 2**20:.2f} MiB, built in {built:.2f} s"
    )
    if not args.no_check:
        msg += f", checked + ran in {check(model):.2f} s"
    print(f"{msg} -> {args.out}")


if __name__ == "__main__":
    main()
