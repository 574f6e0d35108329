"""One `rewrite quantize --error-budget` row per model, measured as bench/quant.py measures it,
with the number of calibration inputs and the quantize flags chosen, and the error on the
inputs the search saw beside the error on held-out ones.

    python bench/quant_budget.py --models bert distilbert gpt2 llama vit --calibration 32 \\
        --validation -- --smooth 0.5 --rounding gptq --cpu vnni

For each model and exporter (bench/models.py's full-size exports, TorchScript and dynamo unless
`--exporters` names one): onnxruntime's `quantize_dynamic` and its worst error over `--inputs`
measured inputs (seeds 0..n-1); the budget, `--budget` times that error; then `rewrite quantize
--error-budget BUDGET` with the flags after `--` (`--budget 0`: without a budget, every product
quantized), fitted (`--smooth`, `--rounding gptq`) on `--calibration` inputs of seeds 1000..,
and with `--validation [N]` searched and checked on N inputs of seeds 2000.. (as many as the
calibration inputs without N; else on the calibration inputs). Reported: latency / float
(median of 30 paired runs, ORT_ENABLE_ALL, 1 thread), the worst and mean error (max|q - ref| /
max|ref| per input, the worst output) and the argmax agreement on the measured inputs, the same
worst and mean on the inputs the search ran on, the share of inputs like those the search
estimates over the budget (`extra["quantize"]["tail"]` of its `--report`: an exponential tail
fitted to their errors, `--over-budget-share`), and the seconds `rewrite quantize` took. A run
over its budget on the search's inputs exits non-zero and writes nothing: its row says so.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))
import models as M  # noqa: E402  (bench/models.py, beside this file)
import quant as Q  # noqa: E402  (bench/quant.py: the same sessions, errors and latency)


def row(name: str, exporter: str, args) -> str:
    """Quantize `name`'s `exporter` export with a budget and return its table row."""
    (_, _, src, failure), *_ = M.ensure([name], [exporter])
    label = f"{name} {exporter}"
    if src is None:
        return f"| {label} | export failed: {failure} |"
    work = Q.OUT / f"{name}.{exporter}"
    work.mkdir(parents=True, exist_ok=True)
    ref = Q.session(src)
    ort_file = work / "onnxruntime.onnx"
    Q.quantize_ort(src, ort_file)
    budget = round(Q.errors(name, ref, Q.session(ort_file), args.inputs)["error"] * args.budget, 4)
    n = args.calibration
    cal = M.save_inputs(work / f"calibration-{n}.npz", name, range(1000, 1000 + n))
    more = ["--calibration", str(cal)]
    searched = 1000  # the first seed of the inputs the search runs on
    if budget:
        more += ["--error-budget", str(budget)]
    seen_n = n  # how many inputs the search runs on
    if args.validation is not None:
        seen_n = args.validation or n
        held = M.save_inputs(work / f"validation-{seen_n}.npz", name, range(2000, 2000 + seen_n))
        more += ["--validation", str(held)] if budget else []
        searched = 2000
    dst, report = work / "budget.onnx", work / "budget.json"
    dst.unlink(missing_ok=True)
    report.unlink(missing_ok=True)
    more += ["--report", str(report)]
    flags = " ".join(args.flags)
    stated = f"{100 * budget:.2f}%" if budget else "none"
    try:
        seconds = Q.quantize_ours(src, dst, *args.flags, *more)
    except subprocess.CalledProcessError:
        return f"| {label} | {flags} | {stated} | over budget: nothing written |"
    q = Q.session(dst)
    e = Q.errors(name, ref, q, args.inputs)
    seen = Q.errors(name, ref, q, seen_n, first=searched)
    lat = Q.latency(name, ref, q, args.runs)
    tail = json.loads(report.read_text())["extra"].get("quantize", {}).get("tail")
    share = "-" if not tail else f"{100 * tail['share']:.3g}%"
    return (
        f"| {label} | {flags} | {stated} | {lat:.3f}x | {100 * e['error']:.2f}% "
        f"| {100 * e['mean']:.2f}% | {100 * e['argmax']:.1f}% | {100 * seen['error']:.2f}% "
        f"| {100 * seen['mean']:.2f}% | {share} | {seconds:.0f} |"
    )


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--models", nargs="+", default=["bert"], choices=sorted(M.SPECS))
    ap.add_argument(
        "--exporters", nargs="+", default=["torchscript", "dynamo"], choices=M.EXPORTERS
    )
    ap.add_argument("--calibration", type=int, default=32, help="calibration inputs (32)")
    ap.add_argument(
        "--validation",
        nargs="?",
        type=int,
        const=0,
        metavar="N",
        help="search and check the budget on N validation inputs (`--validation`; N: as many as "
        "--calibration)",
    )
    ap.add_argument(
        "--budget",
        type=float,
        default=0.5,
        help="times onnxruntime's error (0.5); 0: no budget, every product quantized (the "
        "same measurement of the flags alone)",
    )
    ap.add_argument("--inputs", type=int, default=32, help="measured inputs (32)")
    ap.add_argument("--runs", type=int, default=30, help="paired latency runs (30)")
    ap.add_argument("flags", nargs="*", help="`rewrite quantize` flags, after --")
    args = ap.parse_args(argv)
    held = "" if args.validation is None else f", {args.validation or args.calibration} validation"
    print(f"CPU: {Q.cpu()}; {args.calibration} calibration inputs{held}", flush=True)
    searched = "calibration" if args.validation is None else "validation"
    print(
        "| model | flags | budget | latency / float | worst measured | mean measured | argmax "
        f"| worst on {searched} | mean on {searched} | estimated share over the budget | "
        "seconds |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|",
        flush=True,
    )
    for name in args.models:
        for exporter in args.exporters:
            print(row(name, exporter, args), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
