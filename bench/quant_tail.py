"""How far the worst of 32 inputs moves: per-input errors of a quantized file on many inputs.

    python bench/quant_tail.py --models gpt2 vit bert distilbert llama --exporters torchscript

The budget rows (bench/quant_budget.py) state the worst error, max|q - ref| / max|ref|, over
32 measured inputs, beside the worst over the 32 the search ran on. This measures how much of
the gap between the two is the statistic's own spread. For each model and exporter it reads
the file bench/quant_budget.py wrote last (`bench/out/quant/<model>.<exporter>/budget.onnx`;
the command that made it decides what it is: a budget row, or `--budget 0`, every product
quantized) and measures each input's error (the worst output, as bench/quant.py's `errors`) on
the validation inputs (seeds 2000.., the budget search's with `--validation`), the measured
ones (seeds 0..) and `--fresh` more (seeds 3000..). From the measured and fresh inputs, none of
which the search or the calibrated stages saw, it draws 20000 sets of 32 without replacement:
the median and the 90th percentile of their worst input, and the share of draws whose worst
exceeds the validation inputs' worst (about half if the validation set's worst were a typical
worst of 32; by exchangeability, a new set of M inputs has its worst above the worst of N
others with probability M / (N + M)). When the file came with bench/quant_budget.py's report
(`budget.json`), also its budget, the share of inputs over it that `rewrite quantize` estimates
from the validation inputs' errors (`frontends.onnx.quantize.tail_share`, what
`--over-budget-share` holds), and how many of the unseen inputs are over it.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from frontends.onnx.quantize import tail_share

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))
import models as M  # noqa: E402  (bench/models.py, beside this file)
import quant as Q  # noqa: E402  (bench/quant.py: the same sessions and errors)

DRAWS = 20000
SET = 32  # the size of the sets drawn (bench/quant_budget.py's measured inputs)


def row(name: str, exporter: str, args) -> str:
    """The table row of `name`'s `exporter` budget file (or why there is none)."""
    label = f"{name} {exporter}"
    work = Q.OUT / f"{name}.{exporter}"
    src, dst = M.CACHE / f"{name}.{exporter}.onnx", work / "budget.onnx"
    if not (src.exists() and dst.exists()):
        return f"| {label} | no budget file: run bench/quant_budget.py first |"
    ref, q = Q.session(src), Q.session(dst)
    seen = np.array(Q.errors(name, ref, q, args.validation, first=2000)["per_input"])
    measured = Q.errors(name, ref, q, args.inputs)["per_input"]
    fresh = Q.errors(name, ref, q, args.fresh, first=3000)["per_input"]
    unseen = np.array(measured + fresh)
    rng = np.random.default_rng(0)
    worst = np.array([rng.choice(unseen, SET, replace=False).max() for _ in range(DRAWS)])
    median, p90 = np.quantile(worst, [0.5, 0.9])
    pct = lambda x: f"{100 * x:.2f}%"  # noqa: E731
    report = work / "budget.json"
    budget = None
    if report.exists():
        budget = json.loads(report.read_text())["extra"].get("quantize", {}).get("budget")
    against = "| - | - | - |"
    if budget:
        tail = tail_share(seen, budget)
        share = "-" if tail is None else f"{100 * tail['share']:.3g}%"
        against = f"| {pct(budget)} | {share} | {int(np.sum(unseen > budget))} |"
    return (
        f"| {label} | {pct(seen.mean())} | {pct(seen.std())} | {pct(seen.max())} "
        f"| {pct(max(measured))} | {pct(unseen.mean())} | {pct(unseen.std())} "
        f"| {pct(unseen.max())} | {(unseen.max() - unseen.mean()) / unseen.std():.1f} "
        f"| {pct(median)} | {pct(p90)} | {np.mean(worst > seen.max()):.2f} {against}"
    )


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--models", nargs="+", default=["gpt2"], choices=sorted(M.SPECS))
    ap.add_argument(
        "--exporters", nargs="+", default=["torchscript", "dynamo"], choices=M.EXPORTERS
    )
    ap.add_argument("--validation", type=int, default=32, help="validation inputs (32)")
    ap.add_argument("--inputs", type=int, default=32, help="measured inputs (32)")
    ap.add_argument("--fresh", type=int, default=128, help="more inputs, seeds 3000.. (128)")
    args = ap.parse_args(argv)
    n = args.inputs + args.fresh
    print(
        f"| model | mean validation | sd | worst validation | worst measured | mean of {n} "
        f"unseen | sd | worst | (worst - mean) / sd | worst of {SET} unseen: median | 90th "
        "percentile | share over the worst validation | budget | estimated share over it "
        "| unseen over it |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
        flush=True,
    )
    for name in args.models:
        for exporter in args.exporters:
            print(row(name, exporter, args), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
