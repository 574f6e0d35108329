"""Benchmark: the torch.fx path next to the ONNX path, and torch.compile with and without it.

    python bench/fx_bench.py              # all models, both tables
    python bench/fx_bench.py --no-compile # skip the (slow) torch.compile timings

Models are the tiny transformers architectures of `examples/make_models.py` (random weights,
nothing downloaded). Table 1: per model and dialect, fx nodes before/after and the seconds of
import + optimize + export (`optimize_fx`, check off), beside the ONNX path's seconds for the
same model (`optimize_model` on the exported ONNX, onnx.checker included, output check off).
Table 2: seconds of the first call of `torch.compile(model, backend=...)` (capture + compile +
run) for "inductor" and for "rewrite" (rewrite, then inductor), each in a fresh process with
inductor's caches disabled, so both are cold compiles. Rules: exact + reassoc, as the backend.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "examples"))
FP = ("exact", "reassoc")


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
    cfg = BertConfig(vocab_size=100, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                     intermediate_size=128, max_position_embeddings=64,
                     attn_implementation="eager")
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
    cfg = GPT2Config(vocab_size=100, n_embd=64, n_layer=2, n_head=4, n_positions=64,
                     bos_token_id=0, eos_token_id=0, use_cache=False,
                     attn_implementation="eager")
    model = _randomize(GPT2Model(cfg))
    wrapped = _Wrapper(model, ["input_ids", "attention_mask"], ["last_hidden_state"],
                       use_cache=False).eval()
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


# ---- measurements ------------------------------------------------------------------------------


def measure_fx(name: str, dialect: str) -> dict:
    from frontends.fx import optimize_fx, shipped_rules

    shipped_rules()
    graph, example, _, _ = graph_of(name, dialect)
    start = time.perf_counter()
    _, report = optimize_fx(graph, example, fp=FP, check=False, freeze=dialect == "dynamo")
    return {"seconds": time.perf_counter() - start, "before": report.nodes_before,
            "after": report.nodes_after, "stages": report.seconds}


def measure_onnx(name: str) -> dict:
    import make_models

    from frontends.fx import shipped_rules
    from frontends.onnx import optimize_model

    model = getattr(make_models, name)(None)
    rules = shipped_rules()
    start = time.perf_counter()
    _, report = optimize_model(model, rules, fp=FP)
    return {"seconds": time.perf_counter() - start, "before": report.nodes_before,
            "after": report.nodes_after}


def measure_compile(name: str, backend: str) -> dict:
    import torch

    import frontends.fx  # noqa: F401  (registers the "rewrite" backend)

    model, inputs = MODELS[name]()
    with torch.no_grad():
        start = time.perf_counter()
        torch.compile(model, backend=backend)(*inputs)
        first = time.perf_counter() - start
    return {"seconds": first}


def _child(args: list[str]) -> dict:
    env = {**os.environ, "TORCHINDUCTOR_FORCE_DISABLE_CACHES": "1"}
    res = subprocess.run([sys.executable, __file__, "--one", *args], capture_output=True,
                         text=True, env=env)
    if res.returncode:
        return {"error": res.stderr.strip().splitlines()[-1]}
    return json.loads(res.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--no-compile", action="store_true", help="skip the torch.compile table")
    ap.add_argument("--one", nargs="+", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        kind, *rest = args.one
        fn = {"fx": measure_fx, "onnx": measure_onnx, "compile": measure_compile}[kind]
        print(json.dumps(fn(*rest)))
        return
    from rich.console import Console
    from rich.table import Table

    t = Table(title="fx path vs ONNX path: shipped rules (exact + reassoc), seconds")
    for c in ("model", "dialect", "fx nodes", "fx after", "fx s", "onnx nodes", "onnx after",
              "onnx s", "fx/onnx"):
        t.add_column(c, justify="left" if c in ("model", "dialect") else "right")
    for name, dialects in [("resnet", ("symbolic_trace", "export", "dynamo")),
                           ("bert", ("export", "dynamo")), ("gpt2", ("export", "dynamo"))]:
        onnx_r = _child(["onnx", name])
        for d in dialects:
            r = _child(["fx", name, d])
            if "error" in r or "error" in onnx_r:
                t.add_row(name, d, r.get("error", onnx_r.get("error", ""))[:60])
                continue
            t.add_row(name, d, str(r["before"]), str(r["after"]), f"{r['seconds']:.2f}",
                      str(onnx_r["before"]), str(onnx_r["after"]), f"{onnx_r['seconds']:.2f}",
                      f"{r['seconds'] / onnx_r['seconds']:.2f}")
    console = Console(width=140)
    console.print(t)
    if args.no_compile:
        return
    c = Table(title="torch.compile, first call (cold: caches off), seconds")
    for col in ("model", "inductor", "rewrite + inductor", "ratio"):
        c.add_column(col, justify="left" if col == "model" else "right")
    for name in ("resnet", "bert"):
        a, b = _child(["compile", name, "inductor"]), _child(["compile", name, "rewrite"])
        if "error" in a or "error" in b:
            c.add_row(name, a.get("error", "")[:40], b.get("error", "")[:40], "")
            continue
        c.add_row(name, f"{a['seconds']:.2f}", f"{b['seconds']:.2f}",
                  f"{b['seconds'] / a['seconds']:.2f}")
    console.print(c)


if __name__ == "__main__":
    main()
