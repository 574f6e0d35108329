"""The ONNX model zoo's classic CNNs against the peers: nodes before/after, errors, seconds.

    python bench/zoo.py                        # the nine CNNs: rewrite, onnxsim, onnxslim
    python bench/zoo.py --models resnet50 vgg19 --tools rewrite onnxsim
    python bench/zoo.py --suite                # also the onnx backend node/model test models
    python bench/zoo.py --quantize             # rewrite quantize, dynamic and static modes

The CNNs are the `onnx` package's own copies (`onnx/backend/test/data/light/light_*.onnx`,
opset 9, IR 3): AlexNet, DenseNet-121, Inception v1/v2, ResNet-50, ShuffleNet, SqueezeNet,
VGG-19, ZFNet-512. Their weights are stripped: each is a `ConstantOfShape` node that fills the
tensor with one value. `zoo_model(name)` puts random trained-like weights in their place
(`fill_weights`), as initializers, so that the outputs depend on the input (a constant-filled
network gives near-constant outputs and would pass any output check).

Every (tool, model) runs in this process, one after the other; seconds are wall clock of the
call (load, optimize, save; for rewrite the CLI `rewrite optimize IN OUT --allow reassoc`, its
output check included, and with `--no-check` as a second row when --no-check is given). Errors
are the first line of the tool's message. `--suite` runs rewrite (CLI, exact rules) over the
backend test models under `onnx/backend/test/data/{pytorch-converted,pytorch-operator,simple}`
and counts the outcomes: optimized, unchanged, refused (one-line error, by kind), crashed.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

DATA = Path(os.path.dirname(onnx.__file__)) / "backend" / "test" / "data"
ZOO = (
    "bvlc_alexnet",
    "densenet121",
    "inception_v1",
    "inception_v2",
    "resnet50",
    "shufflenet",
    "squeezenet",
    "vgg19",
    "zfnet512",
)
TOOLS = ("rewrite", "onnxsim", "onnxslim")
SEED = 0


def fill_weights(model: onnx.ModelProto, seed: int = SEED) -> onnx.ModelProto:
    """A copy of `model` whose `ConstantOfShape` nodes with a constant shape are initializers
    of random trained-like values, chosen by what reads them: Conv and Gemm weights
    N(0, 2/fan_in) (He, which keeps activations near unit variance through Conv + ReLU),
    BatchNormalization scale 1 + N(0, 0.1^2), bias N(0, 0.1^2), mean N(0, 0.05^2), variance
    U(0.8, 1.2), a Mul's operand 1 + N(0, 0.1^2), anything else N(0, 0.1^2); the
    model's own float initializers that those ops read are replaced the same way. Shape
    initializers no longer read are dropped, with their graph inputs; below IR 4 the new
    initializers are graph inputs too (as IR 3 requires)."""
    rng = np.random.default_rng(seed)
    out = onnx.ModelProto()
    out.CopyFrom(model)
    g = out.graph
    inits = {t.name: numpy_helper.to_array(t) for t in g.initializer}
    readers: dict[str, list[tuple[str, int]]] = {}
    for n in g.node:
        for i, x in enumerate(n.input):
            readers.setdefault(x, []).append((n.op_type, i))
    for n in g.node:
        for x in n.output:  # look through Unsqueeze (DenseNet's explicit scale and bias)
            if n.op_type == "Unsqueeze" and n.input[0] not in readers.get(x, ()):
                readers.setdefault(n.input[0], []).extend(readers.get(x, []))
    keep, filled = [], []
    for n in g.node:
        if n.op_type != "ConstantOfShape" or n.input[0] not in inits:
            keep.append(n)
            continue
        shape = tuple(int(d) for d in inits[n.input[0]])
        use = readers.get(n.output[0], [("", 0)])[0]
        filled.append(numpy_helper.from_array(_values(rng, shape, use), n.output[0]))
    del g.node[:]
    g.node.extend(keep)
    for t in g.initializer:  # the light models' own float parameters are placeholders too
        use = readers.get(t.name, [("", 0)])[0]
        if t.data_type == onnx.TensorProto.FLOAT and use[0] in _PARAMETER_READERS and t.dims:
            t.CopyFrom(numpy_helper.from_array(_values(rng, tuple(t.dims), use), t.name))
    g.initializer.extend(filled)
    used = {x for n in g.node for x in n.input} | {o.name for o in g.output}
    drop = {t.name for t in g.initializer if t.name not in used}
    kept = [t for t in g.initializer if t.name not in drop]
    del g.initializer[:]
    g.initializer.extend(kept)
    ins = [i for i in g.input if i.name not in drop]
    del g.input[:]
    g.input.extend(ins)
    if out.ir_version < 4:  # IR 3: every initializer is also a graph input
        g.input.extend(
            onnx.helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)) for t in filled
        )
    return out


_PARAMETER_READERS = ("Conv", "Gemm", "BatchNormalization", "Mul", "Add", "Sum")


def _values(rng, shape: tuple[int, ...], use: tuple[str, int]) -> np.ndarray:
    op, slot = use
    if op in ("Conv", "Gemm") and slot == 1:
        fan_in = int(np.prod(shape[1:])) if op == "Conv" else shape[-1]
        w = rng.standard_normal(shape) * np.sqrt(2.0 / max(fan_in, 1))
    elif op == "BatchNormalization" and slot == 4:
        w = rng.uniform(0.8, 1.2, shape)
    elif op == "BatchNormalization" and slot == 3:
        w = 0.05 * rng.standard_normal(shape)
    elif (op == "BatchNormalization" and slot == 1) or op == "Mul":
        w = 1 + 0.1 * rng.standard_normal(shape)
    else:
        w = 0.1 * rng.standard_normal(shape)
    return w.astype(np.float32)


def calibrate_batchnorm(model: onnx.ModelProto, seed: int = SEED) -> dict[str, np.ndarray]:
    """Set every BatchNormalization's mean and variance (initializers, in place) to the
    per-channel statistics of its input on a random standard-normal input, as training would
    leave them, so that each BN normalizes (random statistics let a deep network's activations
    explode or saturate its softmax: the output stops depending on the input). One run of
    `onnx.reference` in which each BN normalizes with its input's own statistics and records
    them: every BN sees the ones before it already calibrated. Returns the new tensors by
    name. Slow (onnx.reference: 10 s to 2 min a model), hence `STATS`."""
    from onnx.reference import ReferenceEvaluator
    from onnx.reference.op_run import OpRun

    stats: dict[str, tuple[np.ndarray, np.ndarray]] = {}

    class BatchNormalization(OpRun):
        op_domain = ""

        def _run(self, x, scale, bias, mean, var, epsilon=1e-5, **_):
            axes = (0, *range(2, x.ndim))
            m, v = x.mean(axis=axes), x.var(axis=axes)
            v = np.maximum(v, 0.01 * np.median(v) + 1e-6)  # a dead channel: no 1/sqrt(eps)
            stats[self.onnx_node.input[3]], stats[self.onnx_node.input[4]] = m, v
            shape = (1, -1) + (1,) * (x.ndim - 2)
            y = (x - m.reshape(shape)) / np.sqrt(v.reshape(shape) + epsilon)
            return ((y * scale.reshape(shape) + bias.reshape(shape)).astype(x.dtype),)

    if any(n.op_type == "BatchNormalization" for n in model.graph.node):
        ref = ReferenceEvaluator(model, new_ops=[BatchNormalization])
        ref.run(None, _feeds(model, np.random.default_rng(seed + 1)))
    out = {k: v.astype(np.float32) for k, v in stats.items()}
    _set(model, out)
    return out


def _set(model: onnx.ModelProto, tensors: dict[str, np.ndarray]) -> None:
    for t in model.graph.initializer:
        if t.name in tensors:
            t.CopyFrom(numpy_helper.from_array(tensors[t.name], t.name))


def _feeds(model: onnx.ModelProto, rng) -> dict[str, np.ndarray]:
    inits = {t.name for t in model.graph.initializer}
    feeds = {}
    for vi in model.graph.input:
        if vi.name in inits:
            continue
        shape = [d.dim_value for d in vi.type.tensor_type.shape.dim]
        feeds[vi.name] = rng.standard_normal(shape).astype(np.float32)
    return feeds


# BatchNorm statistics of `zoo_model`'s models, as `calibrate_batchnorm` computes them
# (`python bench/zoo.py --calibrate` rewrites the file): "MODEL/TENSOR" -> array.
STATS = Path(__file__).resolve().parent / "zoo_bn_stats.npz"


def zoo_model(name: str) -> onnx.ModelProto:
    """The zoo CNN `name` (one of ZOO) with trained-like weights (`fill_weights`) and
    BatchNorm statistics calibrated on a random input (`calibrate_batchnorm`, read from
    `STATS` when it has them)."""
    model = fill_weights(onnx.load(str(DATA / "light" / f"light_{name}.onnx")))
    if STATS.exists():
        with np.load(STATS) as f:
            saved = {k.split("/", 1)[1]: f[k] for k in f.files if k.split("/", 1)[0] == name}
        if saved or not any(n.op_type == "BatchNormalization" for n in model.graph.node):
            _set(model, saved)
            return model
    calibrate_batchnorm(model)
    return model


def write_stats(names=ZOO) -> None:
    """Calibrate every zoo model's BatchNorms and save the statistics to `STATS`."""
    data = {}
    for name in names:
        model = fill_weights(onnx.load(str(DATA / "light" / f"light_{name}.onnx")))
        data.update({f"{name}/{k}": v for k, v in calibrate_batchnorm(model).items()})
    np.savez_compressed(STATS, **data)


