"""Full-size benchmark models: transformers default configs, random trained-like weights, ONNX.

    python bench/models.py                      # generate whatever is missing, print a table
    python bench/models.py --models bert resnet50 --exporters torchscript
    python bench/models.py --force              # regenerate (also retries recorded failures)

Each model is exported by both torch exporters, each export in its own subprocess:

* ``torchscript``: ``torch.onnx.export(dynamo=False, opset_version=17)`` with ``dynamic_axes``
  on batch and sequence (batch only for image models);
* ``dynamo``: ``torch.onnx.export(dynamo=True)`` (torch's default opset and its default
  onnxscript optimization) with ``dynamic_shapes`` on the same axes (named ``Dim``s, else
  ``Dim.DYNAMIC``), or static shapes when the dynamic export fails or does not validate
  (recorded in the model's ``.json`` as ``shapes``).

Attention is transformers' default (sdpa) and falls back to ``attn_implementation="eager"``
when an export fails. Weights are random (nothing is downloaded) but trained-like: nonzero
biases, norm scales around 1 but not 1 (residual branches ending small, as trained ResNets'
do: see RESIDUAL_BRANCH_END), BatchNorm running statistics calibrated on random batches.
Every export is validated against torch under onnxruntime at the main shape and, when dynamic,
at the second shape (batch 2, sequence halved). Files live in ``bench/.models/``
(``NAME.EXPORTER.onnx`` + ``.json``; a failure is ``NAME.EXPORTER.failed`` with one line) and
are only generated when missing. The synthetic stacks ``deep-1k``/``deep-10k``/``deep-50k``
(about 1,000, 10,000 and 50,000 nodes) come from ``bench/make_deep.py``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
import traceback
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

BENCH = Path(__file__).resolve().parent
CACHE = BENCH / ".models"
EXPORTERS = ("torchscript", "dynamo")
TORCHSCRIPT_OPSET = 17
MAX_IR_VERSION = 13  # onnxruntime 1.32 reads IR <= 13 ...
MAX_OPSET = 26  # ... and default-domain opset <= 26
SEQ = 128  # main sequence length of the text models
IMAGE = 224  # image side of the vision models
SEED = 0


@dataclass
class Spec:
    """One benchmark model: how to build it and what its inputs look like."""

    name: str
    kind: str  # "text" (input_ids, attention_mask), "seq2seq" (+ decoder_input_ids), "image"
    build: str  # transformers model class; config class is NAME with Model -> Config
    outputs: tuple[str, ...]
    config: dict = field(default_factory=dict)

    @property
    def inputs(self) -> tuple[str, ...]:
        return {
            "text": ("input_ids", "attention_mask"),
            "seq2seq": ("input_ids", "decoder_input_ids"),
            "image": ("pixel_values",),
        }[self.kind]


LLAMA = dict(
    hidden_size=1024,
    intermediate_size=2816,
    num_hidden_layers=8,
    num_attention_heads=16,
    num_key_value_heads=4,
    vocab_size=32000,
    max_position_embeddings=2048,
)

SPECS = {
    s.name: s
    for s in [
        Spec("bert", "text", "BertModel", ("last_hidden_state", "pooler_output")),
        Spec("distilbert", "text", "DistilBertModel", ("last_hidden_state",)),
        Spec("gpt2", "text", "GPT2Model", ("last_hidden_state",), {"use_cache": False}),
        Spec("vit", "image", "ViTModel", ("last_hidden_state", "pooler_output")),
        Spec("resnet50", "image", "ResNetModel", ("last_hidden_state", "pooler_output")),
        Spec("swin-t", "image", "SwinModel", ("last_hidden_state", "pooler_output")),
        Spec("mobilenetv2", "image", "MobileNetV2Model", ("last_hidden_state", "pooler_output")),
        Spec(
            "efficientnet-b0",
            "image",
            "EfficientNetModel",
            ("last_hidden_state", "pooler_output"),
            # transformers' defaults are B7's; these are B0's (Tan & Le 2019, table 1)
            {
                "width_coefficient": 1.0,
                "depth_coefficient": 1.0,
                "image_size": 224,
                "hidden_dim": 1280,
            },
        ),
        Spec(
            "t5-small",
            "seq2seq",
            "T5Model",
            ("last_hidden_state", "encoder_last_hidden_state"),
            {"use_cache": False},
        ),
        Spec("llama", "text", "LlamaModel", ("last_hidden_state",), dict(LLAMA, use_cache=False)),
    ]
}
CNNS = {"ResNetModel", "MobileNetV2Model", "EfficientNetModel"}  # no attention to choose
DEEP = {f"deep-{n // 1000}k": n for n in (1000, 10000, 50000)}


# ---------------------------------------------------------------- inputs (numpy, no torch)


def vocab_size(name: str) -> int:
    """Vocabulary size of a text model (the ids fed to it are below this)."""
    if name in DEEP:
        return 100  # make_deep.VOCAB
    cfg = _config_defaults(name)
    return cfg["vocab_size"]


def _config_defaults(name: str) -> dict:
    meta = CACHE / f"{name}.config.json"
    if meta.exists():
        return json.loads(meta.read_text())
    import transformers

    spec = SPECS[name]
    cfg = getattr(transformers, spec.build.replace("Model", "Config"))(**spec.config)
    d = {"vocab_size": getattr(cfg, "vocab_size", 0)}
    CACHE.mkdir(exist_ok=True)
    meta.write_text(json.dumps(d))
    return d


def make_inputs(name: str, batch: int = 1, seq: int = SEQ, seed: int = SEED) -> dict:
    """Random feeds for model ``name``: ids below the vocabulary, an attention mask of ones
    (with the last quarter of row 1 padded when batch > 1), images ~ N(0, 1)."""
    rng = np.random.default_rng(seed)
    if name in DEEP:
        return {"input_ids": rng.integers(0, vocab_size(name), (1, 16)).astype(np.int64)}
    spec = SPECS[name]
    if spec.kind == "image":
        return {"pixel_values": rng.standard_normal((batch, 3, IMAGE, IMAGE)).astype(np.float32)}
    ids = rng.integers(0, vocab_size(name), (batch, seq)).astype(np.int64)
    if spec.kind == "seq2seq":
        dec = rng.integers(0, vocab_size(name), (batch, seq)).astype(np.int64)
        return {"input_ids": ids, "decoder_input_ids": dec}
    mask = np.ones((batch, seq), np.int64)
    if batch > 1:
        mask[1, seq - seq // 4 :] = 0
    return {"input_ids": ids, "attention_mask": mask}


def save_inputs(path, name: str, seeds) -> Path:
    """Write `make_inputs(name, seed=s)` for each of `seeds` to the `.npz` at `path`: one
    array per graph input, the samples along the first axis (`rewrite quantize
    --calibration`'s layout). Returns the path."""
    feeds = [make_inputs(name, seed=s) for s in seeds]
    np.savez(path, **{k: np.stack([f[k] for f in feeds]) for k in feeds[0]})
    return Path(path)


def second_shape(name: str) -> tuple[int, int]:
    """(batch, sequence) of the second-shape check: batch 2, sequence halved."""
    return 2, SEQ // 2


def path_of(name: str, exporter: str | None = None) -> Path:
    """Cached ONNX file of a model (deep stacks have no exporter)."""
    return CACHE / (f"{name}.onnx" if name in DEEP else f"{name}.{exporter}.onnx")


def all_models() -> list[str]:
    return [*SPECS, *DEEP]


# ---------------------------------------------------------------- building (torch)


def _build(spec: Spec, attn: str | None):
    import torch
    import transformers

    torch.manual_seed(SEED)
    cfg_cls = getattr(transformers, spec.build.replace("Model", "Config"))
    cfg = cfg_cls(**spec.config)
    if attn is not None:
        cfg._attn_implementation = attn
    model = getattr(transformers, spec.build)(cfg).eval()
    _trained_like(model, spec)
    return model


def randomize_biases_and_norms(model) -> None:
    """Biases ~ N(0, 0.02^2) and norm scales ~ 1 + N(0, 0.1^2), seeded (SEED + 1); weight
    matrices keep transformers' initialization. Random init leaves biases at 0 and scales at
    1, which hides rewrites that drop them."""
    import torch

    gen = torch.Generator().manual_seed(SEED + 1)
    with torch.no_grad():
        for m in model.modules():
            is_norm = "norm" in type(m).__name__.lower()
            for pname, p in m.named_parameters(recurse=False):
                if is_norm and pname == "weight":
                    p.copy_(1 + 0.1 * torch.randn(p.shape, generator=gen))
                elif pname == "bias":
                    p.copy_(0.02 * torch.randn(p.shape, generator=gen))


# The last BatchNormalization of each residual branch, per block class (transformers' module
# names): its scale is RESIDUAL_SCALE times the others'. Trained residual networks end their
# branches small (zero-init-residual, Goyal et al. 2017, "Accurate, Large Minibatch SGD"), so
# the identity path dominates; with every branch at unit scale a random ResNet-50 is chaotic:
# 0.1% of input noise moved its pooled output by 21% (after: 0.02%), MobileNetV2's by 12%
# (after: 0.1%), and any 8-bit quantization then looks like a different input.
RESIDUAL_BRANCH_END = {
    "ResNetBottleNeckLayer": lambda m: m.layer[-1].normalization,
    "ResNetBasicLayer": lambda m: m.layer[-1].normalization,
    "MobileNetV2InvertedResidual": lambda m: m.reduce_1x1.normalization if m.use_residual else None,
}
RESIDUAL_SCALE = 0.2


def _trained_like(model, spec: Spec) -> None:
    """Nonzero biases, norm scales ~ 1 + N(0, 0.1^2) (a residual branch's last BatchNorm's
    times RESIDUAL_SCALE), BatchNorm stats calibrated on random batches (train mode with
    momentum=None, i.e. a cumulative average, then eval)."""
    import torch
    from torch import nn

    randomize_biases_and_norms(model)
    with torch.no_grad():
        for m in model.modules():
            end = RESIDUAL_BRANCH_END.get(type(m).__name__)
            bn = end(m) if end is not None else None
            if bn is not None:
                bn.weight.mul_(RESIDUAL_SCALE)
    with torch.no_grad():
        bns = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
        if bns:
            model.eval()
            saved = [m.momentum for m in bns]
            for m in bns:
                m.reset_running_stats()
                m.momentum = None
                m.train()
            for i in range(4):
                feeds = make_inputs(spec.name, batch=8, seed=100 + i)
                model(**{k: torch.from_numpy(v) for k, v in feeds.items()})
            for m, mom in zip(bns, saved):
                m.momentum = mom
    model.eval()


def _wrapper(model, spec: Spec):
    """A module with the spec's inputs as named positional arguments and its outputs as a
    tuple (both exporters then see plain tensors)."""
    import torch

    outputs = spec.outputs

    def pick(out):
        return tuple(getattr(out, o) for o in outputs)

    if spec.kind == "image":

        class W(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.m = model

            def forward(self, pixel_values):
                return pick(self.m(pixel_values=pixel_values))
    elif spec.kind == "seq2seq":

        class W(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.m = model

            def forward(self, input_ids, decoder_input_ids):
                return pick(self.m(input_ids=input_ids, decoder_input_ids=decoder_input_ids))
    else:

        class W(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.m = model

            def forward(self, input_ids, attention_mask):
                return pick(self.m(input_ids=input_ids, attention_mask=attention_mask))

    return W().eval()


def _axes(spec: Spec) -> tuple[dict, dict]:
    """Dynamic axes of the inputs and of the outputs (TorchScript's ``dynamic_axes``)."""
    if spec.kind == "image":
        return ({"pixel_values": {0: "batch"}}, {o: {0: "batch"} for o in spec.outputs})
    ins = {n: {0: "batch", 1: "sequence"} for n in spec.inputs}
    outs = {
        o: {0: "batch"} if o == "pooler_output" else {0: "batch", 1: "sequence"}
        for o in spec.outputs
    }
    if spec.kind == "seq2seq":
        ins["decoder_input_ids"] = {0: "batch", 1: "decoder_sequence"}
        outs["last_hidden_state"] = {0: "batch", 1: "decoder_sequence"}
    return ins, outs


def _export(spec: Spec, wrapped, exporter: str, shapes_kind: str):
    """Export to a ModelProto. ``shapes_kind``: "named" (dynamic axes batch/sequence; for
    dynamo, named ``torch.export.Dim``s shared by the inputs), "dynamic" (dynamo: an
    unnamed ``Dim.DYNAMIC`` per axis) or "static". Example inputs have batch 2 when dynamic
    (torch.export specializes dimensions of size 1), batch 1 when static."""
    dynamic = shapes_kind != "static"
    import io

    import onnx
    import torch

    feeds = make_inputs(spec.name, batch=2 if dynamic else 1)
    args = tuple(torch.from_numpy(feeds[n]) for n in spec.inputs)
    in_axes, out_axes = _axes(spec)
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        if exporter == "torchscript":
            buf = io.BytesIO()
            torch.onnx.export(
                wrapped,
                args,
                buf,
                dynamo=False,
                opset_version=TORCHSCRIPT_OPSET,
                input_names=list(spec.inputs),
                output_names=list(spec.outputs),
                dynamic_axes={**in_axes, **out_axes} if dynamic else None,
            )
            return onnx.load_model_from_string(buf.getvalue())
        shapes, dims = None, {}
        if shapes_kind == "named":
            shapes = {
                n: {a: dims.setdefault(d, torch.export.Dim(d)) for a, d in ax.items()}
                for n, ax in in_axes.items()
            }
        elif shapes_kind == "dynamic":
            shapes = {n: {a: torch.export.Dim.DYNAMIC for a in ax} for n, ax in in_axes.items()}
        prog = torch.onnx.export(
            wrapped,
            args,
            dynamo=True,
            external_data=False,
            input_names=list(spec.inputs),
            output_names=list(spec.outputs),
            dynamic_shapes=shapes,
        )
        return prog.model_proto


def _torch_out(wrapped, spec: Spec, feeds: dict) -> list[np.ndarray]:
    import torch

    with torch.no_grad():
        out = wrapped(*(torch.from_numpy(feeds[n]) for n in spec.inputs))
    return [o.numpy() for o in out]


def _validate(proto, spec: Spec, wrapped, dynamic: bool) -> dict:
    """Run the ONNX model under onnxruntime against torch; raise if they disagree. Returns the
    max abs difference per shape and the output scale (max |y|)."""
    import onnxruntime as ort

    sess = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    shapes = [(1, SEQ)] + ([second_shape(spec.name)] if dynamic else [])
    res = {}
    for batch, seq in shapes:
        feeds = make_inputs(spec.name, batch, seq)
        got = sess.run(None, feeds)
        want = _torch_out(wrapped, spec, feeds)
        for o, g, w in zip(spec.outputs, got, want):
            scale = float(np.abs(w).max())
            diff = float(np.abs(g - w).max())
            if g.shape != w.shape or not diff <= 1e-3 * max(1.0, scale):
                raise RuntimeError(
                    f"{o} at batch {batch} seq {seq}: shape {g.shape} vs "
                    f"{w.shape}, max |diff| {diff:.3g} (scale {scale:.3g})"
                )
            if not float(np.std(w)) > 1e-3 * max(1.0, scale) and w.size > 1:
                raise RuntimeError(f"{o} is degenerate (std {np.std(w):.3g})")
            where = f"batch {batch}" if spec.kind == "image" else f"{batch}x{seq}"
            res[f"{o}@{where}"] = {"max_abs_diff": diff, "scale": scale, "std": float(np.std(w))}
    return res


def _fix_versions(proto) -> list[str]:
    notes = []
    if proto.ir_version > MAX_IR_VERSION:
        notes.append(f"ir_version {proto.ir_version} -> {MAX_IR_VERSION}")
        proto.ir_version = MAX_IR_VERSION
    for op in proto.opset_import:
        if op.domain in ("", "ai.onnx") and op.version > MAX_OPSET:
            raise RuntimeError(f"default opset {op.version} > {MAX_OPSET}")
    return notes


def _strip_stack_traces(proto) -> None:
    """Drop dynamo's per-node Python stack traces (machine-specific paths, bulk)."""
    for node in proto.graph.node:
        keep = [p for p in node.metadata_props if p.key != "pkg.torch.onnx.stack_trace"]
        del node.metadata_props[:]
        node.metadata_props.extend(keep)


def generate_one(name: str, exporter: str) -> dict:
    """Build, export, validate and save one (model, exporter); returns the metadata written
    next to it. Tries sdpa then eager attention, and (dynamo) dynamic then static shapes."""
    import onnx

    spec = SPECS[name]
    errors = []
    for attn in (None, "eager"):
        model = _build(spec, attn)
        wrapped = _wrapper(model, spec)
        kinds = ("named", "dynamic", "static") if exporter == "dynamo" else ("named",)
        for kind in kinds:
            dynamic = kind != "static"
            start = time.perf_counter()
            try:
                proto = _export(spec, wrapped, exporter, kind)
                secs = time.perf_counter() - start
                _strip_stack_traces(proto)
                notes = _fix_versions(proto)
                check = _validate(proto, spec, wrapped, dynamic)
            except Exception as e:  # record and try the next variant
                first = (str(e).strip().splitlines() or [type(e).__name__])[0][:300]
                errors.append(
                    f"attn={attn or 'default'} shapes={kind}: {type(e).__name__}: {first}"
                )
                print(errors[-1], file=sys.stderr)
                continue
            out = path_of(name, exporter)
            onnx.save_model(proto, str(out), save_as_external_data=False)
            used = getattr(model.config, "_attn_implementation", None)
            meta = {
                "model": name,
                "exporter": exporter,
                "attention": "-" if spec.build in CNNS else (used or attn or "default"),
                "dynamic": dynamic,
                "shapes": kind,
                "export_seconds": round(secs, 2),
                "ir_version": proto.ir_version,
                "opset": max(o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")),
                "nodes": len(proto.graph.node),
                "compute_nodes": sum(n.op_type != "Constant" for n in proto.graph.node),
                "mb": round(out.stat().st_size / 2**20, 1),
                "params": sum(p.numel() for p in model.parameters()),
                "validation": check,
                "notes": notes + errors,
            }
            out.with_suffix(".json").write_text(json.dumps(meta, indent=1))
            return meta
    raise RuntimeError(" | ".join(errors))


def generate_deep(name: str) -> dict:
    import onnx

    sys.path.insert(0, str(BENCH))
    from make_deep import deep_model

    model = deep_model(DEEP[name])
    out = path_of(name)
    onnx.save_model(model, str(out), save_as_external_data=False)
    meta = {
        "model": name,
        "exporter": "make_deep",
        "dynamic": False,
        "nodes": len(model.graph.node),
        "compute_nodes": sum(n.op_type != "Constant" for n in model.graph.node),
        "mb": round(out.stat().st_size / 2**20, 1),
        "ir_version": model.ir_version,
        "opset": model.opset_import[0].version,
    }
    out.with_suffix(".json").write_text(json.dumps(meta, indent=1))
    return meta


# ---------------------------------------------------------------- driver


def failure_of(name: str, exporter: str) -> str | None:
    """The recorded one-line failure of an export, if any."""
    f = CACHE / f"{name}.{exporter}.failed"
    return f.read_text().strip() if f.exists() else None


def meta_of(name: str, exporter: str | None = None) -> dict | None:
    p = path_of(name, exporter).with_suffix(".json")
    return json.loads(p.read_text()) if p.exists() else None


def ensure(
    names: list[str], exporters: list[str], force: bool = False, timeout: float = 3600
) -> list[tuple[str, str | None, Path | None, str | None]]:
    """Generate missing models, each in a subprocess. Returns (name, exporter, path or None,
    failure line or None) for every requested pair; deep stacks have exporter None."""
    CACHE.mkdir(exist_ok=True)
    res = []
    for name in names:
        for exporter in [None] if name in DEEP else exporters:
            path = path_of(name, exporter)
            failed = CACHE / f"{name}.{exporter}.failed"
            if force:
                path.unlink(missing_ok=True)
                failed.unlink(missing_ok=True)
            if not path.exists() and not failed.exists():
                label = name if exporter is None else f"{name}/{exporter}"
                print(f"generating {label} ...", file=sys.stderr, flush=True)
                cmd = [sys.executable, __file__, "--one", name, exporter or "-"]
                start = time.perf_counter()
                try:
                    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
                    err = (
                        None
                        if p.returncode == 0
                        else ((p.stderr.strip().splitlines() or [f"exit {p.returncode}"])[-1][:400])
                    )
                except subprocess.TimeoutExpired:
                    err = f"timeout after {timeout:.0f} s"
                print(
                    f"  {time.perf_counter() - start:.0f} s" + (f", FAILED: {err}" if err else ""),
                    file=sys.stderr,
                    flush=True,
                )
                if err and exporter is not None:
                    failed.write_text(err + "\n")
            res.append(
                (
                    name,
                    exporter,
                    path if path.exists() else None,
                    None if path.exists() else (failure_of(name, exporter) or "missing"),
                )
            )
    return res


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--models",
        nargs="+",
        default=all_models(),
        metavar="NAME",
        help=f"models to generate (default: all): {' '.join(all_models())}",
    )
    ap.add_argument("--exporters", nargs="+", default=list(EXPORTERS), choices=EXPORTERS)
    ap.add_argument("--force", action="store_true", help="regenerate even if cached")
    ap.add_argument("--timeout", type=float, default=3600, help="seconds per export (default 3600)")
    ap.add_argument("--one", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.one:
        name, exporter = args.one
        try:
            meta = generate_deep(name) if name in DEEP else generate_one(name, exporter)
        except Exception as e:
            traceback.print_exc()
            print(
                f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:400],
                file=sys.stderr,
            )
            sys.exit(1)
        print(json.dumps(meta))
        return
    unknown = set(args.models) - set(all_models())
    if unknown:
        ap.error(f"unknown models {sorted(unknown)}; known: {all_models()}")
    from rich.console import Console
    from rich.table import Table

    rows = ensure(args.models, args.exporters, args.force, args.timeout)
    t = Table(title=f"benchmark models in {CACHE}")
    for c in (
        "model",
        "exporter",
        "MB",
        "compute nodes",
        "opset",
        "IR",
        "shapes",
        "attention",
        "export s",
        "notes / failure",
    ):
        t.add_column(
            c,
            justify="right" if c in ("MB", "compute nodes", "opset", "IR", "export s") else "left",
            overflow="fold",
        )
    for name, exporter, path, err in rows:
        m = meta_of(name, exporter) if path else None
        if m is None:
            t.add_row(name, exporter or "-", *[""] * 7, f"[red]{err}")
            continue
        t.add_row(
            name,
            exporter or "make_deep",
            f"{m['mb']:.0f}",
            str(m["compute_nodes"]),
            str(m["opset"]),
            str(m["ir_version"]),
            {"named": "dynamic", "dynamic": "dynamic (unnamed)"}.get(m.get("shapes"), "static"),
            m.get("attention", "-"),
            str(m.get("export_seconds", "-")),
            "; ".join(m.get("notes", []))[:200],
        )
    Console(width=200).print(t)


if __name__ == "__main__":
    main()
