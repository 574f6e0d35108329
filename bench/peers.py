"""Full-size models against the peers, measured in the same run: nodes, seconds, memory, latency.

    python bench/peers.py                                   # everything (hours: run with nohup)
    python bench/peers.py --models bert resnet50 --exporters torchscript --tools rewrite onnxsim

Models come from bench/models.py (generated when missing, cached in bench/.models/): eight
transformers architectures, each from the TorchScript and the dynamo exporter, and the
synthetic Llama-like stacks of ~1k, 10k and 50k nodes (bench/make_deep.py).

Every (tool, model) runs in its own subprocess, killed after --timeout seconds, so that
seconds and peak memory are per tool:

* seconds: for an in-memory tool (every peer's Python call, and `rewrite-mem`, the
  `frontends.onnx.optimize_model` call with the output check off), the optimize call alone on
  a model already loaded with `onnx.load` (no imports, no load, no save); for a CLI tool
  (`rewrite`, `rewrite-reassoc`, `onnxsim-cli`), the CLI process from start to exit, each with
  its default output check. `wall` is the worker's whole time (imports, load, call, save);
* peak MB: peak resident memory of that process (VmHWM of the in-memory worker: the load of
  the model and the call, the worker's output not saved (nodes counted in memory) unless
  --keep-outputs; for a CLI, the CLI process's ru_maxrss from wait4), in MiB;
* compute nodes: nodes whose op_type is not Constant (subgraphs included).

Then, for rewrite's output (exact rules; the reassoc one if exact failed): onnxruntime latency
against the original (1 intra-op thread, ORT_DISABLE_ALL and ORT_ENABLE_ALL, the four sessions
run alternately in one process, median of --runs), as a ratio to the original; and a
second-shape check (batch 2, sequence halved; image models batch 2) of original against
rewrite's output: max |diff| and allclose with |a-b| <= 1e-4*max(1, max|ref|) + 1e-4*|ref|.

Results go to bench/out/peers.json (merged with earlier runs, per model), outputs and logs to
bench/out/peers/MODEL/ (peers' output models are deleted after counting unless
--keep-outputs; rewrite's are kept for bench/opdiff.py and inspection).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import subprocess
import sys
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
OUT = BENCH / "out"
WORK = OUT / "peers"
RESULTS = OUT / "peers.json"
REWRITE_TOOLS = ("rewrite", "rewrite-reassoc")
CLI_TOOLS = REWRITE_TOOLS + ("onnxsim-cli",)
IN_MEMORY = ("rewrite-mem", "onnxsim")  # the pair compared call against call
PEERS = ("onnxslim", "onnxsim", "onnxoptimizer", "onnxscript", "ort-basic")
TOOLS = REWRITE_TOOLS + ("rewrite-mem",) + PEERS + ("onnxsim-cli",)
TOOL_HELP = {
    "rewrite": "rewrite optimize IN OUT --report R.json (CLI, exact rules, its output check)",
    "rewrite-reassoc": "the same with --allow reassoc",
    "rewrite-mem": "frontends.onnx.optimize_model(model, rules) on the loaded model (in memory, "
    "no output check; rules loaded before the clock starts)",
    "onnxslim": "onnxslim.slim(model)",
    "onnxsim": "onnxsim.simplify(model) (defaults, check_n=0)",
    "onnxsim-cli": "onnxsim IN OUT (CLI, its default output check)",
    "onnxoptimizer": "onnxoptimizer.optimize(model) (default fuse and elimination passes)",
    "onnxscript": "onnxscript.optimizer.optimize(model) (constant folding + default rewriter)",
    "ort-basic": "onnxruntime offline optimizer, ORT_ENABLE_BASIC (standard ONNX ops only)",
}


def _peak_rss_mb() -> float:
    """Peak resident memory of this process in MiB (VmHWM; exec resets it)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def op_counts(graph) -> dict:
    """Op type -> number of nodes, subgraphs (If/Loop/Scan bodies) included."""
    counts: dict = {}
    stack = [graph]
    while stack:
        g = stack.pop()
        for n in g.node:
            key = n.op_type if n.domain in ("", "ai.onnx") else f"{n.domain}.{n.op_type}"
            counts[key] = counts.get(key, 0) + 1
            for a in n.attribute:
                if a.type == a.GRAPH:
                    stack.append(a.g)
                elif a.type == a.GRAPHS:
                    stack.extend(a.graphs)
    return dict(sorted(counts.items()))