def _cli(argv: list[str]) -> str:
    """Run the `rewrite` CLI quietly: "" when it succeeded, else its last error line ("crashed:
    ..." for a traceback out of it, which is a bug)."""
    from rewrite.cli import main

    o, e = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stdout(o), contextlib.redirect_stderr(e):
            rc = main(argv)
    except Exception as ex:
        return f"crashed: {type(ex).__name__}: {ex}"
    if rc == 0:
        return ""
    lines = [x for x in e.getvalue().splitlines() if "error" in x] or e.getvalue().splitlines()
    return lines[-1] if lines else f"exit {rc}"


def run_rewrite(src: Path, dst: Path, *extra: str) -> tuple[int | None, str]:
    """`rewrite optimize SRC DST --allow reassoc EXTRA`: (nodes after or None, error line)."""
    error = _cli(["optimize", str(src), str(dst), "--allow", "reassoc", "--no-bisect", *extra])
    if error:
        return None, error
    return len(onnx.load(str(dst), load_external_data=False).graph.node), ""


def run_quantize(src: Path, dst: Path, mode: str) -> tuple[str, str]:
    """`rewrite quantize SRC DST --mode MODE` (calibration drawn from the input types in static
    mode, its output check on): (the integer ops of the result, e.g. "26 QLinearConv", or "",
    and the error line when it refused)."""
    from vocab.ops import FAMILIES

    error = _cli(["quantize", str(src), str(dst), "--mode", mode, "--no-bisect"])
    if error:
        return "", error
    quantization = set(FAMILIES["QUANTIZATION"])  # Q, DQ: the rest compute on integers
    integer_ops = {op.rsplit(".", 1)[-1] for op in FAMILIES["QUANTIZED"] if op not in quantization}
    ops = Counter(n.op_type for n in onnx.load(str(dst), load_external_data=False).graph.node)
    integer = [f"{n} {op}" for op, n in sorted(ops.items()) if op in integer_ops]
    return ", ".join(integer), ""


