"""Op counts of rewrite's output next to each peer's, per model: which rules to write next.

    python bench/opdiff.py                      # every model in bench/out/peers.json
    python bench/opdiff.py --models bert --top 15 --ours rewrite-reassoc

Reads the op counts bench/peers.py stored in bench/out/peers.json (run it first). For each model
it prints only the op types whose counts differ between ours and some peer, sorted by
ours - best peer (the peer with the fewest compute nodes on that model), largest first:
positive rows are ops the peers remove and we keep.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent
RESULTS = BENCH / "out" / "peers.json"
sys.path.insert(0, str(BENCH))
from peers import PEERS, compute_nodes  # noqa: E402


def diff_rows(r: dict, ours: str) -> tuple[str | None, list[str], list[tuple]]:
    """(best peer, peers shown, rows) for one model's results.

    Rows are (op, ours - best, ours count, count per shown peer), sorted by ours - best
    descending, then op name; only op types where some count differs from ours."""
    tools = r.get("tools", {})
    mine = tools.get(ours, {})
    if not mine.get("ok"):
        return None, [], []
    peers = [p for p in PEERS if tools.get(p, {}).get("ok")]
    if not peers:
        return None, [], []
    best = min(peers, key=lambda p: compute_nodes(tools[p]["ops"]))
    ops = sorted({op for t in [ours, *peers] for op in tools[t]["ops"]} - {"Constant"})
    rows = []
    for op in ops:
        counts = [tools[t]["ops"].get(op, 0) for t in [ours, *peers]]
        if len(set(counts)) > 1:
            rows.append((op, counts[0] - tools[best]["ops"].get(op, 0), counts[0], counts[1:]))
    rows.sort(key=lambda row: (-row[1], row[0]))
    return best, peers, rows


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--models",
        nargs="+",
        metavar="NAME",
        help="model names (bert) or labels (bert.torchscript); default: all",
    )
    ap.add_argument(
        "--ours",
        default="rewrite",
        choices=["rewrite", "rewrite-reassoc"],
        help="which rewrite output to compare (default: rewrite, exact rules)",
    )
    ap.add_argument("--top", type=int, default=0, help="rows per model (default: all)")
    ap.add_argument("--results", type=Path, default=RESULTS, help="peers.py's JSON")
    args = ap.parse_args(argv)
    if not args.results.exists():
        ap.error(f"{args.results} not found: run python bench/peers.py first")
    from rich.console import Console
    from rich.table import Table

    console = Console(width=200)
    results = json.loads(args.results.read_text())["models"]
    for label, r in results.items():
        if args.models and label not in args.models and r.get("model") not in args.models:
            continue
        if "generation_failed" in r:
            console.print(f"{label}: not generated ({r['generation_failed']})")
            continue
        best, peers, rows = diff_rows(r, args.ours)
        if best is None:
            why = (r["tools"].get(args.ours) or {}).get("reason") or "no result"
            console.print(f"{label}: no comparison ({args.ours}: {why})")
            continue
        ours_n = compute_nodes(r["tools"][args.ours]["ops"])
        best_n = compute_nodes(r["tools"][best]["ops"])
        if not rows:
            console.print(
                f"{label}: {args.ours} {ours_n} compute nodes, best peer {best} {best_n}: "
                f"same op counts as every peer"
            )
            continue
        t = Table(
            title=f"{label}: {args.ours} {ours_n} compute nodes, best peer {best} {best_n} "
            f"(before {r['compute_before']}); {len(rows)} op types differ",
            title_justify="left",
        )
        t.add_column("op")
        t.add_column("ours - best", justify="right")
        t.add_column(args.ours, justify="right")
        for p in peers:
            t.add_column(p + (" (best)" if p == best else ""), justify="right")
        for op, d, mine, theirs in rows[: args.top or None]:
            t.add_row(op, f"{d:+d}", str(mine), *map(str, theirs))
        console.print(t)


if __name__ == "__main__":
    main()
