"""Benchmark: does packing three MatMuls of one input pay on onnxruntime's CPU?

    python bench/packing.py                    # rows 1 and 128, width 768, 1 and 2 threads
    python bench/packing.py --rows 1 512 --width 512 --runs 400

`pack-three-matmuls` (examples/packing.rules) rewrites MatMul(x, a), MatMul(x, b),
MatMul(x, c) into the three parts of Split(MatMul(x, Concat(a, b, c))), and the engine's cost
model decides whether that pays. This measures what it does on onnxruntime: two models (the
three MatMuls, and the packed MatMul + Split, each followed by the same two Adds), both at
ORT_ENABLE_ALL, run alternately in one process; the printed number is the median of the paired
ratios packed / three MatMuls (below 1: packing is faster).
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper


def model(weights: list[np.ndarray], rows: int, packed: bool) -> onnx.ModelProto:
    """x (1, rows, width) -> q + k + v, with q, k, v = x @ w for each of the 3 weights, as
    three MatMuls or one packed MatMul and a Split (opset 18, IR 10)."""
    width = weights[0].shape[0]
    nodes, inits = [], []
    if packed:
        inits.append(numpy_helper.from_array(np.concatenate(weights, 1), "w"))
        nodes.append(helper.make_node("MatMul", ["x", "w"], ["m"]))
        nodes.append(helper.make_node("Split", ["m"], ["q", "k", "v"], axis=-1, num_outputs=3))
    else:
        for w, name in zip(weights, "qkv"):
            inits.append(numpy_helper.from_array(w, "w" + name))
            nodes.append(helper.make_node("MatMul", ["x", "w" + name], [name]))
    nodes.append(helper.make_node("Add", ["q", "k"], ["a"]))
    nodes.append(helper.make_node("Add", ["a", "v"], ["y"]))
    graph = helper.make_graph(
        nodes,
        "qkv",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, (1, rows, width))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, (1, rows, width))],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)


def paired_ratio(rows: int, width: int, threads: int, runs: int, seed: int = 0) -> float:
    """Median over `runs` of packed seconds / three-MatMul seconds, alternating the two
    sessions (`threads` intra-op threads each) on one random input."""
    rng = np.random.default_rng(seed)
    weights = [(rng.standard_normal((width, width)) * 0.02).astype(np.float32) for _ in range(3)]
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    sessions = [
        ort.InferenceSession(
            model(weights, rows, packed).SerializeToString(),
            opts,
            providers=["CPUExecutionProvider"],
        )
        for packed in (False, True)
    ]
    x = rng.standard_normal((1, rows, width)).astype(np.float32)
    outs = [s.run(None, {"x": x})[0] for s in sessions]
    np.testing.assert_allclose(outs[1], outs[0], rtol=1e-4, atol=1e-4)
    for s in sessions:
        for _ in range(20):
            s.run(None, {"x": x})
    ratios = []
    for _ in range(runs):
        seconds = []
        for s in sessions:
            start = time.perf_counter()
            s.run(None, {"x": x})
            seconds.append(time.perf_counter() - start)
        ratios.append(seconds[1] / seconds[0])
    return float(np.median(ratios))


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 128], help="sequence lengths")
    ap.add_argument("--width", type=int, default=768, help="model width (default 768)")
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--runs", type=int, default=200, help="paired runs (default 200)")
    args = ap.parse_args(argv)
    print(f"packed / three MatMuls, median of {args.runs} paired runs, width {args.width}")
    print("| rows | " + " | ".join(f"{t} thread(s)" for t in args.threads) + " |")
    print("|---|" + "---|" * len(args.threads))
    for rows in args.rows:
        cells = [f"{paired_ratio(rows, args.width, t, args.runs):.3f}x" for t in args.threads]
        print(f"| {rows} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
