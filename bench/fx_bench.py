"""Benchmark: the torch.fx path on full-size transformers, and torch.compile with and without it.

    python bench/fx_bench.py                        # every model, every table (~1 hour)
    python bench/fx_bench.py --models bert gpt2     # some models
    python bench/fx_bench.py --no-latency           # node counts only
    python bench/fx_bench.py --show                 # print the stored results again
    python bench/fx_bench.py --markdown             # ... as the README's tables

Models: `bench/fx_models.py` at full size (transformers' default configs: BERT-base,
DistilBERT-base, GPT-2 small, ViT-base, t5-small, whisper-tiny, ResNet-50; the Llama-style
decoder at `bench/models.py`'s size), batch 2, sequence 128 (images 224x224), default (sdpa)
attention, random trained-like weights (BatchNorm statistics calibrated on random batches).
Every measurement runs in its own process; results go to `bench/.fx_bench.json`. Rules: exact +
reassoc, as the backend uses them.

Table 1, fx nodes (call nodes) before and after `optimize_fx` and its seconds (import +
optimize + export, output check off), for torch.export with static shapes, torch.export with
batch and sequence dynamic, and the graph torch.compile hands a backend (from the backend's
own report).

Also in table 1: first-call seconds (capture + compile + run) of `torch.compile(model)`
(inductor) and of `torch.compile(model, backend="rewrite")` (rewrite, then inductor) under
`torch.no_grad()`. Cold: each in a fresh process with inductor's caches disabled, alternating
inductor, rewrite, inductor, rewrite, ... (`--first-calls` of each, median; C++ compilation
makes single runs vary by 10-20%). Warm: a fresh process whose inductor cache directory was
filled by one earlier run of the same backend, as when a user runs a script again.

Table 2, steady-state latency under `torch.no_grad()`, per model and thread count (1 and all
cores; inductor fixes its thread count when it compiles, so each count compiles anew): the two
compiled models called alternately (AB, BA, AB, ...) after warm-up, median milliseconds of
each and the median and quartiles of the per-pair ratio rewrite / inductor; the same for eager
PyTorch against `backend="rewrite", options={"backend": "eager"}`. Every compiled model's
output is checked against eager PyTorch (|a-b| <= 1e-4 + 1e-3 max|b|).

The tiny models below (`resnet`, `bert`, `gpt2`, `graph_of`, `capture`) serve the tests.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "examples"))
sys.path.insert(0, str(ROOT / "bench"))
ALLOW = ("reassoc",)  # numeric classes beyond exact, as the backend runs them
RESULTS = ROOT / "bench" / ".fx_bench.json"


# ---- the models (also used by tests/test_fx_models.py) -----------------------------------------


def resnet():
    """Tiny ResNetModel (as make_models.resnet) in eval mode and its input [1, 3, 64, 64]."""
    import torch
    from make_models import SEED, _randomize
    from transformers import ResNetConfig, ResNetModel

    torch.manual_seed(SEED)
    cfg = ResNetConfig(embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1], layer_type="basic")
    x = torch.randn(1, 3, 64, 64, generator=torch.Generator().manual_seed(SEED))
    return _randomize(ResNetModel(cfg)), (x,)


def bert():
    """Tiny BertModel (as make_models.bert) and (input_ids, attention_mask, token_type_ids)."""
    import torch
    from make_models import SEED, _randomize, _text_inputs
    from transformers import BertConfig, BertModel

    torch.manual_seed(SEED)
    cfg = BertConfig(
        vocab_size=100,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=128,
        max_position_embeddings=64,
        attn_implementation="eager",
    )
    ids, mask = _text_inputs(cfg.vocab_size)
    types = torch.zeros_like(ids)
    types[:, 8:] = 1
    return _randomize(BertModel(cfg)), (ids, mask, types)


def gpt2():
    """Tiny GPT2Model (as make_models.gpt2), wrapped to take (input_ids, attention_mask)."""
    import torch
    from make_models import SEED, _randomize, _text_inputs, _Wrapper
    from transformers import GPT2Config, GPT2Model

    torch.manual_seed(SEED)
    cfg = GPT2Config(
        vocab_size=100,
        n_embd=64,
        n_layer=2,
        n_head=4,
        n_positions=64,
        bos_token_id=0,
        eos_token_id=0,
        use_cache=False,
        attn_implementation="eager",
    )
    model = _randomize(GPT2Model(cfg))
    wrapped = _Wrapper(
        model, ["input_ids", "attention_mask"], ["last_hidden_state"], use_cache=False
    ).eval()
    return wrapped, _text_inputs(cfg.vocab_size)


MODELS = {"resnet": resnet, "bert": bert, "gpt2": gpt2}


def traced_resnet(model):
    """symbolic_trace of a ResNetModel's layers. HF's ResNetEmbeddings checks the input's
    channel count in Python, which symbolic tracing cannot follow, so the stem is called
    layer by layer (the same modules, the same computation)."""
    import torch

    class Body(torch.nn.Module):
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, x):
            e = self.m.embedder.pooler(self.m.embedder.embedder(x))
            h = self.m.encoder(e, output_hidden_states=False, return_dict=False)[0]
            return h, self.m.pooler(h)

    return torch.fx.symbolic_trace(Body(model))


def capture(model, inputs):
    """The GraphModule and example inputs torch.compile hands a backend (captured once)."""
    import torch

    seen = []

    def grab(gm, example_inputs):
        seen.append((gm, list(example_inputs)))
        return gm.forward

    torch._dynamo.reset()
    with torch.no_grad():
        torch.compile(model, backend=grab)(*inputs)
    torch._dynamo.reset()
    return seen[0]


def graph_of(name: str, dialect: str):
    """(graph, example inputs, eager model, model inputs) for a model in one fx dialect:
    "symbolic_trace" (ResNet only), "export" (torch.export) or "dynamo" (torch.compile)."""
    import torch

    model, inputs = MODELS[name]()
    if dialect == "symbolic_trace":
        return traced_resnet(model), inputs, model, inputs
    if dialect == "export":
        return torch.export.export(model, inputs), inputs, model, inputs
    gm, example = capture(model, inputs)
    return gm, example, model, inputs


# ---- measurements (each in a child process) -----------------------------------------------------


def measure_nodes(name: str, size: str = "full") -> dict:
    """optimize_fx on the full-size model exported with static and with dynamic shapes."""
    import fx_models
    import torch

    from frontends.fx import optimize_fx, shipped_rules

    shipped_rules()
    case = fx_models.build(name, size)
    out = {}
    for kind, dyn in [("export", None), ("export-dynamic", case.dynamic_shapes)]:
        with torch.no_grad():
            ep = torch.export.export(case.model, case.inputs, dynamic_shapes=dyn)
        start = time.perf_counter()
        _, report = optimize_fx(ep, case.inputs, allow=ALLOW, check=False)
        out[kind] = {
            "before": report.nodes_before,
            "after": report.nodes_after,
            "seconds": time.perf_counter() - start,
            "skipped": report.extra.get("skipped"),
        }
    return out


def _close(a, b) -> bool:
    import torch

    a, b = torch.utils._pytree.tree_leaves(a), torch.utils._pytree.tree_leaves(b)
    return all(
        x.shape == y.shape and float((x - y).abs().max()) <= 1e-4 + 1e-3 * float(y.abs().max())
        for x, y in zip(a, b, strict=True)
    )


def _compiled(model, inputs, backend: str, options=None):
    """torch.compile(model) and its first call's seconds; the rewrite's report if any."""
    import torch

    from frontends.fx import backend as rewrite

    torch._dynamo.reset()
    rewrite.REPORTS.clear()
    fn = torch.compile(model, backend=backend, options=options)
    start = time.perf_counter()
    out = fn(*inputs)
    seconds = time.perf_counter() - start
    reports = list(rewrite.REPORTS)
    return fn, out, seconds, reports


def _paired(a, b, inputs, budget: float) -> dict:
    """Call a and b alternately (AB then BA) after warm-up, for about `budget` seconds (at
    least 16 pairs, at most 200); medians in milliseconds and the per-pair ratio b / a."""
    import statistics

    for _ in range(3):
        a(*inputs), b(*inputs)
    ta, tb = [], []
    start = time.perf_counter()
    while (len(ta) < 16 or time.perf_counter() - start < budget) and len(ta) < 200:
        for f, times in ((a, ta), (b, tb)) if len(ta) % 2 == 0 else ((b, tb), (a, ta)):
            t = time.perf_counter()
            f(*inputs)
            times.append(time.perf_counter() - t)
    ratios = sorted(y / x for x, y in zip(ta, tb))
    q = statistics.quantiles(ratios, n=4)
    return {
        "a_ms": 1e3 * statistics.median(ta),
        "b_ms": 1e3 * statistics.median(tb),
        "ratio": statistics.median(ratios),
        "q1": q[0],
        "q3": q[2],
        "pairs": len(ta),
    }


def measure_first_call(name: str, backend: str, size: str = "full") -> dict:
    """Seconds of the first call of torch.compile(model, backend) under no_grad, all threads,
    in this (fresh) process; the rewrite's own seconds and fx nodes from its report."""
    import fx_models
    import torch

    import frontends.fx  # noqa: F401  (registers the "rewrite" backend)

    case = fx_models.build(name, size)
    with torch.no_grad():
        want = case.model(*case.inputs)
        _, out, seconds, reports = _compiled(case.model, case.inputs, backend)
    res = {"seconds": seconds, "ok": _close(out, want)}
    if reports:
        res["dynamo_nodes"] = [[r.nodes_before, r.nodes_after] for r in reports]
        res["rewrite_s"] = sum(sum(r.seconds.values()) for r in reports)
    return res


