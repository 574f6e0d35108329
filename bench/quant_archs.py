"""`rewrite quantize` over architectures the other benches do not have: does every mode run?

    python bench/quant_archs.py                                  # all, TorchScript, every mode
    python bench/quant_archs.py --models albert convnext --modes static static-gptq
    python bench/quant_archs.py --exporters torchscript dynamo
    python bench/quant_archs.py --models wav2vec2 gpt2-lm --modes static --measure --onnxruntime

bench/quant.py measures latency and error on seven full-size models; this runs `rewrite
quantize` (the CLI, as a user does, its output check on) in each mode over twelve more
transformers architectures (ConvNeXt, RegNet, MobileViT, Wav2Vec2, RoBERTa, ALBERT, DeBERTa-v2,
BART, OPT, Qwen2, SegFormer, and GPT-2 with its language-model head) and reports per run what
came of it: `ok`, `refused` (a one-line `error:` and a non-zero exit: the output check's
measured error, an option that does not apply), `crashed` (an engine error the CLI reports in
one line, `optimization failed: ...`, or anything else: a traceback, a signal) or `timed out`
(`--timeout`). Crashes and time-outs are the bugs this looks for; refusals by the
output check at its 10% say how hard the model is to quantize. `--measure` also times each
written file against the float model and compares their outputs on held-out samples;
`--onnxruntime` adds onnxruntime's own quantizer of each mode's kind, on the same calibration
file.

Models have transformers' default widths, random weights with randomized biases and norm
scales (bench/models.py's `randomize_biases_and_norms`) and BatchNorm statistics calibrated on
random batches; the text models' and the large ones' layers are cut (`LAYERS`) to keep a run
short, which keeps every op and shape of a layer. They are exported once into
bench/.models/archs/ (TorchScript at opset 17; dynamo with static shapes) with a calibration
file of 8 samples of batch 1 (`NAME.cal.npz`: images and audio N(0, 1), token ids in
[3, 1000), masks of ones) that every mode reads. Each file has a `.spec.json` beside it (the
config, exporter, sizes and library versions it was made from); a file whose spec differs
from this script's is made again.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))
import models as M  # noqa: E402  (bench/models.py, beside this file)
import quant as Q  # noqa: E402  (bench/quant.py: onnxruntime's quantizers, sessions, latency)

from rewrite.cli import INTERNAL_ERROR  # noqa: E402

CACHE = M.CACHE / "archs"
SAMPLES = 8
TEXT_TOKENS = 32
IMAGE = {"default": 224, "MobileViTModel": 256, "SegformerModel": 256}
AUDIO_SAMPLES = 16000
# name -> (transformers model class, config overrides, input kind)
ARCHS = {
    "convnext": ("ConvNextModel", {"depths": [1, 1, 2, 1]}, "image"),
    "regnet": ("RegNetModel", {}, "image"),
    "mobilevit": ("MobileViTModel", {}, "image"),
    "wav2vec2": ("Wav2Vec2Model", {"num_hidden_layers": 2}, "audio"),
    "roberta": ("RobertaModel", {"num_hidden_layers": 2}, "text"),
    "albert": ("AlbertModel", {}, "text"),  # 12 layers sharing one layer's weights
    "deberta": ("DebertaV2Model", {"num_hidden_layers": 2}, "text"),
    "bart": ("BartModel", {"encoder_layers": 2, "decoder_layers": 2}, "seq2seq"),
    "opt": ("OPTModel", {"num_hidden_layers": 2}, "text"),
    "qwen2": (
        "Qwen2Model",
        {
            "num_hidden_layers": 2,
            "hidden_size": 512,
            "intermediate_size": 1408,
            "num_attention_heads": 8,
            "num_key_value_heads": 2,
            "vocab_size": 32000,
        },
        "text",
    ),
    "segformer": ("SegformerModel", {}, "image"),
    # a language model's head: the logits' MatMul by the tied embedding writes the graph output
    "gpt2-lm": ("GPT2LMHeadModel", {"n_layer": 2}, "text"),
}
CONFIGS = {"GPT2LMHeadModel": "GPT2Config"}  # else the class name with Config for Model
CAL = "CAL"  # stands for --calibration FILE in MODES
MODES = {
    "dynamic": (),
    "dynamic-gptq": ("--rounding", "gptq", CAL),
    "weight-only": ("--mode", "weight-only"),
    "weight-only-gptq": ("--mode", "weight-only", "--rounding", "gptq", CAL),
    "static": ("--mode", "static", CAL),
    "static-onnxruntime": ("--mode", "static", "--target", "onnxruntime", CAL),
    "static-gptq": ("--mode", "static", "--rounding", "gptq", CAL),
}


def samples(name: str, n: int, seed: int) -> dict[str, np.ndarray]:
    """`n` samples of batch 1 for architecture `name`: {input: array [n, 1, ...]}."""
    cls, _, kind = ARCHS[name]
    rng = np.random.default_rng(seed)
    if kind == "image":
        side = IMAGE.get(cls, IMAGE["default"])
        return {"pixel_values": rng.standard_normal((n, 1, 3, side, side)).astype(np.float32)}
    if kind == "audio":
        return {"input_values": rng.standard_normal((n, 1, AUDIO_SAMPLES)).astype(np.float32)}
    ids = rng.integers(3, 1000, (n, 1, TEXT_TOKENS)).astype(np.int64)
    if kind == "seq2seq":
        dec = rng.integers(3, 1000, (n, 1, TEXT_TOKENS // 4)).astype(np.int64)
        return {"input_ids": ids, "decoder_input_ids": dec}
    return {"input_ids": ids, "attention_mask": np.ones_like(ids)}


def build(name: str):
    """The model (eval mode, trained-like values) and its input names."""
    import torch
    import transformers

    cls, overrides, _ = ARCHS[name]
    torch.manual_seed(M.SEED)
    config = getattr(transformers, CONFIGS.get(cls, cls.replace("Model", "Config")))(**overrides)
    if hasattr(config, "use_cache"):
        config.use_cache = False
    model = getattr(transformers, cls)(config).eval()
    M.randomize_biases_and_norms(model)
    norms = [m for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    feeds = samples(name, 4, 100)
    with torch.no_grad():
        if norms:  # BatchNorm statistics of the model's own activations, a cumulative average
            for m in norms:
                m.reset_running_stats()
                m.momentum = None
                m.train()
            for i in range(4):
                model(**{k: torch.from_numpy(v[i]) for k, v in feeds.items()})
        model.eval()
    return model, list(feeds)


def export(name: str, exporter: str) -> Path | str:
    """bench/.models/archs/NAME.EXPORTER.onnx (made when missing), or why it could not be."""
    import onnx
    import torch

    path = CACHE / f"{name}.{exporter}.onnx"
    spec = export_spec(name, exporter)
    if _cached(path, spec):
        return path
    model, names = build(name)

    class Wrapped(torch.nn.Module):  # named inputs in, the first output (a tensor) out
        def __init__(self):
            super().__init__()
            self.m = model

        def forward(self, *args):
            out = self.m(**dict(zip(names, args)))
            return out.last_hidden_state if hasattr(out, "last_hidden_state") else out[0]

    args = tuple(torch.from_numpy(v[0]) for v in samples(name, 1, 0).values())
    try:  # the exporters' progress lines to stderr: stdout is the table
        with warnings.catch_warnings(), torch.no_grad(), contextlib.redirect_stdout(sys.stderr):
            warnings.simplefilter("ignore")
            if exporter == "torchscript":
                buf = io.BytesIO()
                axes = {n: {0: "batch"} for n in [*names, "out"]}
                torch.onnx.export(
                    Wrapped().eval(),
                    args,
                    buf,
                    dynamo=False,
                    opset_version=M.TORCHSCRIPT_OPSET,
                    input_names=names,
                    output_names=["out"],
                    dynamic_axes=axes,
                )
                proto = onnx.load_model_from_string(buf.getvalue())
            else:
                proto = torch.onnx.export(
                    Wrapped().eval(), args, dynamo=True, external_data=False,
                    input_names=names, output_names=["out"],
                ).model_proto  # fmt: skip
    except Exception as e:  # an exporter's failure, not ours: reported, not raised
        return f"export failed: {str(e).strip().splitlines()[0][:120]}"
    proto.ir_version = min(proto.ir_version, M.MAX_IR_VERSION)
    CACHE.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".partial")  # a full disk leaves no half-written model behind
    onnx.save(proto, partial)
    partial.replace(path)
    _remember(path, spec)
    return path


def export_spec(name: str, exporter: str) -> dict:
    """What an export of `name` is made from: the architecture's class, its config overrides,
    the exporter and opset, the inputs' sizes and the library versions. A cached file made
    from another spec is made again (`_cached`)."""
    import torch
    import transformers

    cls, overrides, kind = ARCHS[name]
    return {
        "class": cls,
        "overrides": overrides,
        "kind": kind,
        "exporter": exporter,
        "opset": M.TORCHSCRIPT_OPSET,
        "seed": M.SEED,
        "sizes": [TEXT_TOKENS, IMAGE.get(cls, IMAGE["default"]), AUDIO_SAMPLES],
        "torch": torch.__version__,
        "transformers": transformers.__version__,
    }


def calibration_spec(name: str) -> dict:
    """What NAME.cal.npz is made from: `SAMPLES` samples of seed 1000 of the input kind and
    sizes of `name`."""
    cls, _, kind = ARCHS[name]
    return {
        "samples": SAMPLES,
        "seed": 1000,
        "kind": kind,
        "sizes": [TEXT_TOKENS, IMAGE.get(cls, IMAGE["default"]), AUDIO_SAMPLES],
    }


def _spec_path(path: Path) -> Path:
    return path.with_name(path.name + ".spec.json")


def _cached(path: Path, spec: dict) -> bool:
    """True if `path` exists and was made from `spec` (its `.spec.json` beside it says so)."""
    meta = _spec_path(path)
    return path.exists() and meta.exists() and json.loads(meta.read_text()) == spec


def _remember(path: Path, spec: dict) -> None:
    _spec_path(path).write_text(json.dumps(spec, indent=1))


def calibration(name: str) -> Path:
    """bench/.models/archs/NAME.cal.npz: `SAMPLES` samples, seeds apart from the build's."""
    path = CACHE / f"{name}.cal.npz"
    spec = calibration_spec(name)
    if not _cached(path, spec):
        CACHE.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(".partial.npz")
        np.savez(partial, **samples(name, spec["samples"], spec["seed"]))
        partial.replace(path)
        _remember(path, spec)
    return path