def compute_nodes(counts: dict) -> int:
    """Nodes that are not Constant."""
    return sum(v for k, v in counts.items() if k != "Constant")


# ------------------------------------------------------------------ one tool, in a worker


def _run_peer(tool: str, src: str, dst: str) -> dict:
    """Load, optimize in memory (timed: `seconds`), save (single file; external data above
    2 GB). Returns seconds, and for rewrite-mem its per-stage seconds."""
    import onnx

    res: dict = {}
    if tool == "rewrite-mem":
        from dsl import load_rules, shipped_rules_dir
        from frontends.onnx import optimize_model

        t = time.perf_counter()
        rules = load_rules([shipped_rules_dir()])
        res["rules_seconds"] = time.perf_counter() - t
    elif tool == "onnxsim":
        import onnxsim  # imported outside the clock, as rewrite-mem's modules are
    model = onnx.load(src)
    start = time.perf_counter()
    if tool == "rewrite-mem":
        out, report = optimize_model(model, rules)
        res["stages"] = dict(report.seconds)
    elif tool == "onnxsim":
        import onnxsim

        out, ok = onnxsim.simplify(model)
        if not ok:
            raise RuntimeError("onnxsim: simplified model failed its check")
    elif tool == "onnxslim":
        import onnxslim

        out = onnxslim.slim(model)
    elif tool == "onnxoptimizer":
        import onnxoptimizer

        out = onnxoptimizer.optimize(model)
    elif tool == "onnxscript":
        import onnxscript.optimizer

        out = onnxscript.optimizer.optimize(model)
    elif tool == "ort-basic":
        import onnxruntime as ort

        opts = ort.SessionOptions()
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
        opts.optimized_model_filepath = dst
        del model
        start = time.perf_counter()
        ort.InferenceSession(src, opts, providers=["CPUExecutionProvider"])
        res["seconds"] = time.perf_counter() - start
        return res
    else:
        raise ValueError(f"unknown tool {tool}")
    res["seconds"] = time.perf_counter() - start
    res["ops"] = op_counts(out.graph)  # counted here: saving would add its own peak
    if os.environ.get("PEERS_KEEP_OUTPUTS"):
        big = out.ByteSize() > 2**31 - 2**20
        onnx.save_model(out, dst, save_as_external_data=big)
    return res


def _rewrite_cli() -> list[str]:
    exe = Path(sys.executable).with_name("rewrite")
    return (
        [str(exe)]
        if exe.exists()
        else [sys.executable, "-c", "import sys; from rewrite.cli import main; sys.exit(main())"]
    )


def worker(tool: str, src: str, dst: str) -> dict:
    """Run one tool on one model in this (fresh) process; return seconds, peak MiB, op counts.

    rewrite runs as its own CLI process (spawned from this small one), measured with wait4."""
    start = time.perf_counter()
    res: dict = {"tool": tool}
    if tool in CLI_TOOLS:
        report = str(Path(dst).with_suffix(".report.json"))
        if tool == "onnxsim-cli":
            cmd = [str(Path(sys.executable).with_name("onnxsim")), src, dst]
        else:
            cmd = _rewrite_cli() + ["optimize", src, dst, "--report", report]
        if tool == "rewrite-reassoc":
            cmd += ["--allow", "reassoc"]
        with open(Path(dst).with_suffix(".log"), "w") as log:
            p = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
            _, status, usage = os.wait4(p.pid, 0)
            p.returncode = os.waitstatus_to_exitcode(status)
        res["seconds"] = time.perf_counter() - start
        res["peak_mb"] = usage.ru_maxrss / 1024
        res["cmd"] = " ".join(cmd)
        if p.returncode != 0:
            lines = [
                ln for ln in Path(dst).with_suffix(".log").read_text().splitlines() if ln.strip()
            ]
            raise SystemExit(f"exit {p.returncode}: " + (lines[-1].strip()[:300] if lines else ""))
        if Path(report).exists():
            r = json.loads(Path(report).read_text())
            res["report"] = {
                k: r.get(k)
                for k in ("stop_reason", "iterations", "enodes", "seconds", "changed", "fp")
            }
    else:
        res.update(_run_peer(tool, src, dst))
        res["wall"] = time.perf_counter() - start
        res["peak_mb"] = _peak_rss_mb()
    import onnx

    if "ops" not in res:
        res["ops"] = op_counts(onnx.load(dst, load_external_data=False).graph)
    return res