def measure_latency(name: str, threads: str, budget: str = "30", size: str = "full") -> dict:
    """Paired latency at `threads` ("1" or "all") under no_grad: inductor against rewrite +
    inductor, and eager PyTorch against rewrite + eager; outputs checked against eager."""
    import fx_models
    import torch

    import frontends.fx  # noqa: F401  (registers the "rewrite" backend)

    torch.set_num_threads(1 if threads == "1" else os.cpu_count())
    case = fx_models.build(name, size)
    model, inputs = case.model, case.inputs
    res = {"threads": torch.get_num_threads()}
    with torch.no_grad():
        want = model(*inputs)
        fns = {}
        for key, backend, options in [
            ("inductor", "inductor", None),
            ("rewrite", "rewrite", None),
            ("rewrite_eager", "rewrite", {"backend": "eager"}),
        ]:
            fns[key], out, _, _ = _compiled(model, inputs, backend, options)
            res[f"{key}_ok"] = _close(out, want)
        res["latency"] = _paired(fns["inductor"], fns["rewrite"], inputs, float(budget))
        res["eager_latency"] = _paired(model, fns["rewrite_eager"], inputs, float(budget))
    return res


def _child(args: list[str], cache_dir: str | None = None) -> dict:
    """Run `--one ARGS` in a fresh process: inductor's caches disabled, or kept in `cache_dir`."""
    env = dict(os.environ)
    if cache_dir is None:
        env["TORCHINDUCTOR_FORCE_DISABLE_CACHES"] = "1"
    else:
        env.pop("TORCHINDUCTOR_FORCE_DISABLE_CACHES", None)
        env["TORCHINDUCTOR_CACHE_DIR"] = cache_dir
    res = subprocess.run(
        [sys.executable, __file__, "--one", *args], capture_output=True, text=True, env=env
    )
    if res.returncode:
        lines = res.stderr.strip().splitlines() or ["no output"]
        return {"error": lines[-1]}
    return json.loads(res.stdout.strip().splitlines()[-1])


