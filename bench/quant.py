"""int8 quantization: `rewrite quantize` against onnxruntime's quantizers.

    python bench/quant.py                               # BERT-base, both exporters
    python bench/quant.py --models bert gpt2 llama vit --exporters torchscript
    python bench/quant.py --kernels                     # the cost model's int8 factor
    python bench/quant.py --mode weight-only --models llama --exporters torchscript
    python bench/quant.py --mode static --models resnet50 mobilenetv2 efficientnet-b0

Models are bench/models.py's full-size ones (bench/.models/, generated when missing). For each
model, seven files: the float original, onnxruntime's
(`onnxruntime.quantization.quantize_dynamic(IN, OUT)`, its defaults: int8 weights, one scale
per tensor), ours (`rewrite quantize IN OUT --mode dynamic`, the shipped library, its output
check off so that the error is measured here, its default weights one scale per output column;
the same with `--per-tensor`, one scale per weight; and with `--error-budget` at `--budget`
times onnxruntime's measured error, calibrated on `--calibration` inputs of seeds 1000..,
apart from the measured ones, with the default weights, with `--smooth 0.5`, with
`--rounding gptq` and with both; `--smooth 0.5` alone, SmoothQuant's scale migration from the
same calibration inputs; and `--rounding gptq` alone, GPTQ's weight rounding from them; on a
CPU with VNNI, `--cpu vnni` rows too, alone, with `--rounding gptq`, and in the budget rows
with both `--rounding gptq` and `--smooth 0.5`). Reported per quantized model:

* latency: each model and the original run alternately in one process under onnxruntime
  (ORT_ENABLE_ALL, 1 intra-op thread or each of `--threads`, batch 1 at bench/models.py's
  main shape); the median of `--runs` paired ratios quantized / float;
* error over `--inputs` fixed random inputs (bench/models.py's `make_inputs`, seeds 0..n-1):
  max |q - ref| / max |ref| per output, the worst output and input shown, the worst output's
  mean over the inputs beside it (the max of a few inputs moves with the rounding), and for
  language models the share of positions whose argmax over the last axis agrees with the
  original's;
* seconds to quantize (one process call each, model load and save included; the package's
  bytecode written first, as a user's first import writes it) and file MB.

`--mode static` compares onnxruntime's `quantize_static` (QDQ format, per-channel weights,
its defaults otherwise: int8 activations and weights, MinMax) with `rewrite quantize --mode
static --target onnxruntime`, both calibrated on the same `--calibration` inputs. For image
models the argmax agreement is over the channels of the pooled output (which feature is
largest, what a classifier head would read). Ours also for the default target, standard ONNX
(`--target onnx`: residual Adds and the like in float between the integer Convs), and with
`--rounding gptq` (GPTQ onto the static rules' weight levels from the same calibration
inputs); on a CPU with VNNI rows with `--cpu vnni` (full-range weights), alone and with
`--rounding gptq`, follow ours. A further
row takes onnxruntime's QDQ file and lowers its groups to integer kernels with `rewrite
optimize --allow quant --target onnxruntime` (patterns/quant/lower.rules), for the file a
runtime without QDQ fusion could run.

`--mode weight-only` compares onnxruntime's `MatMulNBitsQuantizer` (4 bits, blocks of 32,
symmetric, round to nearest) with `rewrite quantize --mode weight-only`, for onnxruntime
(MatMulNBits) and for standard ONNX (int4 DequantizeLinear with block_size), each also with
`--rounding gptq` (GPTQ onto the same blocks, from the `--calibration` inputs).

`--kernels` times onnxruntime's MatMulInteger (uint8 by int8) against float32 MatMul at BERT's
shapes, 1 thread, and prints the ratio that `engine.cost.INT8_FLOP_FACTOR` stands for; then
QLinearConv by dtype pair at ResNet-50's shapes (`engine.cost.S8_FLOP_FACTOR`).
"""

from __future__ import annotations

import argparse
import compileall
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from vocab.registry import int8_sums_in_int32

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))
import models as M  # noqa: E402  (bench/models.py, beside this file)

OUT = BENCH / "out" / "quant"
SMOOTH_ALPHA = 0.5  # the SmoothQuant row's migration strength (the paper's default)