def run_tool(tool: str, src: Path, dst: Path, timeout: float) -> dict:
    """One tool on one model in a subprocess (its own session, killed with its children on
    timeout). Returns ok, reason, seconds, peak_mb, compute_nodes, ops."""
    dst.unlink(missing_ok=True)
    cmd = [sys.executable, __file__, "--worker", tool, str(src), str(dst)]
    start = time.perf_counter()
    p = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        p.communicate()
        return {
            "ok": False,
            "reason": f"timeout after {timeout:.0f} s",
            "seconds": time.perf_counter() - start,
        }
    wall = time.perf_counter() - start
    if p.returncode != 0:
        lines = [ln for ln in err.splitlines() if ln.strip()]
        reason = lines[-1].strip()[:300] if lines else f"exit {p.returncode}"
        if p.returncode < 0:
            reason = f"killed by signal {-p.returncode} ({reason})"
        Path(str(dst) + ".stderr").write_text(err[-20000:])
        return {"ok": False, "reason": reason, "seconds": wall}
    res = json.loads(out.strip().splitlines()[-1])
    res.update(ok=True, reason=None, compute_nodes=compute_nodes(res["ops"]), job_wall=wall)
    return res


# ------------------------------------------------------------------ latency and second shape


def _allclose(ref, got) -> tuple[float, bool]:
    import numpy as np

    if ref.shape != got.shape:
        return float("inf"), False
    if ref.dtype.kind not in "fc":
        return float(np.abs(ref.astype(np.float64) - got).max(initial=0)), bool((ref == got).all())
    scale = max(1.0, float(np.abs(ref).max(initial=0)))
    diff = np.abs(ref.astype(np.float64) - got)
    ok = bool((diff <= 1e-4 * scale + 1e-4 * np.abs(ref)).all()) and bool(
        np.isfinite(got).all() == np.isfinite(ref).all()
    )
    return float(diff.max(initial=0)), ok


def latency_worker(name: str, orig: str, opt: str, runs: int, dynamic: bool) -> dict:
    """Median seconds per run of both models at both ORT levels (1 thread, alternating), and
    the second-shape comparison."""
    import statistics

    import onnxruntime as ort

    sys.path.insert(0, str(BENCH))
    import models

    feeds = models.make_inputs(name)
    levels = {
        "disable_all": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
        "enable_all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
    }
    sessions = {}
    for lname, level in levels.items():
        for which, path in (("orig", orig), ("opt", opt)):
            so = ort.SessionOptions()
            so.intra_op_num_threads = 1
            so.inter_op_num_threads = 1
            so.graph_optimization_level = level
            sessions[(which, lname)] = ort.InferenceSession(
                path, so, providers=["CPUExecutionProvider"]
            )
    for s in sessions.values():
        s.run(None, feeds)
    times: dict = {k: [] for k in sessions}
    for _ in range(runs):
        for k, s in sessions.items():
            t = time.perf_counter()
            s.run(None, feeds)
            times[k].append(time.perf_counter() - t)
    res: dict = {"runs": runs, "median_ms": {}, "ratio": {}}
    for lname in levels:
        o, r = (statistics.median(times[(w, lname)]) for w in ("orig", "opt"))
        res["median_ms"][lname] = {"orig": o * 1e3, "opt": r * 1e3}
        res["ratio"][lname] = r / o
    if dynamic:
        batch, seq = models.second_shape(name)
        feeds2 = models.make_inputs(name, batch, seq, seed=7)
        a = sessions[("orig", "disable_all")].run(None, feeds2)
        b = sessions[("opt", "disable_all")].run(None, feeds2)
        diffs = [_allclose(x, y) for x, y in zip(a, b)]
        res["second_shape"] = {
            "shape": f"batch {batch}"
            + (
                ""
                if name in models.SPECS and models.SPECS[name].kind == "image"
                else f", seq {seq}"
            ),
            "max_abs_diff": max(d for d, _ in diffs) if diffs else 0.0,
            "allclose": all(ok for _, ok in diffs) and len(a) == len(b),
        }
    else:
        res["second_shape"] = None
    return res


