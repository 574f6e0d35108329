"""How the int8 error of a transformer spreads over its products: measured sensitivity.

    python bench/quant_sensitivity.py                        # BERT-base and DistilBERT
    python bench/quant_sensitivity.py --models gpt2 --weights pairs --fraction 0.5

Why: `rewrite quantize --error-budget E` keeps products in float until the measured error is
within E. At half of what quantizing every product costs (the issue's target: half of
onnxruntime's error), BERT-base kept about half its products float (0.66-0.80x of the float
latency, not 0.50x). This measures whether any choice of products could do better: if a few
products carried most of the error, keeping those float would meet the budget cheaply.

For each model (bench/models.py's full-size TorchScript export, generated when missing), a copy
in which every MatMul or Gemm by a constant 2-D weight reads its activation through
DynamicQuantizeLinear + DequantizeLinear (uint8, one scale per tensor, as `rewrite quantize
--mode dynamic` quantizes it) and its weight rounded to int8 with one step per output column
(`--weights full-range`: `vocab.registry.full_range_steps`, what `--cpu vnni` writes; `pairs`:
`pair_steps`, the default's), each product behind a boolean switch input (Where), so that one
onnxruntime session runs any subset quantized. This is fake quantization: the integer kernels
compute the same products from the same 8-bit values, up to float32 rounding. Embedding tables
stay float (their quantization saves memory, not time). With `--activations row` each row of an
activation (a token's vector) gets its own uint8 scale and zero point, as DynamicQuantizeLinear
computes them for a whole tensor (per-token dynamic quantization, which no onnxruntime kernel
runs fused: this measures whether it would be worth building). Each product has two switches, its
activation's and its weight's. Then, the error being the worst output's max |q - ref| / max |ref|
over the inputs (bench/quant.py's):

* all quantized, on `--calibration` inputs (seeds 1000..) and `--inputs` held-out ones (0..);
  and with only the weights, and only the activations, quantized: how the error splits;
* leave one out: per product, the calibration error with it alone in float; its drop from the
  all-quantized error is its measured share;
* greedy, in two orders: products put back in float in the order of their drops, largest
  first, and of their drops per multiply-add (the most error removed per unit of work kept in
  float), until the calibration error is within `--fraction` of the all-quantized one: how
  many, their share of the products' multiply-adds (rows * K * N on bench/models.py's main
  input: BERT's pooler reads one row, the token projections one per token), and the errors
  then.

Prints one row per model. Takes about 2 minutes for BERT-base on 2 cores.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from vocab.registry import full_range_steps, pair_steps

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))
import models as M  # noqa: E402  (bench/models.py, beside this file)
from quant import worst_output  # noqa: E402  (bench/quant.py's error measure)

STEPS = {"full-range": full_range_steps, "pairs": lambda w: pair_steps(w, per_column=True)}


def switched(
    model: onnx.ModelProto, weights: str, activations: str = "tensor"
) -> tuple[onnx.ModelProto, list, list]:
    """`model` with each product by a constant 2-D weight fake-quantized behind two switches
    (bool graph inputs `fq{i}_a`, its activation, and `fq{i}_w`, its weight); returns the model
    and per product its activation's name and its weight's (K, N). `activations`: `tensor`
    (DynamicQuantizeLinear + DequantizeLinear) or `row` (the same per row, `_per_row`)."""
    inits = {i.name: i for i in model.graph.initializer}
    nodes, names, sizes = [], [], []
    for n in model.graph.node:
        w = inits.get(n.input[1]) if n.op_type in ("MatMul", "Gemm") and len(n.input) > 1 else None
        value = numpy_helper.to_array(w).astype(np.float32) if w is not None else None
        if value is None or value.ndim != 2:
            nodes.append(n)
            continue
        transposed = n.op_type == "Gemm" and any(
            a.name == "transB" and a.i == 1 for a in n.attribute
        )
        kn = value.T if transposed else value  # [K, N]
        steps = STEPS[weights](kn)
        rounded = np.clip(np.rint(kn / steps), -127, 127) * steps
        p = f"fq{len(names)}_"
        model.graph.initializer.append(
            numpy_helper.from_array(
                (rounded.T if transposed else rounded).astype(np.float32), p + "wq"
            )
        )
        model.graph.input.extend(
            helper.make_tensor_value_info(p + part, TensorProto.BOOL, []) for part in "aw"
        )
        if activations == "row":
            nodes += _per_row(model, n.input[0], p)
        else:
            nodes += [
                helper.make_node(
                    "DynamicQuantizeLinear", [n.input[0]], [p + "q", p + "s", p + "z"]
                ),
                helper.make_node("DequantizeLinear", [p + "q", p + "s", p + "z"], [p + "xq"]),
            ]
        nodes += [
            helper.make_node("Where", [p + "a", p + "xq", n.input[0]], [p + "x"]),
            helper.make_node("Where", [p + "w", p + "wq", n.input[1]], [p + "wsel"]),
        ]
        names.append(n.input[0])
        n.input[0], n.input[1] = p + "x", p + "wsel"
        nodes.append(n)
        sizes.append(kn.shape)
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    return model, names, sizes


def _per_row(model: onnx.ModelProto, x: str, p: str) -> list:
    """Nodes computing `{p}xq`, x fake-quantized to uint8 with one scale and zero point per row
    (last axis): DynamicQuantizeLinear's formulas (ONNX spec: the range [min(x, 0), max(x, 0)]
    over 255 levels, zero point round(-min / s) saturated to [0, 255]) taken along the last
    axis, the row's values then rounded and saturated as QuantizeLinear does."""
    for name, v in (("0", 0.0), ("255", 255.0), ("tiny", np.finfo(np.float32).tiny)):
        model.graph.initializer.append(numpy_helper.from_array(np.float32(v), p + name))
    node = helper.make_node
    return [
        node("ReduceMax", [x], [p + "hi0"], axes=[-1], keepdims=1),
        node("ReduceMin", [x], [p + "lo0"], axes=[-1], keepdims=1),
        node("Max", [p + "hi0", p + "0"], [p + "hi"]),
        node("Min", [p + "lo0", p + "0"], [p + "lo"]),
        node("Sub", [p + "hi", p + "lo"], [p + "range"]),
        node("Div", [p + "range", p + "255"], [p + "s0"]),
        node("Max", [p + "s0", p + "tiny"], [p + "s"]),  # a row of zeros: any scale
        node("Div", [p + "lo", p + "s"], [p + "lo_s"]),
        node("Neg", [p + "lo_s"], [p + "z0"]),
        node("Round", [p + "z0"], [p + "z1"]),
        node("Clip", [p + "z1", p + "0", p + "255"], [p + "z"]),
        node("Div", [x, p + "s"], [p + "xs"]),
        node("Round", [p + "xs"], [p + "xr"]),
        node("Add", [p + "xr", p + "z"], [p + "xz"]),
        node("Clip", [p + "xz", p + "0", p + "255"], [p + "q"]),
        node("Sub", [p + "q", p + "z"], [p + "d"]),
        node("Mul", [p + "d", p + "s"], [p + "xq"]),
    ]


