"""Optimize seconds of this checkout against another commit's, on the full-size models.

    python bench/against.py 475d4c3                       # every model in bench/.models
    python bench/against.py 475d4c3 --models bert gpt2 --repeat 5

The other commit is checked out into a temporary git worktree. For each model (files from
bench/models.py, in bench/.models), each tree runs in its own process (its packages first on
`PYTHONPATH`): load the shipped rules and the model, then call the engine-level
`frontends.onnx.optimize_model(model, rules)` (exact rules, no output check) `--repeat` times
and keep the fastest call, in seconds. The two trees alternate per model, so that a slow patch
of the machine hits both. Prints compute nodes and best seconds per tree, their ratio
(this / other), and the geometric mean and the maximum of the ratios.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
MODELS = BENCH / ".models"

_WORKER = """
import json, sys, time
import onnx
from dsl import load_rules, shipped_rules_dir
from frontends.onnx import optimize_model
rules = load_rules([shipped_rules_dir()])
model = onnx.load(sys.argv[1])
best = float("inf")
for _ in range(int(sys.argv[2])):
    start = time.perf_counter()
    out, _ = optimize_model(model, rules)
    best = min(best, time.perf_counter() - start)
nodes = sum(1 for n in out.graph.node if n.op_type != "Constant")
print(json.dumps({"seconds": best, "nodes": nodes}))
"""


def run(tree: Path, model: Path, repeat: int) -> dict:
    """Best-of-`repeat` optimize seconds and compute nodes of `model` with `tree`'s code."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    p = subprocess.run(
        [sys.executable, "-c", _WORKER, str(model), str(repeat)],
        capture_output=True,
        text=True,
        cwd=tree,
        env=env,
    )
    if p.returncode:
        return {"error": (p.stderr.strip().splitlines() or ["?"])[-1]}
    return json.loads(p.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("commit", help="the commit to compare against (e.g. 475d4c3)")
    ap.add_argument("--models", nargs="*", help="model name prefixes (default: every model)")
    ap.add_argument("--repeat", type=int, default=3, help="calls per model and tree (best kept)")
    args = ap.parse_args()
    files = sorted(MODELS.glob("*.onnx"))
    if args.models:
        files = [f for f in files if any(f.name.startswith(m + ".") for m in args.models)]
    if not files:
        print("error: no models in bench/.models (run python bench/models.py)", file=sys.stderr)
        return 1
    with tempfile.TemporaryDirectory() as tmp:
        other = Path(tmp) / "other"
        subprocess.run(
            ["git", "worktree", "add", "-q", "--detach", str(other), args.commit],
            cwd=ROOT,
            check=True,
        )
        try:
            return _compare(files, other, args)
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(other)], cwd=ROOT)


def _compare(files: list[Path], other: Path, args) -> int:
    print(f"{'model':<30} {'nodes':>11} {'s ' + args.commit[:8]:>12} {'s this':>8} {'ratio':>6}")
    ratios = []
    start = time.perf_counter()
    for f in files:
        old = run(other, f, args.repeat)
        new = run(ROOT, f, args.repeat)
        name = f.name.removesuffix(".onnx")
        if "error" in old or "error" in new:
            print(f"{name:<30} error: {old.get('error') or new.get('error')}")
            continue
        r = new["seconds"] / old["seconds"]
        ratios.append(r)
        nodes = f"{old['nodes']}/{new['nodes']}"
        print(f"{name:<30} {nodes:>11} {old['seconds']:>12.2f} {new['seconds']:>8.2f} {r:>6.2f}")
    if ratios:
        geo = math.exp(sum(map(math.log, ratios)) / len(ratios))
        print(f"ratio this/{args.commit[:8]}: geomean {geo:.2f}, max {max(ratios):.2f}")
    print(f"({time.perf_counter() - start:.0f} s, best of {args.repeat})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
