"""The transformers the fx frontend is measured on, at full size (bench) or mid size (tests).

    from fx_models import NAMES, build
    case = build("llama", "test")   # model, inputs, dynamic_shapes, a second input size

Seven architectures, each with transformers' default attention implementation (sdpa where the
model has one): BERT, DistilBERT, GPT-2, a Llama-style decoder (grouped-query attention, RoPE,
RMSNorm, SiLU-gated MLP), ViT, T5 (relative position bias, encoder-decoder) and Whisper
(convolutional audio stem, encoder-decoder). Weights are random (nothing is downloaded) but
trained-like: transformers' initialization for matrices, plus nonzero biases and norm scales
around 1 but not 1 (a zero bias or a unit scale would let rules fire that never fire on a real
checkpoint).

Sizes: "full" is each config class's defaults (BERT-base, DistilBERT-base, GPT-2 small, ViT-
base, t5-small, whisper-tiny), except the Llama-style decoder, whose default (7B, 27 GB of
float32) does not fit this machine: it uses `bench/models.py`'s config (hidden 1024, 8 layers,
16 query heads sharing 4 key/value heads). "test" keeps every structural feature with 2 layers
and hidden sizes of 64-128, so a test exports and optimizes it in a few seconds.

Inputs (int64 ids, float32 images/audio): text models take (input_ids, attention_mask) of
[batch, seq] with the end of the second row padded; T5 takes (input_ids, attention_mask,
decoder_input_ids); ViT takes pixel_values [batch, 3, H, W]; Whisper takes (input_features
[batch, mel, frames], decoder_input_ids). Batch is 2, as torch.export specializes size-1
dimensions. `dynamic_shapes` names batch and sequence as `torch.export.Dim`s (Whisper's frame
count and ViT's image size are fixed by the model); `second` are inputs at another batch and
sequence for checking that an exported program still runs there.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from models import randomize_biases_and_norms  # bench/models.py: the same trained-like values

SEED = 0
NAMES = ("bert", "distilbert", "gpt2", "llama", "vit", "t5", "whisper")
# benchmarked beside NAMES: a CNN, where BatchNorm folding removes work that inductor keeps
# unless its freezing is on (transformers' ResNetConfig() is ResNet-50)
CNN_NAMES = ("resnet50",)
LLAMA = dict(
    hidden_size=1024,
    intermediate_size=2816,
    num_hidden_layers=8,
    num_attention_heads=16,
    num_key_value_heads=4,
    vocab_size=32000,
    max_position_embeddings=2048,
)  # as bench/models.py
_TEST = {
    "bert": dict(
        vocab_size=512,
        hidden_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=256,
        max_position_embeddings=128,
    ),
    "distilbert": dict(
        vocab_size=512, dim=128, n_layers=2, n_heads=4, hidden_dim=256, max_position_embeddings=128
    ),
    "gpt2": dict(
        vocab_size=512,
        n_embd=128,
        n_layer=2,
        n_head=4,
        n_positions=128,
        bos_token_id=0,
        eos_token_id=0,
    ),
    "llama": dict(
        vocab_size=512,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=8,
        num_key_value_heads=2,
        max_position_embeddings=128,
    ),
    "vit": dict(
        hidden_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=256,
        image_size=32,
        patch_size=8,
    ),
    "t5": dict(
        vocab_size=512,
        d_model=128,
        d_kv=32,
        d_ff=256,
        num_layers=2,
        num_decoder_layers=2,
        num_heads=4,
    ),
    "resnet50": dict(embedding_size=16, hidden_sizes=[32, 64], depths=[1, 1]),
    "whisper": dict(
        vocab_size=512,
        d_model=128,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=256,
        decoder_ffn_dim=256,
        num_mel_bins=16,
        max_source_positions=32,
        max_target_positions=64,
        pad_token_id=0,
        bos_token_id=0,
        eos_token_id=0,
        decoder_start_token_id=1,
        begin_suppress_tokens=None,
        suppress_tokens=None,
    ),
}
_FULL = {"llama": LLAMA}
_CLASSES = {
    "bert": "Bert",
    "distilbert": "DistilBert",
    "gpt2": "GPT2",
    "llama": "Llama",
    "vit": "ViT",
    "t5": "T5",
    "whisper": "Whisper",
    "resnet50": "ResNet",
}
_SEQ = {"test": (16, 11), "full": (128, 64)}  # (main, second) sequence lengths


@dataclass(frozen=True)
class Case:
    """A model ready to export. model: eval-mode module taking `inputs` positionally and
    returning a tuple of float32 tensors. dynamic_shapes: for `torch.export.export` (batch and
    sequence Dims). second: inputs at batch 3 and another sequence length."""

    name: str
    model: Any
    inputs: tuple
    dynamic_shapes: tuple
    second: tuple


def config(name: str, size: str = "test"):
    """The transformers config of `name` at `size` ("test" or "full"), use_cache off."""
    import transformers

    cls = getattr(transformers, f"{_CLASSES[name]}Config")
    kwargs = _TEST[name] if size == "test" else _FULL.get(name, {})
    extra = {"use_cache": False} if name in ("gpt2", "llama", "t5", "whisper") else {}
    return cls(**kwargs, **extra)


def build(name: str, size: str = "test") -> Case:
    """Build `name` (one of NAMES) at `size` with trained-like random weights (seeded: the
    same call gives the same weights and inputs). Raises KeyError for an unknown name."""
    import transformers

    torch.manual_seed(SEED)
    cfg = config(name, size)
    model = getattr(transformers, f"{_CLASSES[name]}Model")(cfg).eval()
    randomize_biases_and_norms(model)
    seq, seq2 = _SEQ[size]
    gen = torch.Generator().manual_seed(SEED)
    if name in CNN_NAMES:
        _calibrate_batchnorm(model, cfg, gen)
    wrapped = _Wrapper(model, _input_names(name), _output_names(name)).eval()
    inputs = _inputs(name, cfg, 2, seq, gen)
    second = _inputs(name, cfg, 3, seq2, gen)
    return Case(name, wrapped, inputs, _dynamic(name, size), second)


def _calibrate_batchnorm(model, cfg, gen) -> None:
    """BatchNorm running statistics from 2 random batches (train mode, cumulative average),
    so that they are not the (0, 1) of initialization, which keeps deep CNN outputs near 0."""
    bns = [m for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    with torch.no_grad():
        for m in bns:
            m.reset_running_stats()
            m.momentum = None
            m.train()
        for _ in range(2):
            model(torch.randn(4, cfg.num_channels, 64, 64, generator=gen))
    model.eval()


def _input_names(name: str) -> tuple[str, ...]:
    return {
        "vit": ("pixel_values",),
        "resnet50": ("pixel_values",),
        "t5": ("input_ids", "attention_mask", "decoder_input_ids"),
        "whisper": ("input_features", "decoder_input_ids"),
    }.get(name, ("input_ids", "attention_mask"))


def _output_names(name: str) -> tuple[str, ...]:
    if name in ("t5", "whisper"):
        return ("last_hidden_state", "encoder_last_hidden_state")
    if name in ("bert", "vit", "resnet50"):
        return ("last_hidden_state", "pooler_output")
    return ("last_hidden_state",)


def _inputs(name: str, cfg, batch: int, seq: int, gen) -> tuple:
    if name == "vit":
        side = cfg.image_size
        return (torch.randn(batch, 3, side, side, generator=gen),)
    if name in CNN_NAMES:
        return (torch.randn(batch, cfg.num_channels, 224, 224, generator=gen),)
    ids = torch.randint(0, cfg.vocab_size, (batch, seq), generator=gen)
    if name == "whisper":
        frames = 2 * cfg.max_source_positions  # the encoder checks this length
        return (torch.randn(batch, cfg.num_mel_bins, frames, generator=gen), ids)
    mask = torch.ones(batch, seq, dtype=torch.int64)
    mask[1, seq - seq // 4 :] = 0
    if name == "t5":
        return (ids, mask, torch.randint(0, cfg.vocab_size, (batch, seq), generator=gen))
    return (ids, mask)


def _dynamic(name: str, size: str) -> tuple:
    from torch.export import Dim

    # the longest sequence every model takes: its position table (whisper-tiny's decoder: 448)
    batch, seq = Dim("batch", min=2, max=64), Dim("seq", min=2, max=64 if size == "test" else 448)
    text = {0: batch, 1: seq}
    per_input = {
        "vit": ({0: batch},),
        "resnet50": ({0: batch},),
        "whisper": ({0: batch}, text),
        "t5": (text, text, text),
    }.get(name, (text, text))
    return (per_input,)  # the wrapper takes *inputs: one entry holding them all


class _Wrapper(torch.nn.Module):
    """Call an HF model with positional tensors; return the named outputs as a tuple."""

    def __init__(self, model, input_names, output_names):
        super().__init__()
        self.model, self.input_names, self.output_names = model, input_names, output_names

    def forward(self, *inputs):
        out = self.model(**dict(zip(self.input_names, inputs)))
        return tuple(getattr(out, n) for n in self.output_names)
