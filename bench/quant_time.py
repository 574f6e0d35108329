"""Seconds to quantize: `rewrite quantize` against onnxruntime's quantizers, alternately.

    python bench/quant_time.py                                   # BERT-base, TorchScript
    python bench/quant_time.py --models distilbert bert gpt2 --repeats 5

bench/quant.py times each quantizer once beside its latency and error; on a 2-core machine a
single run of a 4-8 s command moves by 20-40% (measured: the same `rewrite quantize` 4.9 s and
6.6 s in two runs; the kernel's transparent huge pages make a cold process's large numpy
allocations cost anywhere from 0.2 to 1 s). Here each pair runs `--repeats` times, the two
commands alternating, and the table gives the medians and the median of the paired ratios.

Pairs (each a fresh process, as a user runs it: imports, model load and save included; ours
with the output check off, as onnxruntime's has none):

* dynamic: `rewrite quantize IN OUT` (per-column int8 weights) against
  `onnxruntime.quantization.quantize_dynamic(IN, OUT)`;
* gptq: `rewrite quantize IN OUT --rounding gptq` on `--calibration` inputs (bench/models.py's,
  seeds 1000..) against the same `quantize_dynamic` (onnxruntime has no calibrated rounding
  for int8; its GPTQ is for 4-bit MatMulNBits);
* weight-only: `rewrite quantize IN OUT --mode weight-only --target onnxruntime` (4-bit
  blocks of 32, MatMulNBits) against onnxruntime's `MatMulNBitsQuantizer` at the same
  settings;
* weight-only-onnx: `rewrite quantize IN OUT --mode weight-only` (the default target, standard
  ONNX: int4 DequantizeLinear with block_size) against the same `MatMulNBitsQuantizer`;
* static: `rewrite quantize IN OUT --mode static --target onnxruntime` against
  `quantize_static` (QDQ, per-channel), both on the `--calibration` inputs.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))
import models as M  # noqa: E402  (bench/models.py, beside this file)
import quant as Q  # noqa: E402  (bench/quant.py: the quantizer commands)

OUT = BENCH / "out" / "quant_time"
MODES = ("dynamic", "gptq", "weight-only", "weight-only-onnx", "static")


def pairs(src: Path, work: Path, calibration: Path) -> dict:
    """mode -> (our command, onnxruntime's), each a callable returning seconds."""
    ours, theirs = work / "ours.onnx", work / "ort.onnx"
    gptq = ("--rounding", "gptq", "--calibration", str(calibration))
    return {
        "dynamic": (lambda: Q.quantize_ours(src, ours), lambda: Q.quantize_ort(src, theirs)),
        "gptq": (lambda: Q.quantize_ours(src, ours, *gptq), lambda: Q.quantize_ort(src, theirs)),
        "weight-only": (
            lambda: Q.quantize_ours_weight_only(src, ours),
            lambda: Q.quantize_ort_weight_only(src, theirs),
        ),
        "weight-only-onnx": (
            lambda: Q.quantize_ours_weight_only_onnx(src, ours),
            lambda: Q.quantize_ort_weight_only(src, theirs),
        ),
        "static": (
            lambda: Q.quantize_ours_static(src, ours, calibration),
            lambda: Q.quantize_ort_static(src, theirs, calibration),
        ),
    }


def bench(name: str, exporter: str, modes: list[str], repeats: int, n_cal: int) -> list[str]:
    """Markdown rows: model, mode, our median seconds, onnxruntime's, the median ratio."""
    src = M.CACHE / f"{name}.{exporter}.onnx"
    if not src.exists():
        M.main(["--models", name, "--exporters", exporter])
    work = OUT / f"{name}.{exporter}"
    work.mkdir(parents=True, exist_ok=True)
    cal = work / "calibration.npz"
    M.save_inputs(cal, name, range(1000, 1000 + n_cal))
    rows = []
    for mode in modes:
        ours, theirs = pairs(src, work, cal)[mode]
        a, b = [], []
        for _ in range(repeats):
            a.append(ours())
            b.append(theirs())
        ratio = statistics.median(x / y for x, y in zip(a, b))
        row = (
            f"| {name}.{exporter} | {mode} | {statistics.median(a):.1f} | "
            f"{statistics.median(b):.1f} | {ratio:.2f}x |"
        )
        print(row, flush=True)
        rows.append(row)
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--models", nargs="+", default=["bert"], choices=sorted(M.SPECS))
    p.add_argument("--exporters", nargs="+", default=["torchscript"], choices=M.EXPORTERS)
    p.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    p.add_argument("--repeats", type=int, default=3, help="runs of each command (default 3)")
    p.add_argument(
        "--calibration",
        type=int,
        default=8,
        help="calibration inputs of gptq and static (default 8)",
    )
    args = p.parse_args(argv)
    Q.compile_package()
    print(f"CPU: {Q.cpu()}")
    print("| model | mode | ours (s) | onnxruntime (s) | ours / onnxruntime |")
    print("|---|---|---|---|---|")
    for name in args.models:
        for exporter in args.exporters:
            bench(name, exporter, args.modes, args.repeats, args.calibration)
    return 0


if __name__ == "__main__":
    sys.exit(main())