def bench_quantize(names, work: Path) -> None:
    """`rewrite quantize` in dynamic and static mode on each zoo CNN: a table of what it made
    (or the first line of its refusal) and the seconds."""
    print("| model | mode | integer ops | seconds | refused with |")
    print("|---|---|---|---|---|")
    for name in names:
        src = work / f"{name}.onnx"
        onnx.save(zoo_model(name), str(src))
        for mode in ("dynamic", "static"):
            t = time.perf_counter()
            made, error = run_quantize(src, work / f"{name}.{mode}.onnx", mode)
            seconds = time.perf_counter() - t
            why = error.removeprefix("error: ")[:90]
            print(f"| {name} | {mode} | {made or '-'} | {seconds:.1f} | {why} |", flush=True)


def run_peer(tool: str, src: Path) -> tuple[int | None, str]:
    """onnxsim.simplify(model) (check_n=0) or onnxslim.slim(model): (nodes after, error)."""
    model = onnx.load(str(src))
    try:
        if tool == "onnxsim":
            import onnxsim

            out, _ = onnxsim.simplify(model)
        else:
            import onnxslim

            out = onnxslim.slim(model)
    except Exception as e:  # the peers raise anything
        return None, f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e) else ''}"
    return len(out.graph.node), ""


def bench_zoo(names, tools, work: Path, no_check: bool) -> list[dict]:
    """One row per model: nodes before, and per tool nodes after, error and seconds."""
    rows = []
    for name in names:
        src = work / f"{name}.onnx"
        model = zoo_model(name)
        onnx.save(model, str(src))
        row = {
            "model": name,
            "opset": model.opset_import[0].version,
            "before": len(model.graph.node),
        }
        for tool in tools:
            runs = [(tool, ())]
            if tool == "rewrite" and no_check:
                runs.append(("rewrite --no-check", ("--no-check",)))
            for label, extra in runs:
                t = time.perf_counter()
                if label.startswith("rewrite"):
                    nodes, error = run_rewrite(src, work / f"{name}.rw.onnx", *extra)
                else:
                    nodes, error = run_peer(tool, src)
                row[label] = (nodes, error, time.perf_counter() - t)
        print(_row_text(row, [c for c in row if c not in ("model", "opset", "before")]), flush=True)
        rows.append(row)
    return rows