def run_latency(name: str, orig: Path, opt: Path, runs: int, dynamic: bool, timeout: float) -> dict:
    cmd = [
        sys.executable,
        __file__,
        "--latency-worker",
        name,
        str(orig),
        str(opt),
        str(runs),
        "1" if dynamic else "0",
    ]
    p = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        p.communicate()
        return {"ok": False, "reason": f"timeout after {timeout:.0f} s"}
    if p.returncode != 0:
        lines = [ln for ln in err.splitlines() if ln.strip()]
        return {"ok": False, "reason": lines[-1][:300] if lines else f"exit {p.returncode}"}
    return {"ok": True, **json.loads(out.strip().splitlines()[-1])}


# ------------------------------------------------------------------ driver and tables


def _fmt(x, spec=".2f"):
    return "-" if x is None else format(x, spec)


def _best_peer(tools: dict) -> tuple[str | None, int | None]:
    ok = {t: r["compute_nodes"] for t, r in tools.items() if t in PEERS and r.get("ok")}
    if not ok:
        return None, None
    t = min(ok, key=ok.get)
    return t, ok[t]


def _mark(ok: bool | None) -> str:
    return "" if ok is None else (" [green]✓" if ok else " [red]✗")


def model_table(label: str, r: dict):
    """Rich table of one model: a row per tool, then the ratios."""
    from rich.table import Table

    t = Table(
        title=f"{label}: {r['compute_before']} compute nodes before, {r['mb']:.0f} MB "
        f"({'dynamic' if r['dynamic'] else 'static'} shapes)",
        title_justify="left",
    )
    for c in ("tool", "compute nodes", "seconds", "peak MB", "peak / file", "status"):
        t.add_column(c, justify="left" if c in ("tool", "status") else "right", overflow="fold")
    for tool, x in r["tools"].items():
        if x.get("ok"):
            stop = (x.get("report") or {}).get("stop_reason")
            t.add_row(
                tool,
                str(x["compute_nodes"]),
                _fmt(x["seconds"]),
                _fmt(x["peak_mb"], ".0f"),
                _fmt(x["peak_mb"] / r["mb"] if r["mb"] else None, ".1f") + "x",
                "ok" + (f" ({stop})" if stop else ""),
            )
        else:
            t.add_row(tool, "-", _fmt(x.get("seconds")), "-", "-", f"[red]FAILED: {x['reason']}")
    return t


def model_ratios(r: dict) -> list[str]:
    """One line per target: rewrite nodes / best peer, seconds / onnxsim, memory, latency."""
    lines = []
    best, best_n = _best_peer(r["tools"])
    for tool in (*REWRITE_TOOLS, "rewrite-mem"):
        x = r["tools"].get(tool)
        if not x or not x.get("ok"):
            continue
        ref = "onnxsim" if tool == "rewrite-mem" else "onnxsim-cli"
        sim = r["tools"].get(ref, {})
        parts = [f"{tool}:"]
        if best_n:
            q = x["compute_nodes"] / best_n
            parts.append(f"nodes / best peer ({best}, {best_n}) = {q:.3f}{_mark(q <= 1)}")
        if sim.get("ok"):
            q = x["seconds"] / sim["seconds"]
            parts.append(f"seconds / {ref} = {q:.3f}{_mark(q <= 1)}")
        q = x["peak_mb"] / r["mb"] if r["mb"] else None
        parts.append(f"peak MB / file MB = {_fmt(q, '.1f')}{_mark(q <= 3 if q else None)}")
        lines.append("  ".join(parts))
    lat = r.get("latency")
    if lat:
        if lat.get("ok"):
            m = lat["median_ms"]
            lines.append(
                f"onnxruntime latency of {lat['tool']} / original (1 thread, median of "
                f"{lat['runs']}): ORT_DISABLE_ALL {lat['ratio']['disable_all']:.3f} "
                f"({m['disable_all']['opt']:.1f} / {m['disable_all']['orig']:.1f} ms), "
                f"ORT_ENABLE_ALL {lat['ratio']['enable_all']:.3f} "
                f"({m['enable_all']['opt']:.1f} / {m['enable_all']['orig']:.1f} ms)"
            )
            s = lat.get("second_shape")
            lines.append(
                "second shape: static model, not checked"
                if s is None
                else f"second shape ({s['shape']}): max |diff| {s['max_abs_diff']:.3g}, "
                f"allclose {s['allclose']}{_mark(s['allclose'])}"
            )
        else:
            lines.append(f"latency / second shape: FAILED: {lat['reason']}")
    return lines


