"""Benchmark: optimize real models and deep synthetic graphs, report time per stage and memory.

    python bench/run.py                 # real models + deep graphs of ~1k, 10k, 50k nodes
    python bench/run.py --sizes 1000    # a quick run

Each model is optimized in its own subprocess so that peak memory (max RSS) is per model.
The table shows nodes before/after, seconds per stage, total seconds, microseconds per input
node, and peak memory; the last lines compare time per node at the largest size against the
smallest (linear growth means a ratio near 1).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def measure(path: str) -> dict:
    """Optimize one ONNX file in this process; return nodes, stage seconds and peak RSS (MB)."""
    import onnx

    from dsl import load_rules, shipped_rules_dir
    from frontends.onnx import optimize_model

    rules = load_rules([shipped_rules_dir()])
    model = onnx.load(path)
    start = time.perf_counter()
    _, report = optimize_model(model, rules, fp=("exact", "reassoc"))
    total = time.perf_counter() - start
    peak_mb = _peak_rss_mb()
    return {
        "nodes_before": report.nodes_before,
        "nodes_after": report.nodes_after,
        "seconds": report.seconds,
        "total": total,
        "stop": report.stop_reason,
        "enodes": report.enodes,
        "peak_mb": peak_mb,
    }


def _peak_rss_mb() -> float:
    """Peak resident memory of this process in MB: VmHWM, which exec resets (ru_maxrss would
    include the parent's memory at fork time)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _models(tmp: Path, sizes: list[int], real: bool) -> list[tuple[str, Path]]:
    sys.path.insert(0, str(ROOT / "examples"))
    sys.path.insert(0, str(ROOT / "bench"))
    import onnx

    out = []
    if real:
        import make_models

        for name in ("bert", "gpt2", "resnet", "vit"):
            p = tmp / f"{name}.onnx"
            getattr(make_models, name)(str(p))
            out.append((name, p))
    from make_deep import deep_model

    for n in sizes:
        p = tmp / f"deep{n}.onnx"
        onnx.save(deep_model(n), str(p))
        out.append((f"deep-{n}", p))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--sizes", type=int, nargs="*", default=[1000, 10000, 50000])
    ap.add_argument("--no-real", action="store_true", help="skip the transformers models")
    ap.add_argument("--one", help=argparse.SUPPRESS)
    ap.add_argument("--markdown", action="store_true", help="print the table as Markdown")
    args = ap.parse_args()
    if args.one:
        print(json.dumps(measure(args.one)))
        return
    from rich.console import Console
    from rich.table import Table

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, path in _models(Path(tmp), args.sizes, not args.no_real):
            res = subprocess.run(
                [sys.executable, __file__, "--one", str(path)],
                capture_output=True,
                text=True,
                env=os.environ,
            )
            if res.returncode:
                print(f"{name}: failed\n{res.stderr[-2000:]}", file=sys.stderr)
                continue
            rows.append((name, json.loads(res.stdout.strip().splitlines()[-1])))
    t = Table(title="rewrite optimize: shipped rules (exact + reassoc), this machine")
    cols = [
        "model",
        "nodes before",
        "after",
        "import s",
        "saturate s",
        "extract s",
        "fold s",
        "total s",
        "us/node",
        "stop",
        "peak MB",
    ]
    for c in cols:
        t.add_column(c, justify="left" if c in ("model", "stop") else "right")
    cells = []
    for name, r in rows:
        s = r["seconds"]
        cells.append(
            [
                name,
                str(r["nodes_before"]),
                str(r["nodes_after"]),
                f"{s['import']:.2f}",
                f"{s['saturate']:.2f}",
                f"{s['extract']:.2f}",
                f"{s['fold']:.2f}",
                f"{r['total']:.2f}",
                f"{1e6 * r['total'] / r['nodes_before']:.0f}",
                r["stop"],
                f"{r['peak_mb']:.0f}",
            ]
        )
    if args.markdown:
        print("| " + " | ".join(cols) + " |\n|" + "---|" * len(cols))
        for row in cells:
            print("| " + " | ".join(row) + " |")
    else:
        for row in cells:
            t.add_row(*row)
        Console(width=150).print(t)
    deep = [(n, r) for n, r in rows if n.startswith("deep-")]
    if len(deep) >= 2:
        (n0, r0), (n1, r1) = deep[0], deep[-1]
        per0, per1 = r0["total"] / r0["nodes_before"], r1["total"] / r1["nodes_before"]
        print(f"time per node, {n1} vs {n0}: {per1 / per0:.2f}x (linear = 1.0; target <= 2.0)")
        print(f"{n1}: {r1['total']:.1f} s total (target < 60 s)")


if __name__ == "__main__":
    main()