def compile_package() -> None:
    """Write the package's bytecode (`compileall`), as its first import on a user's machine
    does: where PYTHONDONTWRITEBYTECODE is set (the shells these benches ran in had it), every
    `rewrite` process the benches time would otherwise compile the package's modules from
    source again (0.2 s), while onnxruntime's quantizers import precompiled site-packages."""
    root = Path(__file__).resolve().parent.parent
    for package in ("vocab", "dsl", "engine", "frontends", "verify", "rewrite"):
        compileall.compile_dir(root / package, quiet=1)


def _seconds(cmd: list[str]) -> float:
    """Wall-clock seconds of running `cmd` (a subprocess: each quantizer pays its imports)."""
    start = time.perf_counter()
    subprocess.run(cmd, check=True)
    return time.perf_counter() - start


def quantize_ours(src: Path, dst: Path, *extra: str) -> float:
    """Seconds of `rewrite quantize SRC DST --no-check EXTRA...` (`--mode dynamic` unless
    EXTRA gives another)."""
    return _seconds(["rewrite", "quantize", str(src), str(dst), "--no-check", "-q", *extra])


def quantize_ours_per_tensor(src: Path, dst: Path) -> float:
    """The same with `--per-tensor` (one weight scale per weight, onnxruntime's default)."""
    return quantize_ours(src, dst, "--per-tensor")


def quantize_ours_weight_only(src: Path, dst: Path, *extra: str) -> float:
    """`rewrite quantize --mode weight-only --target onnxruntime EXTRA...` (4-bit weights,
    blocks of 32, symmetric)."""
    return quantize_ours(src, dst, "--mode", "weight-only", "--target", "onnxruntime", *extra)


def quantize_ours_weight_only_onnx(src: Path, dst: Path, *extra: str) -> float:
    """`rewrite quantize --mode weight-only EXTRA...` for standard ONNX: int4 DequantizeLinear
    with block_size 32 before each MatMul (opset 21), which onnxruntime fuses into
    MatMulNBits."""
    return quantize_ours(src, dst, "--mode", "weight-only", *extra)


def quantize_ours_static(src: Path, dst: Path, cal: Path, *extra: str) -> float:
    """`rewrite quantize --mode static --target onnxruntime --calibration CAL EXTRA...`."""
    return quantize_ours(
        src, dst, "--mode", "static", "--target", "onnxruntime", "--calibration", str(cal), *extra
    )


def quantize_ort_static(src: Path, dst: Path, cal: Path) -> float:
    """Seconds of onnxruntime's `quantize_static(SRC, DST, reader)` over the calibration
    file's inputs, QDQ format, per-channel weights."""
    code = (
        "import sys, numpy as np\n"
        "from onnxruntime.quantization import CalibrationDataReader, QuantFormat, "
        "quantize_static\n"
        "data = np.load(sys.argv[3])\n"
        "feeds = [{k: data[k][i] for k in data.files} for i in range(len(data[data.files[0]]))]\n"
        "class Reader(CalibrationDataReader):\n"
        "    def __init__(self): self.it = iter(feeds)\n"
        "    def get_next(self): return next(self.it, None)\n"
        "quantize_static(sys.argv[1], sys.argv[2], Reader(), quant_format=QuantFormat.QDQ, "
        "per_channel=True)\n"
    )
    return _seconds([sys.executable, "-c", code, str(src), str(dst), str(cal)])


def lower_ort_static(src: Path, dst: Path, cal: Path) -> float:
    """onnxruntime's `quantize_static` file (`quantize_ort_static`), then its QDQ groups
    lowered to integer kernels by `rewrite optimize --allow quant --target onnxruntime`
    (patterns/quant/lower.rules): the seconds of both."""
    qdq = dst.with_suffix(".qdq.onnx")
    seconds = quantize_ort_static(src, qdq, cal)
    cmd = ["rewrite", "optimize", str(qdq), str(dst), "--allow", "quant", "--no-check", "-q"]
    return seconds + _seconds([*cmd, "--target", "onnxruntime"])