SPEED_COLUMNS = (
    "model",
    "file MB",
    "nodes rewrite / onnxsim",
    "in-memory s rewrite / onnxsim",
    "ratio",
    "CLI s rewrite / onnxsim",
    "ratio",
    "peak MB in-memory rewrite / onnxsim",
    "peak MB CLI rewrite / onnxsim",
    "worst peak / file",
)


def speed_rows(results: dict) -> list[list[str]]:
    """Rows of SPEED_COLUMNS: rewrite against onnxsim, in memory (the optimize call alone)
    and CLI end to end (process start to exit, default output checks), and peak RSS."""
    rows = []

    def get(r, tool, key):
        x = r["tools"].get(tool) or {}
        return x.get(key) if x.get("ok") else None

    def pair(a, b, spec):
        return f"{_fmt(a, spec)} / {_fmt(b, spec)}"

    def ratio(a, b):
        return "-" if a is None or b is None or not b else f"{a / b:.2f}"

    for label, r in results.items():
        if "tools" not in r:
            continue
        mem, sim = get(r, "rewrite-mem", "seconds"), get(r, "onnxsim", "seconds")
        cli, simcli = get(r, "rewrite", "seconds"), get(r, "onnxsim-cli", "seconds")
        peaks = [get(r, t, "peak_mb") for t in ("rewrite-mem", "rewrite")]
        worst = max((x for x in peaks if x is not None), default=None)
        rows.append(
            [
                label,
                f"{r['mb']:.0f}",
                pair(
                    get(r, "rewrite-mem", "compute_nodes"), get(r, "onnxsim", "compute_nodes"), "d"
                ),
                pair(mem, sim, ".2f"),
                ratio(mem, sim),
                pair(cli, simcli, ".2f"),
                ratio(cli, simcli),
                pair(peaks[0], get(r, "onnxsim", "peak_mb"), ".0f"),
                pair(peaks[1], get(r, "onnxsim-cli", "peak_mb"), ".0f"),
                "-" if worst is None or not r["mb"] else f"{worst / r['mb']:.1f}",
            ]
        )
    return rows


def stage_rows(results: dict) -> list[list[str]]:
    """Per model, rewrite-mem's stage seconds (the Report's), largest first, and their sum
    against the timed call."""
    rows = []
    for label, r in results.items():
        x = (r.get("tools") or {}).get("rewrite-mem") or {}
        if not x.get("ok") or not x.get("stages"):
            continue
        st = sorted(x["stages"].items(), key=lambda kv: -kv[1])
        rows.append(
            [
                label,
                f"{x['seconds']:.2f}",
                f"{sum(v for _, v in st):.2f}",
                ", ".join(f"{k} {v:.2f}" for k, v in st if v >= 0.05),
            ]
        )
    return rows


def markdown(results: dict, meta: dict) -> str:
    """The speed and stage tables as markdown, stamped with the commit and the command."""

    def table(cols, rows):
        lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
        lines += ["| " + " | ".join(row) + " |" for row in rows]
        return "\n".join(lines)

    return (
        "\n\n".join(
            [
                f"Commit `{meta.get('git')}`, `{meta.get('command')}`, {meta.get('machine')}; "
                f"versions: " + ", ".join(f"{k} {v}" for k, v in meta.get("versions", {}).items()),
                table(SPEED_COLUMNS, speed_rows(results)),
                "rewrite-mem stages (the Report's seconds):",
                table(
                    ("model", "call s", "sum of stages s", "stages >= 0.05 s"), stage_rows(results)
                ),
            ]
        )
        + "\n"
    )


