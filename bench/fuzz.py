"""Benchmark: graph fuzzing at scale (`verify.graphs`, `verify.fuzz`).

    python bench/fuzz.py                      # 10,000 graphs on 2 processes
    python bench/fuzz.py --examples 500 --seed 7 --jobs 1

Generates random valid models, optimizes each with the shipped rules (every numeric class),
compares each result with its original under onnxruntime and onnx.reference, and prints how
many graphs were generated and how many changed, the rules that fired (matches in total and per
rule), and every distinct failure, reduced to a minimal graph (`verify.fuzz.reduce_graph`)
and printed as ONNX text. Exit status 1 if any graph failed.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import re
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
PROGRESS = 250  # graphs between progress lines on stderr


def fuzz(examples: int, seed: int):
    """(Stats, {failure key: (message, model bytes)}) of `examples` graphs drawn with `seed`."""
    import warnings

    import onnx.printer
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import seed as hypothesis_seed

    from dsl import load_rules, shipped_rules_dir
    from verify.fuzz import GeneratorError, OptimizerError, Stats, check_graph
    from verify.graphs import onnx_graphs

    warnings.simplefilter("ignore")
    rules = load_rules([shipped_rules_dir()])
    stats, failures = Stats(), {}

    @hypothesis_seed(seed)
    @settings(
        max_examples=examples,
        deadline=None,
        database=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(onnx_graphs())
    def run(model):
        try:
            stats.add(model, check_graph(model, rules))
        except (GeneratorError, OptimizerError) as e:
            stats.graphs += 1
            if _key(e) not in failures:  # said at once: a long run may be stopped before the end
                first = str(e).splitlines()[0] if str(e) else type(e).__name__
                print(f"[seed {seed}] failure at graph {stats.graphs}: {first}", file=sys.stderr)
                print(onnx.printer.to_text(model), file=sys.stderr, flush=True)
            failures.setdefault(_key(e), (str(e), model.SerializeToString()))
        if stats.graphs % PROGRESS == 0:  # a long run says how far it got
            print(
                f"[seed {seed}] {stats.graphs} graphs, {stats.changed} changed, "
                f"{sum(stats.fired.values())} matches, {len(failures)} failures",
                file=sys.stderr,
                flush=True,
            )

    run()
    return stats, failures


def _key(e: Exception) -> str:
    """Failures that differ only in numbers and names are one failure."""
    return f"{type(e).__name__}: " + re.sub(r"\d+|'[^']*'", "#", str(e))[:120]


def _reduce(message: str, data: bytes) -> str:
    import onnx
    import onnx.printer

    from dsl import load_rules, shipped_rules_dir
    from verify.fuzz import OptimizerError, check_graph, reduce_graph

    rules = load_rules([shipped_rules_dir()])
    kind = message.split(":", 1)[0]

    def fails(m) -> bool:
        try:
            check_graph(m, rules)
        except OptimizerError as e:
            return e.kind == kind
        return False

    model = onnx.load_from_string(data)
    small = reduce_graph(model, fails) if fails(model) else model
    return f"{len(model.graph.node)} -> {len(small.graph.node)} nodes\n" + onnx.printer.to_text(
        small
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--examples", type=int, default=10_000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--markdown", action="store_true", help="print the counts as Markdown")
    args = ap.parse_args()
    start = time.perf_counter()
    shares = [
        args.examples // args.jobs + (k < args.examples % args.jobs) for k in range(args.jobs)
    ]
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(args.jobs, mp_context=ctx) as pool:
        parts = list(pool.map(fuzz, shares, [args.seed * 1000 + k for k in range(args.jobs)]))
    stats, failures = parts[0]
    for s, f in parts[1:]:
        stats.graphs += s.graphs
        stats.changed += s.changed
        stats.nodes += s.nodes
        stats.fired.update(s.fired)
        stats.compared.update(s.compared)
        for k, v in f.items():
            failures.setdefault(k, v)
    wall = time.perf_counter() - start
    per_graph = stats.nodes / max(stats.graphs, 1)
    if args.markdown:
        print(
            f"`--examples {args.examples} --seed {args.seed} --jobs {args.jobs}`: "
            f"{wall:.0f} s, {per_graph:.0f} nodes per graph on average.\n"
        )
        print(
            "| graphs | changed | compared (onnxruntime / onnx.reference) | rule matches "
            "| rules fired | distinct failures |\n|---|---|---|---|---|---|"
        )
        print(
            f"| {stats.graphs} | {stats.changed} | {stats.compared['onnxruntime']} / "
            f"{stats.compared['onnx.reference']} | {sum(stats.fired.values())} | "
            f"{len(stats.fired)} | {len(failures)} |"
        )
        for message, data in failures.values():
            print(f"\n```\n{message}\n{_reduce(message, data)}\n```")
        return 1 if failures else 0
    print(f"{stats.graphs} graphs generated in {wall:.0f} s ({per_graph:.0f} nodes on average)")
    print(
        f"{stats.changed} changed; compared under onnxruntime {stats.compared['onnxruntime']}, "
        f"onnx.reference {stats.compared['onnx.reference']}"
    )
    print(f"rules fired: {sum(stats.fired.values())} matches of {len(stats.fired)} rules")
    for name, n in stats.fired.most_common():
        print(f"  {name:<44} {n:>8}")
    print(f"{len(failures)} distinct failures")
    for message, data in failures.values():
        print(f"\n{message}\n{_reduce(message, data)}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