def quantize_ort(src: Path, dst: Path) -> float:
    """Seconds of onnxruntime's `quantize_dynamic(SRC, DST)` with its defaults."""
    code = (
        "import sys; from onnxruntime.quantization import quantize_dynamic; "
        "quantize_dynamic(sys.argv[1], sys.argv[2])"
    )
    return _seconds([sys.executable, "-c", code, str(src), str(dst)])


def quantize_ort_weight_only(src: Path, dst: Path) -> float:
    """Seconds of onnxruntime's `MatMulNBitsQuantizer` at the same settings as ours (4 bits,
    blocks of 32, symmetric)."""
    code = (
        "import sys, onnx; "
        "from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer; "
        "q = MatMulNBitsQuantizer(onnx.load(sys.argv[1]), block_size=32, is_symmetric=True); "
        "q.process(); onnx.save(q.model.model, sys.argv[2])"
    )
    return _seconds([sys.executable, "-c", code, str(src), str(dst)])


def cpu() -> str:
    """The CPU's model name (/proc/cpuinfo) and whether onnxruntime's uint8-by-int8 kernels
    sum in int32 on it (VNNI: `vocab.registry.int8_sums_in_int32`) or add neighbouring pairs
    in int16, which moves both the int8 latency and what full-range weights cost (the
    `--cpu vnni` rows run only with VNNI)."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        lines = []
    model = next((ln.split(":", 1)[1].strip() for ln in lines if ln.startswith("model name")), "?")
    sums = "int32 sums (VNNI)" if int8_sums_in_int32() else "int16 pairs (no VNNI)"
    return f"{model}, {sums}"


def session(path: Path | bytes, threads: int = 1) -> ort.InferenceSession:
    """An onnxruntime session at ORT_ENABLE_ALL with `threads` intra-op threads, of a model
    file or a serialized model."""
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    model = path if isinstance(path, bytes) else str(path)
    return ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])


def worst_output(want: list, got: list) -> float:
    """The largest max|g - w| / max|w| over the float outputs of one input (w the float
    model's, g the quantized one's; 1 stands for max|w| when an output is all zeros)."""
    worst = 0.0
    for w, g in zip(want, got):
        if np.issubdtype(w.dtype, np.floating) and w.size:
            worst = max(worst, float(np.abs(g - w).max()) / (float(np.abs(w).max()) or 1.0))
    return worst


def errors(
    name: str, ref: ort.InferenceSession, q: ort.InferenceSession, n: int, first: int = 0
) -> dict:
    """Worst max|q - ref| / max|ref| over outputs and `n` inputs of seeds `first`.. (`error`),
    its mean over the inputs (`mean`: the worst output per input; `per_input`: each input's, in
    seed order), and the argmax agreement over the last axis of the first output (a share of
    positions); for image models over the channels of the last output (the pooled features,
    [N, C, 1, 1])."""
    per_input, agree, total = [], 0, 0
    for seed in range(first, first + n):
        feeds = M.make_inputs(name, seed=seed)
        want, got = ref.run(None, feeds), q.run(None, feeds)
        per_input.append(worst_output(want, got))
        if M.SPECS[name].kind == "image":
            a = want[-1].reshape(len(want[-1]), -1).argmax(-1)
            b = got[-1].reshape(len(got[-1]), -1).argmax(-1)
        else:
            a, b = want[0].argmax(-1), got[0].argmax(-1)
        agree, total = agree + int((a == b).sum()), total + a.size
    return {
        "error": max(per_input),
        "mean": float(np.mean(per_input)),
        "per_input": per_input,
        "argmax": agree / total,
    }


def latency(name: str, ref: ort.InferenceSession, q: ort.InferenceSession, runs: int) -> float:
    """Median of `runs` paired latency ratios q / ref, the two run alternately on model
    `name`'s bench input (`paired_ratio`)."""
    return paired_ratio(ref, q, M.make_inputs(name), runs)


def paired_ratio(
    ref: ort.InferenceSession, q: ort.InferenceSession, feeds: dict, runs: int
) -> float:
    """Median of `runs` paired latency ratios q / ref on `feeds`, the two run alternately
    (three warm-up runs each first)."""
    for s in (ref, q):
        for _ in range(3):
            s.run(None, feeds)
    ratios = []
    for _ in range(runs):
        t0 = time.perf_counter()
        ref.run(None, feeds)
        t1 = time.perf_counter()
        q.run(None, feeds)
        t2 = time.perf_counter()
        ratios.append((t2 - t1) / (t1 - t0))
    return float(np.median(ratios))