def run(src: Path, out: Path, mode: str, cal: Path, timeout: float) -> tuple[str, str, float]:
    """(outcome, its first line, seconds) of `rewrite quantize SRC OUT` in `mode`; a run still
    going after `timeout` seconds is stopped, `timed out`."""
    args = [a for m in MODES[mode] for a in (["--calibration", str(cal)] if m == CAL else [m])]
    start = time.perf_counter()
    try:
        done = subprocess.run(
            ["rewrite", "quantize", str(src), str(out), "-q", *args],
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired:
        return "timed out", f"stopped after {timeout:g} s", time.perf_counter() - start
    seconds = time.perf_counter() - start
    lines = [  # a refusal may come with warnings and notes before its one error line
        ln for ln in done.stderr.strip().splitlines() if not ln.startswith(("warning:", "note:"))
    ]
    if done.returncode == 0:
        return "ok", "", seconds
    if len(lines) == 1 and lines[0].startswith("error:"):
        message = lines[0][len("error: ") :]
        if message.startswith(INTERNAL_ERROR):  # an engine bug, said in one line: a crash
            return "crashed", message[:110], seconds
        return "refused", message[:110], seconds
    return "crashed", (lines[-1] if lines else f"exit {done.returncode}")[:110], seconds


# onnxruntime's quantizer beside each of our modes (`--onnxruntime`): the one a user of
# that mode would otherwise run, with the same calibration file where it takes one
ORT_QUANTIZERS = {
    "dynamic": ("quantize_dynamic", lambda src, dst, cal: Q.quantize_ort(src, dst)),
    "weight-only": (
        "MatMulNBitsQuantizer",
        lambda src, dst, cal: Q.quantize_ort_weight_only(src, dst),
    ),
    "static": ("quantize_static", Q.quantize_ort_static),
}
MEASURED = 8  # held-out samples (seed 2000) that `--measure` compares outputs on
LATENCY_RUNS = 10


def measure(name: str, src: Path, out: Path) -> dict:
    """Latency of OUT against SRC (the median of paired ratios on one sample, 1 thread, both
    at ORT_ENABLE_ALL: `quant.paired_ratio`) and the error of its outputs over `MEASURED`
    held-out samples: per sample the worst output's max|q - ref| / max|ref| (`quant.
    worst_output`), their mean and worst."""
    ref, q = Q.session(src), Q.session(out)
    feeds = samples(name, MEASURED, 2000)
    per = []
    for i in range(MEASURED):
        one = {k: v[i] for k, v in feeds.items()}
        per.append(Q.worst_output(ref.run(None, one), q.run(None, one)))
    first = {k: v[0] for k, v in feeds.items()}
    ratio = Q.paired_ratio(ref, q, first, LATENCY_RUNS)
    return {"latency": ratio, "mean": float(np.mean(per)), "worst": float(np.max(per))}


def _row(name, exporter, mode, outcome, message, seconds, m: dict, args) -> str:
    """A table row; with `--measure`, `m` (`measure`'s, empty for a run that wrote nothing)."""
    cells = [name, exporter, mode, outcome, message, f"{seconds:.1f}"]
    if args.measure:
        got = [f"{m['latency']:.3f}x", f"{m['mean']:.1%}", f"{m['worst']:.1%}"] if m else []
        cells += got or ["-"] * 3
    return "| " + " | ".join(cells) + " |"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", nargs="+", default=list(ARCHS), choices=list(ARCHS))
    ap.add_argument("--modes", nargs="+", default=list(MODES), choices=list(MODES))
    ap.add_argument("--exporters", nargs="+", default=["torchscript"], choices=list(M.EXPORTERS))
    ap.add_argument(
        "--timeout",
        type=float,
        default=1800.0,
        help="seconds one `rewrite quantize` run may take before it is stopped and reported "
        "`timed out` (default 1800: ALBERT's GPTQ runs take 60-120 s)",
    )
    ap.add_argument(
        "--measure",
        action="store_true",
        help=f"also measure each written file: latency against the float model (1 thread) and "
        f"output error on {MEASURED} held-out samples",
    )
    ap.add_argument(
        "--onnxruntime",
        action="store_true",
        help="also run onnxruntime's quantizer of each mode's kind (quantize_dynamic, "
        "MatMulNBitsQuantizer, quantize_static with the same calibration file); with --measure",
    )
    args = ap.parse_args(argv)
    head = "| model | exporter | mode | outcome | message | seconds |"
    if args.measure:
        head += " latency / float | mean error | worst error |"
    print(head)
    print("|" + "---|" * (head.count("|") - 1))
    crashed = timed_out = 0
    for name in args.models:
        for exporter in args.exporters:
            src = export(name, exporter)
            if not isinstance(src, Path):
                print(f"| {name} | {exporter} | - | not exported | {src} | - |", flush=True)
                continue
            kinds = dict.fromkeys(
                next(k for k in ORT_QUANTIZERS if m.startswith(k)) for m in args.modes
            )
            for mode in args.modes:
                with tempfile.TemporaryDirectory() as folder:  # ALBERT's files are 200-800 MB
                    out = Path(folder) / "quantized.onnx"
                    outcome, message, seconds = run(src, out, mode, calibration(name), args.timeout)
                    m = measure(name, src, out) if args.measure and outcome == "ok" else {}
                crashed += outcome == "crashed"
                timed_out += outcome == "timed out"
                print(_row(name, exporter, mode, outcome, message, seconds, m, args), flush=True)
            for kind in kinds if args.onnxruntime else ():
                what, quantize = ORT_QUANTIZERS[kind]
                with tempfile.TemporaryDirectory() as folder:
                    out = Path(folder) / "quantized.onnx"
                    try:
                        seconds, outcome, message = quantize(src, out, calibration(name)), "ok", ""
                    except subprocess.CalledProcessError as e:
                        lines = (e.stderr or "").strip().splitlines() or [f"exit {e.returncode}"]
                        seconds, outcome, message = 0.0, "failed", lines[-1][:110]
                    m = measure(name, src, out) if args.measure and outcome == "ok" else {}
                mode = f"onnxruntime {what}"
                print(_row(name, exporter, mode, outcome, message, seconds, m, args), flush=True)
    print(f"\n{crashed} crashed, {timed_out} timed out")
    return 1 if crashed or timed_out else 0


if __name__ == "__main__":
    sys.exit(main())