def summary_tables(results: dict, tools: list[str]):
    """Across models: compute nodes, seconds and peak MB per tool, and the targets."""
    from rich.table import Table

    out = []
    for what, key, spec in (
        ("compute nodes after", "compute_nodes", "d"),
        ("end-to-end seconds", "seconds", ".1f"),
        ("peak MB", "peak_mb", ".0f"),
    ):
        t = Table(title=f"{what} per tool (FAIL = crash, T/O = timeout)", title_justify="left")
        t.add_column("model")
        if key == "compute_nodes":
            t.add_column("before", justify="right")
        elif key == "peak_mb":
            t.add_column("file MB", justify="right")
        for tool in tools:
            t.add_column(tool, justify="right")
        for label, r in results.items():
            row = [label]
            if key == "compute_nodes":
                row.append(str(r["compute_before"]))
            elif key == "peak_mb":
                row.append(f"{r['mb']:.0f}")
            for tool in tools:
                x = r["tools"].get(tool)
                if x is None:
                    row.append("")
                elif x.get("ok"):
                    row.append(format(x[key], spec))
                elif key == "seconds" and x.get("seconds") is not None:
                    row.append(
                        ("T/O " if "timeout" in x["reason"] else "FAIL ")
                        + format(x["seconds"], ".0f")
                    )
                else:
                    row.append("[red]T/O" if "timeout" in x["reason"] else "[red]FAIL")
            t.add_row(*row)
        out.append(t)
    t = Table(
        title="targets: nodes <= best peer, seconds <= onnxsim, peak <= 3x file, "
        "same outputs at a second shape, 50k stack < 30 s",
        title_justify="left",
    )
    for c in (
        "model",
        "best peer",
        "rewrite / best",
        "reassoc / best",
        "rewrite CLI s / onnxsim CLI s",
        "peak / file",
        "latency ratio (disable / enable)",
        "2nd shape",
    ):
        t.add_column(c, justify="left" if c in ("model", "best peer") else "right")
    for label, r in results.items():
        best, best_n = _best_peer(r["tools"])
        row = [label, f"{best} {best_n}" if best else "-"]
        for tool in REWRITE_TOOLS:
            x = r["tools"].get(tool, {})
            if x.get("ok") and best_n:
                q = x["compute_nodes"] / best_n
                row.append(f"{q:.3f}{_mark(q <= 1)}")
            else:
                row.append("[red]FAIL" if x.get("reason") else "-")
        x, sim = r["tools"].get("rewrite", {}), r["tools"].get("onnxsim-cli", {})
        if x.get("ok") and sim.get("ok"):
            q = x["seconds"] / sim["seconds"]
            extra = ""
            if label.startswith("deep-50k"):
                extra = f" ({x['seconds']:.0f} s{_mark(x['seconds'] < 30)})"
            row.append(f"{q:.3f}{_mark(q <= 1)}{extra}")
        else:
            row.append("-")
        if x.get("ok") and r["mb"]:
            q = x["peak_mb"] / r["mb"]
            row.append(f"{q:.1f}{_mark(q <= 3)}")
        else:
            row.append("-")
        lat = r.get("latency") or {}
        if lat.get("ok"):
            row.append(f"{lat['ratio']['disable_all']:.3f} / {lat['ratio']['enable_all']:.3f}")
            s = lat.get("second_shape")
            row.append("static" if s is None else f"{s['max_abs_diff']:.2g}{_mark(s['allclose'])}")
        else:
            row += ["-", "-"]
        t.add_row(*row)
    out.append(t)
    t = Table(
        title="rewrite against onnxsim: in memory (the call alone) and CLI (start to exit)",
        title_justify="left",
    )
    for c in SPEED_COLUMNS:
        t.add_column(c, justify="left" if c == "model" else "right")
    for row in speed_rows(results):
        t.add_row(*row)
    out.append(t)
    t = Table(title="rewrite-mem: where the call's seconds go", title_justify="left")
    for c in ("model", "call s", "sum of stages s", "stages >= 0.05 s"):
        t.add_column(c, justify="left" if c in ("model", "stages >= 0.05 s") else "right")
    for row in stage_rows(results):
        t.add_row(*row)
    out.append(t)
    return out