def bench_model(name: str, exporter: str, args) -> list[str]:
    src = M.CACHE / f"{name}.{exporter}.onnx"
    if not src.exists():
        M.main(["--models", name, "--exporters", exporter])
    work = OUT / f"{name}.{exporter}"
    work.mkdir(parents=True, exist_ok=True)
    rows = []
    ref = session(src, args.threads[0])
    cal = work / "calibration.npz"  # seeds apart from the measured inputs' (0..n-1)
    M.save_inputs(cal, name, range(1000, 1000 + args.calibration))
    tools = [
        ("onnxruntime", quantize_ort),
        ("rewrite", quantize_ours),
        ("rewrite --per-tensor", quantize_ours_per_tensor),
        (
            f"rewrite --smooth {SMOOTH_ALPHA}",
            lambda s, d: quantize_ours(
                s, d, "--smooth", str(SMOOTH_ALPHA), "--calibration", str(cal)
            ),
        ),
    ]
    gptq = ("--rounding", "gptq", "--calibration", str(cal))
    tools.insert(2, ("rewrite --rounding gptq", lambda s, d: quantize_ours(s, d, *gptq)))
    if int8_sums_in_int32():  # full-range weights are exact on this CPU: their rows too
        tools.insert(4, ("rewrite --cpu vnni", lambda s, d: quantize_ours(s, d, "--cpu", "vnni")))
        tools.insert(
            5,
            (
                "rewrite --cpu vnni --rounding gptq",
                lambda s, d: quantize_ours(s, d, "--cpu", "vnni", *gptq),
            ),
        )
    if args.mode == "static":
        gptq = ("--rounding", "gptq")
        tools = [
            ("onnxruntime quantize_static", lambda s, d: quantize_ort_static(s, d, cal)),
            ("rewrite --mode static", lambda s, d: quantize_ours_static(s, d, cal)),
            (
                "rewrite --mode static --target onnx",
                lambda s, d: quantize_ours(s, d, "--mode", "static", "--calibration", str(cal)),
            ),
            (
                "rewrite --mode static --rounding gptq",
                lambda s, d: quantize_ours_static(s, d, cal, *gptq),
            ),
            ("quantize_static, lowered by rewrite", lambda s, d: lower_ort_static(s, d, cal)),
        ]
        if int8_sums_in_int32():
            vnni = ("--cpu", "vnni")
            tools[4:4] = [
                (
                    "rewrite --mode static --cpu vnni",
                    lambda s, d: quantize_ours_static(s, d, cal, *vnni),
                ),
                (
                    "rewrite --mode static --cpu vnni --rounding gptq",
                    lambda s, d: quantize_ours_static(s, d, cal, *vnni, *gptq),
                ),
            ]
    if args.mode == "weight-only":
        tools = [
            ("onnxruntime MatMulNBits", quantize_ort_weight_only),
            ("rewrite --mode weight-only", quantize_ours_weight_only),
            ("rewrite --mode weight-only --target onnx", quantize_ours_weight_only_onnx),
            (
                "rewrite --mode weight-only --rounding gptq",
                lambda s, d: quantize_ours_weight_only(s, d, *gptq),
            ),
            (
                "rewrite --mode weight-only --target onnx --rounding gptq",
                lambda s, d: quantize_ours_weight_only_onnx(s, d, *gptq),
            ),
        ]
    measured: dict[str, dict] = {}
    while tools:
        tool, fn = tools.pop(0)
        dst = work / f"{re.sub(r'[^A-Za-z0-9.]+', '-', tool)}.onnx"
        seconds = fn(src, dst)
        q = session(dst, args.threads[0])
        e = measured[tool] = errors(name, ref, q, args.inputs)
        lats = [latency(name, ref, q, args.runs)]
        lats += [
            latency(name, session(src, t), session(dst, t), args.runs) for t in args.threads[1:]
        ]
        lat = " | ".join(f"{x:.3f}x" for x in lats)
        mb = dst.stat().st_size / 2**20
        argmax = f"{100 * e['argmax']:.1f}%"
        rows.append(
            f"| {name}.{exporter} | {tool} | {lat} | {100 * e['error']:.1f}% "
            f"| {100 * e['mean']:.1f}% | {argmax} "
            f"| {seconds:.1f} | {mb:.0f} |"
        )
        print(rows[-1], flush=True)
        if tool == "onnxruntime" and args.budget and args.mode == "dynamic":
            budget = round(measured[tool]["error"] * args.budget, 4)
            smooth = ("--smooth", str(SMOOTH_ALPHA))
            vnni = ("--cpu", "vnni")
            rounded = ("--rounding", "gptq")
            extras = [(), smooth, rounded, (*smooth, *rounded)]
            if int8_sums_in_int32():
                extras += [vnni, (*vnni, *rounded), (*vnni, *smooth, *rounded)]
            # the default weights, smoothed, GPTQ-rounded, both, and full-range ones (also
            # rounded, and smoothed and rounded)
            for extra in extras:
                tools.append(
                    (
                        " ".join(("rewrite", *extra, "--error-budget", f"{budget:g}")),
                        lambda s, d, b=budget, x=extra: quantize_ours(
                            s, d, *x, "--error-budget", str(b), "--calibration", str(cal)
                        ),
                    )
                )
    return rows


