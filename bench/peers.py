"""Result quality against the peers, measured in the same run: node counts and seconds.

    pip install -e ".[bench]" && python bench/peers.py

For each real model (both torch exporters) and a deep synthetic graph, optimize with
`rewrite` (exact rules only, then exact + reassoc), onnxsim, onnxslim, onnxoptimizer (its
default passes) and onnxruntime's offline optimizer (ORT_ENABLE_BASIC, the level that keeps
standard ONNX ops), then print nodes after each, the time each took, and rewrite's node count
relative to the best peer (< 1.0 means fewer nodes than every peer). A peer that is not
installed or fails on a model shows "-".
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

import onnx

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "examples"), str(ROOT / "bench")]


def _rewrite(fp):
    def run(model):
        from dsl import load_rules, shipped_rules_dir
        from frontends.onnx import optimize_model

        return optimize_model(model, load_rules([shipped_rules_dir()]), fp=fp)[0]

    return run


def _onnxsim(model):
    import onnxsim

    out, ok = onnxsim.simplify(model)
    return out if ok else None


def _onnxslim(model):
    import onnxslim

    return onnxslim.slim(model)


def _onnxoptimizer(model):
    import onnxoptimizer

    return onnxoptimizer.optimize(model)


def _ort_basic(model):
    import onnxruntime as ort

    with tempfile.TemporaryDirectory() as tmp:
        opts = ort.SessionOptions()
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
        opts.optimized_model_filepath = str(Path(tmp) / "ort.onnx")
        ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
        return onnx.load(opts.optimized_model_filepath)


TOOLS = {
    "rewrite": _rewrite(("exact",)),
    "rewrite+reassoc": _rewrite(("exact", "reassoc")),
    "onnxsim": _onnxsim,
    "onnxslim": _onnxslim,
    "onnxoptimizer": _onnxoptimizer,
    "ort-basic": _ort_basic,
}


def _models():
    import make_models
    from make_deep import deep_model

    for exporter in ("dynamo", "torchscript"):
        for name in ("bert", "gpt2", "resnet", "vit"):
            yield f"{name}/{exporter}", getattr(make_models, name)(None, exporter=exporter)
    yield "deep-10000", deep_model(10000)


def main() -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="nodes after optimization (seconds), all tools in this run")
    table.add_column("model")
    table.add_column("before", justify="right")
    for tool in TOOLS:
        table.add_column(tool, justify="right")
    table.add_column("rewrite+reassoc / best peer", justify="right")
    for name, model in _models():
        cells, counts = [], {}
        for tool, fn in TOOLS.items():
            start = time.perf_counter()
            try:
                out = fn(onnx.ModelProto.FromString(model.SerializeToString()))
            except Exception:  # a peer that crashes on a model is reported, not fatal
                out = None
            secs = time.perf_counter() - start
            if out is None:
                cells.append("-")
                continue
            counts[tool] = len(out.graph.node)
            cells.append(f"{counts[tool]} ({secs:.2f})")
        peers = [n for t, n in counts.items() if not t.startswith("rewrite")]
        ratio = f"{counts['rewrite+reassoc'] / min(peers):.2f}" if peers and "rewrite+reassoc" in counts else "-"
        table.add_row(name, str(len(model.graph.node)), *cells, ratio)
    Console(width=180).print(table)


if __name__ == "__main__":
    main()