def _row_text(row: dict, labels) -> str:
    cells = [f"{row['model']:<13} op{row['opset']:<3} {row['before']:>5}"]
    for label in labels:
        nodes, error, secs = row[label]
        cells.append(
            f"{label}: " + (f"{nodes:>4}" if nodes is not None else "ERR ") + f" {secs:6.1f}s"
        )
    return " | ".join(cells)


def print_table(rows: list[dict]) -> None:
    """The markdown table of `bench_zoo`'s rows, then each error."""
    labels = [c for c in rows[0] if c not in ("model", "opset", "before")]
    head = ["model", "opset", "nodes"] + [f"{x} nodes" for x in labels] + [f"{x} s" for x in labels]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for r in rows:
        nodes = [str(r[x][0]) if r[x][0] is not None else "error" for x in labels]
        secs = [f"{r[x][2]:.1f}" for x in labels]
        print(
            "| " + " | ".join([r["model"], str(r["opset"]), str(r["before"]), *nodes, *secs]) + " |"
        )
    for r in rows:
        for x in labels:
            if r[x][1]:
                print(f"{r['model']} {x}: {r[x][1]}")


def bench_suite(work: Path) -> Counter:
    """rewrite (CLI, exact rules) over the onnx backend test models: outcome counts."""
    from rewrite.cli import main

    paths = sorted(DATA.glob("light/*.onnx")) + sorted(DATA.glob("*/*/model.onnx"))
    counts: Counter = Counter()
    for p in paths:
        o, e = io.StringIO(), io.StringIO()
        try:
            with contextlib.redirect_stdout(o), contextlib.redirect_stderr(e):
                rc = main(["optimize", str(p), str(work / "suite.onnx"), "--no-bisect"])
        except Exception as ex:  # a traceback out of the CLI is a bug: count it
            rc, what = -1, f"crashed: {type(ex).__name__}"
        text = (o.getvalue().strip().splitlines() or [""])[-1]
        if rc == 0:
            what = "unchanged" if "unchanged" in text else "optimized"
        elif rc > 0:
            err = [x for x in e.getvalue().splitlines() if "error:" in x]
            line = err[-1] if err else ""
            what = (
                "internal error"
                if "optimization failed" in line
                else "refused: " + line.split("error:", 1)[-1].split(":")[0].strip()[:40]
            )
        counts[what] += 1
        print(f"{what:<40} {p.relative_to(DATA)}", flush=True)
    return counts


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=list(ZOO), choices=ZOO)
    ap.add_argument("--tools", nargs="+", default=list(TOOLS), choices=TOOLS)
    ap.add_argument("--no-check", action="store_true", help="also run rewrite with --no-check")
    ap.add_argument("--suite", action="store_true", help="also the onnx backend test models")
    ap.add_argument("--calibrate", action="store_true", help=f"rewrite {STATS.name} first")
    ap.add_argument(
        "--quantize",
        action="store_true",
        help="instead, `rewrite quantize` in dynamic and static mode on each model",
    )
    args = ap.parse_args(argv)
    if args.calibrate:
        write_stats()
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    import importlib.metadata as md

    versions = {t: md.version(t) for t in ("onnx", "onnxruntime", "onnxsim", "onnxslim")}
    print("versions:", ", ".join(f"{k} {v}" for k, v in versions.items()))
    if args.quantize:
        with tempfile.TemporaryDirectory() as d:
            bench_quantize(args.models, Path(d))
        return 0
    with tempfile.TemporaryDirectory() as d:
        rows = bench_zoo(args.models, args.tools, Path(d), args.no_check)
        print()
        print_table(rows)
        if args.suite:
            counts = bench_suite(Path(d))
            print()
            for what, n in counts.most_common():
                print(f"{n:>4}  {what}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
