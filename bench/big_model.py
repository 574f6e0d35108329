"""Benchmark: a model over 2 GB written and read back once (external data end to end).

    python bench/big_model.py [--gb 2.2] [--keep DIR]

Builds a chain of MatMuls whose weights (float32 [4096, 4096], 64 MiB each) add up to more
than `--gb` GiB, written straight to an external data file (never held in a ModelProto), with
an Identity and a Mul by 1 between layers for the rules to remove. Then runs `rewrite optimize`
on it, which must write its result with external data by itself (over protobuf's 2 GB
limit), reads the result back, and prints sizes, seconds and the optimizer's peak memory.
"""

from __future__ import annotations

import argparse
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
import onnx.helper as oh

ROOT = Path(__file__).resolve().parent.parent
N = 4096


def build(folder: Path, gib: float) -> Path:
    """Write `big.onnx` and `big.weights` into `folder`; returns the model path."""
    layers = int(np.ceil(gib * 2**30 / (N * N * 4)))
    rng = np.random.default_rng(0)
    inits, nodes, prev = [], [], "x"
    with open(folder / "big.weights", "wb") as f:
        for i in range(layers):
            w = (rng.standard_normal((N, N), dtype=np.float32) / np.float32(np.sqrt(N))).astype(
                "<f4"
            )
            t = onnx.TensorProto(name=f"W{i}", data_type=onnx.TensorProto.FLOAT, dims=[N, N])
            t.data_location = onnx.TensorProto.EXTERNAL
            for k, v in (
                ("location", "big.weights"),
                ("offset", str(f.tell())),
                ("length", str(w.nbytes)),
            ):
                t.external_data.add(key=k, value=v)
            f.write(w.tobytes())
            inits.append(t)
            nodes += [
                oh.make_node("MatMul", [prev, f"W{i}"], [f"m{i}"]),
                oh.make_node("Identity", [f"m{i}"], [f"i{i}"]),
                oh.make_node("Mul", [f"i{i}", "one"], [f"s{i}"]),
                oh.make_node("Relu", [f"s{i}"], [f"r{i}"]),
            ]
            prev = f"r{i}"
    nodes.append(oh.make_node("Identity", [prev], ["y"]))
    inits.append(onnx.numpy_helper.from_array(np.float32(1.0), "one"))
    graph = oh.make_graph(
        nodes,
        "big",
        [oh.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, N])],
        [oh.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, N])],
        inits,
    )
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18)], ir_version=10)
    onnx.save(model, str(folder / "big.onnx"))
    return folder / "big.onnx"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gb", type=float, default=2.2, help="weights in GiB (default 2.2)")
    ap.add_argument("--keep", help="build in this folder and keep the files")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(dir=args.keep) as tmp:
        folder = Path(tmp)
        clock = time.perf_counter()
        src = build(folder, args.gb)
        built = time.perf_counter() - clock
        out = folder / "out.onnx"
        clock = time.perf_counter()
        r = subprocess.run(
            [sys.executable, "-m", "rewrite.cli", "optimize", str(src), str(out)],
            capture_output=True,
            text=True,
            cwd=ROOT,
        )
        seconds = time.perf_counter() - clock
        peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 2**20  # KiB -> GiB
        print(r.stdout.splitlines()[-1] if r.stdout else "", r.stderr.strip(), sep="\n")
        if r.returncode != 0:
            return 1
        clock = time.perf_counter()
        back = onnx.load(str(out))  # external data read back whole
        read = time.perf_counter() - clock
        size = sum(p.stat().st_size for p in folder.iterdir() if p.name.startswith("out.onnx"))
        weights = sum(t.ByteSize() for t in back.graph.initializer)
        ops = sorted({n.op_type for n in back.graph.node})
        weights_in = (folder / "big.weights").stat().st_size / 2**30
        files = ", ".join(sorted(p.name for p in folder.iterdir() if p.name.startswith("out")))
        print(f"input {weights_in:.2f} GiB of weights, built in {built:.0f} s")
        print(
            f"optimized in {seconds:.0f} s (peak memory {peak:.2f} GiB); "
            f"output {size / 2**30:.2f} GiB in {files}"
        )
        print(
            f"read back in {read:.0f} s: {len(back.graph.node)} nodes ({', '.join(ops)}), "
            f"{weights / 2**30:.2f} GiB of initializers"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
