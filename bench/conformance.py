"""Benchmark: ONNX's backend node conformance suite through the optimizer (`verify.conformance`).

    python bench/conformance.py                 # every case, the shipped library, 2 processes
    python bench/conformance.py --pattern attention --jobs 1

Prints the count of each outcome (ok, unchanged, not-runnable, crash, invalid, mismatch,
ort-mismatch), how many cases changed, the rules that fired with their total matches, every
not-runnable case with its reason and every failure with its message. Exit status 1 when any
case failed (crash, invalid, mismatch, ort-mismatch).
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
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "paths", nargs="*", help="rule files or directories (default: the shipped library)"
    )
    ap.add_argument("--pattern", help="only cases whose name contains this")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--markdown", action="store_true", help="print the counts as Markdown")
    args = ap.parse_args()
    from dsl import shipped_rules_dir
    from verify.conformance import FAILURES, OUTCOMES, run_suite

    start = time.perf_counter()
    results = run_suite(args.paths or [shipped_rules_dir()], args.pattern, args.jobs)
    wall = time.perf_counter() - start
    counts = Counter(r.outcome for r in results)
    fired = Counter()
    for r in results:
        fired.update(r.fired)
    if args.markdown:
        print(
            f"{len(results)} cases in {wall:.0f} s on {args.jobs} processes; "
            f"{sum(r.changed for r in results)} changed; "
            f"{sum(fired.values())} matches of {len(fired)} rules.\n"
        )
        print("| " + " | ".join(OUTCOMES) + " |\n|" + "---|" * len(OUTCOMES))
        print("| " + " | ".join(str(counts[o]) for o in OUTCOMES) + " |\n")
        for outcome in ("not-runnable", *FAILURES):
            for r in (r for r in results if r.outcome == outcome):
                print(f"- {outcome}: `{r.name}`: {r.detail}")
        return 1 if any(counts[o] for o in FAILURES) else 0
    print(f"{len(results)} cases in {wall:.0f} s; {sum(r.changed for r in results)} changed")
    print("  ".join(f"{o}: {counts[o]}" for o in OUTCOMES))
    print(f"rules fired: {sum(fired.values())} matches of {len(fired)} rules")
    for name, n in fired.most_common():
        print(f"  {name:<40} {n:>6}")
    for outcome in ("not-runnable", *FAILURES):
        for r in (r for r in results if r.outcome == outcome):
            print(f"{outcome:<13} {r.name}: {r.detail}")
    return 1 if any(counts[o] for o in FAILURES) else 0


if __name__ == "__main__":
    sys.exit(main())
