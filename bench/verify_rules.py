"""Benchmark: time to verify every rule (`rewrite verify`), per rule and in total.

    python bench/verify_rules.py                      # the shipped library, default examples
    python bench/verify_rules.py --jobs 1             # one process (per-rule times uncontended)
    python bench/verify_rules.py tests/wrong_rules    # the wrong-rule corpus: examples to catch

Prints one row per rule: its checks (numeric, engine, multi-use, commuted, negative), the
numeric examples tried (for a rule that fails: the examples it took to catch it), the status
and the seconds; then the wall-clock total, the sum and mean of per-rule seconds, and the
slowest rules. The budget is the whole library in under 2 minutes on a 2-core machine.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main() -> int:
    from verify.runner import DEFAULT_EXAMPLES

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "paths", nargs="*", help="rule files or directories (default: the shipped library)"
    )
    ap.add_argument("--examples", type=int, default=DEFAULT_EXAMPLES)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    args = ap.parse_args()
    from dsl import load_rules, shipped_rules_dir
    from verify.cli import run

    rules = load_rules([Path(p) for p in args.paths] if args.paths else [shipped_rules_dir()])
    start = time.perf_counter()
    results = run(args.paths, rules.names(), args.examples, args.seed, args.jobs)
    wall = time.perf_counter() - start
    _table(results)
    _summary(results, wall, args)
    return 0


def _table(results) -> None:
    print(
        f"{'rule':<40} {'file:line':<38} {'checks':>6} {'examples':>9} {'status':>6} {'seconds':>8}"
    )
    for r in results:
        f = r.failure
        examples = f"@{f.caught_after}" if f and f.caught_after else str(r.examples)
        where = f"{r.rule.span.file}:{r.rule.span.line}"
        print(
            f"{r.rule.name:<40} {where:<38} {len(r.checks):>6} {examples:>9} {r.status:>6} "
            f"{r.seconds:>8.2f}"
        )


def _summary(results, wall: float, args) -> None:
    per_rule = [r.seconds for r in results]
    status = Counter(r.status for r in results)
    print()
    print(
        f"{len(results)} rules ({', '.join(f'{n} {s}' for s, n in sorted(status.items()))}), "
        f"{args.examples} examples, seed {args.seed}, {args.jobs} job(s)"
    )
    print(
        f"wall clock {wall:.1f} s; per rule: sum {sum(per_rule):.1f} s, "
        f"mean {sum(per_rule) / len(per_rule):.2f} s, "
        f"max {max(per_rule):.2f} s"
    )
    slow = sorted(results, key=lambda r: -r.seconds)[:5]
    print("slowest: " + ", ".join(f"{r.rule.name} {r.seconds:.2f} s" for r in slow))
    caught = [r.failure.caught_after for r in results if r.failure and r.failure.caught_after]
    if caught:
        print(f"examples to catch the failing rules: {sorted(caught)} (max {max(caught)})")


if __name__ == "__main__":
    sys.exit(main())