# ---- tables --------------------------------------------------------------------------------------


def _fmt(x, spec=".2f") -> str:
    return "" if x is None else format(x, spec)


def _median(runs: list[dict], key: str):
    import statistics

    xs = [r[key] for r in runs if key in r]
    return statistics.median(xs) if xs else None


def show(results: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(width=170)
    t = Table(
        title="fx nodes before -> after (exact + reassoc); seconds of optimize_fx or of "
        "the rewrite inside torch.compile; first call of torch.compile, all threads: "
        "cold (median of fresh processes without caches) and warm (inductor's "
        "caches filled by an earlier run)"
    )
    for c in (
        "model",
        "export",
        "s",
        "export dynamic",
        "s",
        "torch.compile graph",
        "s",
        "cold inductor s",
        "cold rewrite s",
        "ratio",
        "warm inductor s",
        "warm rewrite s",
        "ratio",
    ):
        t.add_column(c, justify="left" if c == "model" else "right")
    for name, r in results.items():
        n = r.get("nodes", {})
        row = [name]
        for kind in ("export", "export-dynamic"):
            k = n.get(kind, {})
            row += [
                f"{k['before']} -> {k['after']}" if "before" in k else n.get("error", "")[:40],
                _fmt(k.get("seconds")),
            ]
        first = r.get("first_call", {})
        rw = first.get("rewrite", [])
        dyn = next((x["dynamo_nodes"] for x in rw if "dynamo_nodes" in x), None)
        row += [
            ", ".join(f"{a} -> {b}" for a, b in dyn) if dyn else "",
            _fmt(_median(rw, "rewrite_s")),
        ]
        for kind in ("", "warm_"):
            ind, rws = first.get(f"{kind}inductor", []), first.get(f"{kind}rewrite", [])
            a, b = _median(ind, "seconds"), _median(rws, "seconds")
            errors = [x["error"] for x in ind + rws if "error" in x]
            bad = any(not x.get("ok", True) for x in ind + rws)
            row += [
                _fmt(a, ".1f"),
                _fmt(b, ".1f") + (" (output mismatch)" if bad else ""),
                _fmt(b / a if a and b else None) or (errors[0][:40] if errors else ""),
            ]
        t.add_row(*row)
    console.print(t)
    c = Table(
        title="steady state under no_grad: median ms per call; ratio = rewrite / baseline, "
        "median and quartiles of alternating pairs"
    )
    for col in (
        "model",
        "threads",
        "inductor",
        "rewrite+inductor",
        "ratio [q1, q3]",
        "eager",
        "rewrite+eager",
        "ratio [q1, q3]",
        "pairs",
    ):
        c.add_column(col, justify="left" if col == "model" else "right")
    for name, r in results.items():
        for threads, m in r.get("latency", {}).items():
            if "error" in m:
                c.add_row(name, threads, m["error"][:80])
                continue
            lat, el = m["latency"], m["eager_latency"]
            ok = m["inductor_ok"] and m["rewrite_ok"] and m["rewrite_eager_ok"]
            c.add_row(
                name,
                str(m["threads"]),
                _fmt(lat["a_ms"], ".1f"),
                _fmt(lat["b_ms"], ".1f") + ("" if ok else " (output mismatch)"),
                f"{lat['ratio']:.3f} [{lat['q1']:.3f}, {lat['q3']:.3f}]",
                _fmt(el["a_ms"], ".1f"),
                _fmt(el["b_ms"], ".1f"),
                f"{el['ratio']:.3f} [{el['q1']:.3f}, {el['q3']:.3f}]",
                f"{lat['pairs']}, {el['pairs']}",
            )
    console.print(c)


def markdown(results: dict) -> str:
    """The two tables as Markdown (as in the README)."""
    lines = [
        "| model | torch.export | s | export, dynamic batch/seq | s | torch.compile graph | "
        "rewrite s | cold: inductor s | rewrite + inductor s | ratio | warm: inductor s | "
        "rewrite + inductor s | ratio |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, r in results.items():
        n, first = r.get("nodes", {}), r.get("first_call", {})
        cells = [name]
        for kind in ("export", "export-dynamic"):
            k = n.get(kind, {})
            cells += [
                f"{k['before']} -> {k['after']}" if "before" in k else "",
                _fmt(k.get("seconds"), ".1f"),
            ]
        rw = first.get("rewrite", [])
        dyn = next((x["dynamo_nodes"] for x in rw if "dynamo_nodes" in x), None)
        cells += [
            ", ".join(f"{x} -> {y}" for x, y in dyn) if dyn else "",
            _fmt(_median(rw, "rewrite_s"), ".1f"),
        ]
        for kind in ("", "warm_"):
            a = _median(first.get(f"{kind}inductor", []), "seconds")
            b = _median(first.get(f"{kind}rewrite", []), "seconds")
            cells += [_fmt(a, ".1f"), _fmt(b, ".1f"), _fmt(b / a if a and b else None)]
        lines.append("| " + " | ".join(cells) + " |")
    lines += [
        "",
        "| model | threads | inductor ms | rewrite + inductor ms | ratio [q1, q3] | "
        "eager ms | rewrite + eager ms | ratio [q1, q3] |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, r in results.items():
        for m in r.get("latency", {}).values():
            if "error" in m:
                continue
            lat, el = m["latency"], m["eager_latency"]
            lines.append(
                f"| {name} | {m['threads']} | {lat['a_ms']:.0f} | {lat['b_ms']:.0f} | "
                f"{lat['ratio']:.2f} [{lat['q1']:.2f}, {lat['q3']:.2f}] | {el['a_ms']:.0f} | "
                f"{el['b_ms']:.0f} | {el['ratio']:.2f} [{el['q1']:.2f}, {el['q3']:.2f}] |"
            )
    return "\n".join(lines)


def main() -> None:
    import fx_models

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=[*fx_models.NAMES, *fx_models.CNN_NAMES])
    ap.add_argument("--threads", nargs="+", default=["1", "all"])
    ap.add_argument("--budget", default="30", help="seconds of paired calls per comparison")
    ap.add_argument(
        "--first-calls",
        type=int,
        default=3,
        metavar="N",
        help="cold first calls of each backend, alternating (default 3; median)",
    )
    ap.add_argument("--no-latency", action="store_true", help="node counts only")
    ap.add_argument(
        "--warm-only",
        type=int,
        metavar="N",
        help="only warm-cache first calls: per backend one run fills a fresh cache directory, "
        "then N runs on it, the backends alternating (median; printed, stored as "
        "warm_inductor / warm_rewrite)",
    )
    ap.add_argument("--size", default="full", help="full, or test (a quick smoke run)")
    ap.add_argument("--show", action="store_true", help="print stored results")
    ap.add_argument("--markdown", action="store_true", help="print stored results as Markdown")
    ap.add_argument("--one", nargs="+", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        kind, *rest = args.one
        fn = {"nodes": measure_nodes, "first_call": measure_first_call, "latency": measure_latency}[
            kind
        ]
        print(json.dumps(fn(*rest)))
        return
    path = RESULTS if args.size == "full" else RESULTS.with_suffix(f".{args.size}.json")
    results = json.loads(path.read_text()) if path.exists() else {}
    if args.warm_only:
        import statistics

        for name in args.models:
            r = results.setdefault(name, {})
            first = r.setdefault("first_call", {})
            runs = {"inductor": [], "rewrite": []}
            with tempfile.TemporaryDirectory() as c1, tempfile.TemporaryDirectory() as c2:
                caches = {"inductor": c1, "rewrite": c2}
                for backend, cache in caches.items():
                    _child(["first_call", name, backend, args.size], cache)
                for _ in range(args.warm_only):
                    for backend, cache in caches.items():
                        runs[backend].append(
                            _child(["first_call", name, backend, args.size], cache)
                        )
            for backend, got in runs.items():
                first[f"warm_{backend}"] = got
            path.write_text(json.dumps(results, indent=1))
            med = {
                b: statistics.median([x["seconds"] for x in v if "seconds" in x] or [float("nan")])
                for b, v in runs.items()
            }
            print(
                f"{name}: warm first call, median of {args.warm_only}: inductor "
                f"{med['inductor']:.2f} s, rewrite {med['rewrite']:.2f} s, ratio "
                f"{med['rewrite'] / med['inductor']:.2f}",
                flush=True,
            )
        return
    if not (args.show or args.markdown):
        for name in args.models:
            r = results.setdefault(name, {})
            r["nodes"] = _child(["nodes", name, args.size])
            path.write_text(json.dumps(results, indent=1))
            if args.no_latency:
                continue
            # cold first calls, each in a fresh process, alternating: A B A B ...
            first = r["first_call"] = {
                k: [] for k in ("inductor", "rewrite", "warm_inductor", "warm_rewrite")
            }
            for _ in range(args.first_calls):
                for backend in ("inductor", "rewrite"):
                    first[backend].append(_child(["first_call", name, backend, args.size]))
                    path.write_text(json.dumps(results, indent=1))
            # warm: a second process on the cache directory the first one filled
            for backend in ("inductor", "rewrite"):
                with tempfile.TemporaryDirectory() as cache:
                    _child(["first_call", name, backend, args.size], cache)
                    first[f"warm_{backend}"].append(
                        _child(["first_call", name, backend, args.size], cache)
                    )
                path.write_text(json.dumps(results, indent=1))
            r["latency"] = {}
            for threads in args.threads:
                r["latency"][threads] = _child(["latency", name, threads, args.budget, args.size])
                path.write_text(json.dumps(results, indent=1))
    chosen = {k: v for k, v in results.items() if args.show or args.markdown or k in args.models}
    if args.markdown:
        print(markdown(chosen))
        return
    show(chosen)


if __name__ == "__main__":
    main()