def _versions() -> dict:
    from importlib.metadata import PackageNotFoundError, version

    v = {}
    for pkg in (
        "onnx",
        "onnxruntime",
        "onnxsim",
        "onnxslim",
        "onnxoptimizer",
        "onnxscript",
        "torch",
        "transformers",
        "egglog",
    ):
        try:
            v[pkg] = version(pkg)
        except PackageNotFoundError:
            v[pkg] = None
    return v


def _git_state() -> str:
    """HEAD commit, plus "+dirty" when rewrite's sources differ from it (measured as is)."""

    def git(*a):
        return subprocess.run(
            ["git", *a], cwd=BENCH.parent, capture_output=True, text=True
        ).stdout.strip()

    head = git("rev-parse", "--short", "HEAD")
    dirty = git(
        "status",
        "--porcelain",
        "--untracked-files=no",
        "--",
        "rewrite",
        "dsl",
        "frontends",
        "patterns",
    )
    return head + ("+dirty" if dirty else "")


def main(argv=None) -> None:
    sys.path.insert(0, str(BENCH))
    import models as M

    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--models",
        nargs="+",
        default=M.all_models(),
        metavar="NAME",
        help=f"default: all of {' '.join(M.all_models())}",
    )
    ap.add_argument(
        "--tools",
        nargs="+",
        default=list(TOOLS),
        choices=TOOLS,
        metavar="TOOL",
        help="; ".join(f"{k}: {v}" for k, v in TOOL_HELP.items()),
    )
    ap.add_argument("--exporters", nargs="+", default=list(M.EXPORTERS), choices=M.EXPORTERS)
    ap.add_argument(
        "--timeout",
        type=float,
        default=600,
        help="seconds before a tool's job is killed (default 600)",
    )
    ap.add_argument("--runs", type=int, default=15, help="latency runs per session (default 15)")
    ap.add_argument("--no-latency", action="store_true", help="skip latency and the second shape")
    ap.add_argument("--keep-outputs", action="store_true", help="keep the peers' output models")
    ap.add_argument(
        "--show",
        action="store_true",
        help="only print the tables of the models in bench/out/peers.json",
    )
    ap.add_argument(
        "--markdown",
        metavar="PATH",
        help="also write the speed and stage tables of the models shown as markdown to PATH",
    )
    ap.add_argument("--worker", nargs=3, help=argparse.SUPPRESS)
    ap.add_argument("--latency-worker", nargs=5, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.keep_outputs:
        os.environ["PEERS_KEEP_OUTPUTS"] = "1"  # read by the workers
    if args.worker:
        print(json.dumps(worker(*args.worker)))
        return
    if args.latency_worker:
        name, orig, opt, runs, dyn = args.latency_worker
        print(json.dumps(latency_worker(name, orig, opt, int(runs), dyn == "1")))
        return
    unknown = set(args.models) - set(M.all_models())
    if unknown:
        ap.error(f"unknown models {sorted(unknown)}; known: {M.all_models()}")

    import onnx
    from rich.console import Console

    console = Console(width=200)
    results = json.loads(RESULTS.read_text()).get("models", {}) if RESULTS.exists() else {}
    if args.show:
        shown = {
            k: r
            for k, r in results.items()
            if r.get("model") in args.models
            and "tools" in r
            and r.get("exporter") in (*args.exporters, "make_deep")
        }
        for label, r in shown.items():
            console.print(model_table(label, r))
            for line in model_ratios(r):
                console.print("  " + line)
        tools = [t for t in TOOLS if any(t in r["tools"] for r in shown.values())]
        for t in summary_tables(shown, tools):
            console.print(t)
        if args.markdown:
            meta = json.loads(RESULTS.read_text()).get("run", {})
            Path(args.markdown).write_text(markdown(shown, meta))
        return
    run_meta = {
        "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        "timeout": args.timeout,
        "runs": args.runs,
        "versions": _versions(),
        "command": " ".join(["python", "bench/peers.py", *sys.argv[1:]]),
        "git": _git_state(),
    }
    order = []
    for name, exporter, path, err in M.ensure(args.models, args.exporters):
        label = name if exporter is None else f"{name}.{exporter}"
        if path is None:
            console.print(f"[red]{label}: could not be generated: {err}")
            results[label] = {"model": name, "exporter": exporter, "generation_failed": err}
            continue
        meta = M.meta_of(name, exporter) or {}
        before = op_counts(onnx.load(str(path), load_external_data=False).graph)
        r = {
            "model": name,
            "exporter": exporter or "make_deep",
            "file": str(path.relative_to(BENCH.parent)),
            "mb": path.stat().st_size / 2**20,
            "dynamic": bool(meta.get("dynamic")),
            "ops_before": before,
            "compute_before": compute_nodes(before),
            "tools": {},
        }
        prev = results.get(label, {}).get("tools", {})
        r["tools"] = {t: v for t, v in prev.items() if t not in args.tools}  # keep other tools
        work = WORK / label
        work.mkdir(parents=True, exist_ok=True)
        for tool in args.tools:
            dst = work / f"{tool}.onnx"
            console.print(f"{label}: {tool} ...", end=" ")
            x = run_tool(tool, path, dst, args.timeout)
            r["tools"][tool] = x
            console.print(
                f"{x['compute_nodes']} nodes, {x['seconds']:.1f} s, {x['peak_mb']:.0f} MB"
                if x["ok"]
                else f"[red]FAILED ({x['seconds']:.0f} s): {x['reason']}"
            )
            if tool not in REWRITE_TOOLS and not args.keep_outputs:
                dst.unlink(missing_ok=True)
        r["tools"] = {t: r["tools"][t] for t in TOOLS if t in r["tools"]}
        opt_tool = next(
            (
                t
                for t in REWRITE_TOOLS
                if r["tools"].get(t, {}).get("ok") and (work / f"{t}.onnx").exists()
            ),
            None,
        )
        if opt_tool and not args.no_latency:
            console.print(f"{label}: latency and second shape of {opt_tool} ...")
            lat = run_latency(
                name, path, work / f"{opt_tool}.onnx", args.runs, r["dynamic"], args.timeout
            )
            r["latency"] = {"tool": opt_tool, **lat}
        elif not args.no_latency:
            r["latency"] = None
        elif "latency" in results.get(label, {}):
            r["latency"] = results[label]["latency"]
        results[label] = r
        order.append(label)
        console.print(model_table(label, r))
        for line in model_ratios(r):
            console.print("  " + line)
        OUT.mkdir(exist_ok=True)
        RESULTS.write_text(json.dumps({"run": run_meta, "models": results}, indent=1))
    shown = {k: v for k, v in results.items() if k in order}
    tools = [t for t in TOOLS if any(t in r["tools"] for r in shown.values())]
    for t in summary_tables(shown, tools):
        console.print(t)
    if args.markdown:
        Path(args.markdown).write_text(markdown(shown, run_meta))
    failed = {
        k: v["generation_failed"]
        for k, v in results.items()
        if "generation_failed" in v and v["model"] in args.models
    }
    for k, why in failed.items():
        console.print(f"not generated: {k}: {why}")
    console.print(vocabulary_line())
    console.print(f"results: {RESULTS.relative_to(BENCH.parent)}")


def vocabulary_line() -> str:
    """`vocabulary: matchable / registry ops` per domain (`vocab.ops.vocabulary`)."""
    from vocab.ops import vocabulary

    per: dict[str, list[int]] = {}
    for e in vocabulary():
        counts = per.setdefault(e.spec.domain or "ai.onnx", [0, 0])
        counts[0] += not e.reason
        counts[1] += 1
    parts = [f"{d} {m}/{n}" for d, (m, n) in sorted(per.items())]
    return "vocabulary (matchable / ops in the registries): " + ", ".join(parts)


if __name__ == "__main__":
    main()