def _median_us(model, feeds: dict, runs: int = 30) -> float:
    """Median microseconds of one onnxruntime run of `model`, 1 thread, ORT_ENABLE_ALL."""
    s = session(model.SerializeToString())
    for _ in range(3):
        s.run(None, feeds)
    ts = []
    for _ in range(runs):
        t = time.perf_counter()
        s.run(None, feeds)
        ts.append(time.perf_counter() - t)
    return float(np.median(ts)) * 1e6


def kernels() -> None:
    """MatMulInteger (uint8 x int8) against MatMul (float32), 1 thread, median of 50 runs;
    then `conv_kernels`."""
    rng = np.random.default_rng(0)
    print("| M x K x N | float32 MatMul us | u8s8 MatMulInteger us | ratio |\n|---|---|---|---|")
    for m, k, n in ((128, 768, 768), (128, 768, 3072), (128, 3072, 768), (1, 768, 768)):
        times = []
        for kind in ("float", "int8"):
            x_type, w, y_type = (
                (TensorProto.FLOAT, rng.normal(size=(k, n)).astype(np.float32), TensorProto.FLOAT)
                if kind == "float"
                else (TensorProto.UINT8, rng.integers(-63, 64, (k, n)).astype(np.int8), 6)
            )
            op = "MatMul" if kind == "float" else "MatMulInteger"
            graph = helper.make_graph(
                [helper.make_node(op, ["x", "w"], ["y"])],
                "g",
                [helper.make_tensor_value_info("x", x_type, [m, k])],
                [helper.make_tensor_value_info("y", y_type, [m, n])],
                [numpy_helper.from_array(w, "w")],
            )
            model = helper.make_model(
                graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8
            )
            x = rng.normal(size=(m, k)).astype(np.float32)
            if kind == "int8":
                x = rng.integers(0, 256, (m, k)).astype(np.uint8)
            times.append(_median_us(model, {"x": x}, runs=50))
        print(f"| {m} x {k} x {n} | {times[0]:.0f} | {times[1]:.0f} | {times[1] / times[0]:.2f} |")
    print()
    conv_kernels()