def multiply_adds(src: Path, activations: list, sizes: list, feeds: dict) -> np.ndarray:
    """Each product's multiply-adds on `feeds`: rows * K * N, the rows read from a run of the
    float model with the activations as extra outputs (BERT's pooler reads one row, the
    token projections a row per token)."""
    model = onnx.load(src)
    model.graph.output.extend(
        helper.make_tensor_value_info(a, TensorProto.FLOAT, None) for a in activations
    )
    run = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    values = run.run(activations, feeds)
    return np.array([v.size // k * k * n for v, (k, n) in zip(values, sizes)], dtype=np.float64)


def measure(name: str, args) -> str:
    """One table row for model `name` (see the module docstring)."""
    (_, _, src, failure), *_ = M.ensure([name], ["torchscript"])
    if src is None:
        raise SystemExit(f"{name}: the TorchScript export failed: {failure}")
    model, activations, sizes = switched(onnx.load(src), args.weights, args.activations)
    macs = multiply_adds(src, activations, sizes, M.make_inputs(name))
    so = ort.SessionOptions()
    so.intra_op_num_threads = args.threads
    ref = ort.InferenceSession(str(src), so, providers=["CPUExecutionProvider"])
    fq = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])

    def feeds(seeds):
        return [(f, ref.run(None, f)) for f in (M.make_inputs(name, seed=s) for s in seeds)]

    cal = feeds(range(1000, 1000 + args.calibration))
    held = feeds(range(args.inputs))
    n = len(activations)

    def error(quantized: np.ndarray, data, parts: str = "aw") -> float:
        """The worst error over `data` with the products `quantized` quantized: their
        activations (`a` in `parts`) and weights (`w`)."""
        switches = {
            f"fq{i}_{part}": np.array(bool(quantized[i]) and part in parts)
            for i in range(n)
            for part in "aw"
        }
        return max(worst_output(want, fq.run(None, {**f, **switches})) for f, want in data)

    def both(quantized: np.ndarray, parts: str = "aw") -> str:
        """The errors on the calibration and held-out inputs, as `cal% / held%`."""
        e = [100 * error(quantized, data, parts) for data in (cal, held)]
        return f"{e[0]:.2f}% / {e[1]:.2f}%"

    everything = np.ones(n, bool)
    # every switch off: the float model's outputs, up to float32 rounding (the switches
    # change which kernels onnxruntime fuses)
    if (off := error(~everything, cal[:1])) > 1e-4:
        raise SystemExit(f"{name}: with every product in float the outputs differ by {off:.2g}")
    full = error(everything, cal)
    drops = np.empty(n)
    for i in range(n):
        one_float = everything.copy()
        one_float[i] = False
        drops[i] = full - error(one_float, cal)
        if sys.stderr.isatty():
            print(f"  {name}: {i + 1}/{n} products", end="\r", file=sys.stderr, flush=True)
    budget = args.fraction * full

    def greedy(order) -> str:
        """Products put back in float in `order` until the calibration error is within
        budget: how many, their share of the multiply-adds, the errors then."""
        quantized, kept = everything.copy(), 0
        for i in order:
            if error(quantized, cal) <= budget:
                break
            quantized[i] = False
            kept += 1
        share = macs[~quantized].sum() / macs.sum()
        return f"{kept} | {100 * share:.0f}% | {both(quantized)}"

    ranked = np.sort(np.maximum(drops, 0))[::-1]
    return (
        f"| {name} | {args.weights} | {args.activations} | {n} "
        f"| {both(everything)} | {both(everything, 'w')} | {both(everything, 'a')} "
        f"| {100 * ranked[0] / full:.1f}% | {100 * ranked[:5].sum() / full:.1f}% "
        f"| {100 * budget:.2f}% | {greedy(np.argsort(-drops))} "
        f"| {greedy(np.argsort(-drops / macs))} |"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", nargs="+", default=["bert", "distilbert"], choices=sorted(M.SPECS))
    ap.add_argument("--weights", choices=sorted(STEPS), default="full-range")
    ap.add_argument(
        "--activations",
        choices=("tensor", "row"),
        default="tensor",
        help="one uint8 scale per activation tensor (default) or per row (token)",
    )
    ap.add_argument(
        "--fraction",
        type=float,
        default=0.5,
        help="the budget, as a fraction of the all-quantized calibration error (default 0.5)",
    )
    ap.add_argument("--calibration", type=int, default=4, help="calibration inputs (default 4)")
    ap.add_argument("--inputs", type=int, default=8, help="held-out inputs (default 8)")
    ap.add_argument("--threads", type=int, default=2, help="onnxruntime threads (default 2)")
    args = ap.parse_args()
    print(f"onnxruntime {ort.__version__}; budget {args.fraction} of the all-quantized error\n")
    print(
        "| model | weights | activations | products | all quantized (cal / held out) "
        "| weights only | activations only | largest drop "
        "| 5 largest drops | budget | by drop: kept float | MACs | error then (cal / held out) "
        "| by drop per MAC: kept float | MACs | error then (cal / held out) |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for name in args.models:
        start = time.perf_counter()
        row = measure(name, args)
        print(row, flush=True)
        print(f"  {name}: {time.perf_counter() - start:.0f} s", file=sys.stderr)


if __name__ == "__main__":
    main()