def conv_kernels() -> None:
    """QLinearConv by dtype pair (activation x weight) against float32 Conv at ResNet-50's
    3x3 shapes, 1 thread, median of 30 runs: the integer kernels' speed depends on the pair
    (`engine.cost.S8_FLOP_FACTOR`)."""
    rng = np.random.default_rng(0)
    pairs = (("u8", "u8"), ("u8", "s8 (7-bit)"), ("s8", "s8"))
    print(
        "| N x C x H x W, 3x3 | float32 Conv us | "
        + " | ".join(f"{a} x {w}" for a, w in pairs)
        + " |"
    )
    print("|---|---|" + "---|" * len(pairs))
    for c, hw in ((64, 56), (128, 28), (256, 14), (512, 7)):
        x = rng.normal(size=(1, c, hw, hw)).astype(np.float32)
        w = rng.normal(0, 0.05, (c, c, 3, 3)).astype(np.float32)
        shape = [1, c, hw, hw]

        def model(nodes, x_type, inits, shape=shape):
            graph = helper.make_graph(
                nodes,
                "g",
                [helper.make_tensor_value_info("x", x_type, shape)],
                [helper.make_tensor_value_info("y", x_type, None)],
                inits,
            )
            return helper.make_model(
                graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8
            )

        conv = helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])
        base = _median_us(
            model([conv], TensorProto.FLOAT, [numpy_helper.from_array(w, "w")]), {"x": x}
        )
        cells = []
        for a, wt in pairs:
            a_np, a_type = (
                (np.uint8, TensorProto.UINT8) if a == "u8" else (np.int8, TensorProto.INT8)
            )
            if wt == "u8":
                wq = rng.integers(0, 256, w.shape).astype(np.uint8)
            else:
                top = 63 if "7-bit" in wt else 127
                wq = rng.integers(-top, top + 1, w.shape).astype(np.int8)
            inits = [
                numpy_helper.from_array(wq, "w"),
                numpy_helper.from_array(np.array(0.02, np.float32), "s"),
                numpy_helper.from_array(np.zeros((), a_np), "zx"),
                numpy_helper.from_array(np.zeros((), wq.dtype), "zw"),
            ]
            q = helper.make_node(
                "QLinearConv", ["x", "s", "zx", "w", "s", "zw", "s", "zx"], ["y"], pads=[1] * 4
            )
            info = np.iinfo(a_np)
            xq = rng.integers(info.min, info.max + 1, shape).astype(a_np)
            cells.append(_median_us(model([q], a_type, inits), {"x": xq}) / base)
        print(
            f"| 1 x {c} x {hw} x {hw} | {base:.0f} | "
            + " | ".join(f"{r:.2f}x" for r in cells)
            + " |"
        )


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--models", nargs="+", default=["bert"], choices=sorted(M.SPECS))
    ap.add_argument("--exporters", nargs="+", default=list(M.EXPORTERS), choices=M.EXPORTERS)
    ap.add_argument("--runs", type=int, default=30, help="paired latency runs (default 30)")
    ap.add_argument("--inputs", type=int, default=32, help="inputs for the error (default 32)")
    ap.add_argument(
        "--budget",
        type=float,
        default=0.5,
        metavar="F",
        help="also run `rewrite quantize --error-budget` at F times onnxruntime's measured error "
        "(default 0.5; 0 skips it), calibrated on --calibration inputs of other seeds",
    )
    ap.add_argument(
        "--mode",
        choices=("dynamic", "weight-only", "static"),
        default="dynamic",
        help="dynamic (default); weight-only: ours against onnxruntime's MatMulNBitsQuantizer, "
        "both 4-bit, blocks of 32, symmetric; static: against quantize_static (QDQ, "
        "per-channel), both calibrated on the same inputs",
    )
    ap.add_argument("--calibration", type=int, default=8, help="calibration inputs (default 8)")
    ap.add_argument(
        "--threads",
        type=int,
        nargs="+",
        default=[1],
        metavar="N",
        help="intra-op thread counts to time each pair at, one latency column each (default 1; "
        "e.g. --threads 1 2)",
    )
    ap.add_argument("--kernels", action="store_true", help="time the int8 kernels and stop")
    args = ap.parse_args(argv)
    if args.kernels:
        kernels()
        return 0
    if any(t < 1 for t in args.threads):
        ap.error("--threads: thread counts are 1 or more")
    os.environ.setdefault("OMP_NUM_THREADS", str(max(args.threads)))
    compile_package()
    lat = " | ".join(f"latency / float ({t} thread{'s' if t > 1 else ''})" for t in args.threads)
    print(f"CPU: {cpu()}; onnxruntime {ort.__version__}\n")
    print(
        f"| model | quantizer | {lat} | max err / max abs ref | mean over inputs "
        "| argmax agrees | quantize s | file MB |\n|---|---|"
        + "---|" * len(args.threads)
        + "---|---|---|---|---|"
    )
    for name in args.models:
        for exporter in args.exporters:
            bench_model(name, exporter, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
