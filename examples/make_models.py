"""Export small, randomly initialised real architectures to ONNX.

The models are tiny versions of BERT, GPT-2, ResNet and ViT built from
``transformers`` configs (nothing is downloaded).  They are meant as realistic
inputs for the graph-rewriting engine: the graphs are exactly what
``torch.onnx.export`` produces, with no artificial junk added.

Export choices (see ``export_onnx``):

* ``dynamo=True`` (torch's default exporter) at opset ``OPSET`` (18, torchlib's
  native opset: GELU stays decomposed as Div/Erf/Add/Mul/Mul; at opset 20 it
  would be a single Gelu node), static shapes, IR version pinned to 10.
* Transformers use ``attn_implementation="eager"`` so attention appears as the
  classic MatMul/Mul(scale)/Add(mask)/Softmax/MatMul chain instead of SDPA's
  decomposition (extra IsNaN/Where guards).
* The dynamo exporter runs onnxscript's optimizer by default (constant folding,
  no-op removal, Transpose merging, initializer lifting/dedup, CSE, and
  BatchNorm->Conv fusion).  For ResNet we keep BatchNormalization by exporting
  with ``optimize=False`` and running only onnxscript's constant folding and
  dead-node removal.  ``--exporter torchscript`` selects the legacy exporter
  instead (more Constant/Shape/Unsqueeze/Concat shape-computation nodes).
* Weights are perturbed after init (``_randomize``): HF init sets biases to 0 and
  norm scales to 1, which would make initializers identical (the exporters then
  dedupe them, the legacy one into Identity nodes) and make BN a near no-op.
* Dynamo's per-node Python stack traces are stripped (machine-specific paths);
  output is byte-for-byte deterministic.

Usage::

    python examples/make_models.py OUTDIR [--models bert,gpt2,resnet,vit]
                                          [--exporter dynamo|torchscript]
"""

from __future__ import annotations

import argparse
import io
import logging
import os
import time
import warnings

import numpy as np
import onnx
import torch

OPSET = 18  # default-domain opset: torchlib's native one (torch defaults to 20)
IR_VERSION = 10  # onnx 1.23 writes IR 11+ by default; ORT wants <= 13
SEED = 0


class _Wrapper(torch.nn.Module):
    """Call an HF model with keyword inputs and return the named output fields.

    Needed because HF ``forward`` signatures put other arguments (e.g. GPT-2's
    ``past_key_values``) between the tensors we want to pass positionally.
    """

    def __init__(self, model, input_names, output_names, **extra):
        super().__init__()
        self.model, self.input_names, self.output_names = model, input_names, output_names
        self.extra = extra

    def forward(self, *inputs):
        out = self.model(**dict(zip(self.input_names, inputs)), **self.extra)
        return tuple(getattr(out, name) for name in self.output_names)


def _randomize(model: torch.nn.Module, seed: int = SEED) -> torch.nn.Module:
    """Perturb every float parameter/buffer so no two initializers coincide."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, t in model.state_dict().items():
            if not t.is_floating_point():
                continue
            if name.endswith("running_var"):
                t.uniform_(0.5, 1.5, generator=gen)
            else:
                t.add_(torch.randn(t.shape, generator=gen) * 0.05)
    return model.eval()


def _strip_stack_traces(proto: onnx.ModelProto) -> None:
    """Drop dynamo's per-node Python stack traces (machine-specific file paths).

    The other node metadata (namespace, class hierarchy, fx node) is kept.
    """
    for node in proto.graph.node:
        keep = [p for p in node.metadata_props if p.key != "pkg.torch.onnx.stack_trace"]
        del node.metadata_props[:]
        node.metadata_props.extend(keep)


def export_onnx(
    model,
    inputs,
    input_names,
    output_names,
    path=None,
    *,
    keep_batchnorm=False,
    exporter="dynamo",
    forward_kwargs=None,
) -> onnx.ModelProto:
    """Export ``model`` on example ``inputs`` to ONNX and pin IR/opset versions.

    ``exporter="dynamo"`` (default) uses torch.export + onnxscript's optimizer;
    with ``keep_batchnorm`` the optimizer's rewrite rules (which fuse BN into
    Conv) are skipped and only constant folding and dead-node removal run.
    ``exporter="torchscript"`` uses the legacy tracer with constant folding;
    ``keep_batchnorm`` then selects ``TrainingMode.PRESERVE`` (the model is in
    eval mode, so BN is exported in inference form but not fused into Conv).
    The result passes ``onnx.checker`` (full_check) and, if ``path`` is given,
    is saved as a single file with inline weights.
    """
    wrapper = _Wrapper(model, input_names, output_names, **(forward_kwargs or {})).eval()
    common = dict(
        input_names=input_names, output_names=output_names, opset_version=OPSET, verbose=False
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if exporter == "dynamo":
            import onnxscript.optimizer

            program = torch.onnx.export(
                wrapper,
                tuple(inputs),
                dynamo=True,
                optimize=not keep_batchnorm,
                external_data=False,
                **common,
            )
            if keep_batchnorm:
                onnxscript.optimizer.fold_constants(program.model)
                onnxscript.optimizer.remove_unused_nodes(program.model)
            proto = program.model_proto
        elif exporter == "torchscript":
            mode = torch.onnx.TrainingMode
            buf = io.BytesIO()
            torch.onnx.export(
                wrapper,
                tuple(inputs),
                buf,
                dynamo=False,
                do_constant_folding=True,
                training=mode.PRESERVE if keep_batchnorm else mode.EVAL,
                **common,
            )
            proto = onnx.load_model_from_string(buf.getvalue())
        else:
            raise ValueError(f"unknown exporter {exporter!r}")
    _strip_stack_traces(proto)
    proto.ir_version = IR_VERSION
    for opset in proto.opset_import:
        if opset.domain in ("", "ai.onnx"):
            opset.version = OPSET
    onnx.checker.check_model(proto, full_check=True)
    if path is not None:
        onnx.save_model(proto, os.fspath(path), save_as_external_data=False)
    return proto


def _text_inputs(vocab: int, batch: int = 2, seq: int = 16):
    """input_ids (int64) and an attention_mask with some padding in row 1."""
    gen = torch.Generator().manual_seed(SEED)
    ids = torch.randint(0, vocab, (batch, seq), generator=gen)
    mask = torch.ones(batch, seq, dtype=torch.int64)
    mask[1:, seq - 4 :] = 0
    return ids, mask


def bert(path=None, exporter="dynamo") -> onnx.ModelProto:
    """Tiny BertModel: hidden 64, 2 layers, 4 heads, inputs [2, 16] int64."""
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
    return export_onnx(
        _randomize(BertModel(cfg)),
        (ids, mask, types),
        ["input_ids", "attention_mask", "token_type_ids"],
        ["last_hidden_state", "pooler_output"],
        path,
        exporter=exporter,
    )


def gpt2(path=None, exporter="dynamo") -> onnx.ModelProto:
    """Tiny GPT2Model: n_embd 64, 2 layers, 4 heads, inputs [2, 16] int64."""
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
    ids, mask = _text_inputs(cfg.vocab_size)
    return export_onnx(
        _randomize(GPT2Model(cfg)),
        (ids, mask),
        ["input_ids", "attention_mask"],
        ["last_hidden_state"],
        path,
        exporter=exporter,
        forward_kwargs={"use_cache": False},
    )


def resnet(path=None, exporter="dynamo") -> onnx.ModelProto:
    """Tiny ResNetModel (basic blocks, [16, 32]), input [1, 3, 64, 64]; keeps BN."""
    from transformers import ResNetConfig, ResNetModel

    torch.manual_seed(SEED)
    cfg = ResNetConfig(embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1], layer_type="basic")
    x = torch.randn(1, 3, 64, 64, generator=torch.Generator().manual_seed(SEED))
    return export_onnx(
        _randomize(ResNetModel(cfg)),
        (x,),
        ["pixel_values"],
        ["last_hidden_state", "pooler_output"],
        path,
        keep_batchnorm=True,
        exporter=exporter,
    )


def vit(path=None, exporter="dynamo") -> onnx.ModelProto:
    """Tiny ViTModel: image 32, patch 8, hidden 32, 2 layers, input [1, 3, 32, 32]."""
    from transformers import ViTConfig, ViTModel

    torch.manual_seed(SEED)
    cfg = ViTConfig(
        image_size=32,
        patch_size=8,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        attn_implementation="eager",
    )
    x = torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(SEED))
    return export_onnx(
        _randomize(ViTModel(cfg)),
        (x,),
        ["pixel_values"],
        ["last_hidden_state", "pooler_output"],
        path,
        exporter=exporter,
    )


DYNAMIC_OPSET = 17  # the TorchScript exporter's usual target with dynamic axes


def dynamic(name: str, layers: int = 4, hidden: int = 256) -> onnx.ModelProto:
    """A mid-size model with the full structure of its architecture (``layers`` blocks, width
    ``hidden``, real attention and normalization), exported by the TorchScript exporter at
    opset ``DYNAMIC_OPSET`` with dynamic axes: batch and sequence for text models
    (``batch``, ``seq``; T5's decoder ``dseq``), batch for image models (224/4 = 64 pixels).
    ``name``: bert, gpt2, llama (GQA, RoPE, RMSNorm), t5, vit, swin, mobilenetv2.
    Weights are perturbed (``_randomize``) so outputs are not degenerate."""
    import transformers as T

    torch.manual_seed(SEED)
    heads = max(hidden // 64, 2)
    text = {"input_ids": {0: "batch", 1: "seq"}, "attention_mask": {0: "batch", 1: "seq"}}
    image = {"pixel_values": {0: "batch"}}
    ids, mask = _text_inputs(1000, batch=2, seq=16)
    pixels = torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(SEED))
    if name == "bert":
        m = T.BertModel(
            T.BertConfig(
                vocab_size=1000,
                hidden_size=hidden,
                num_hidden_layers=layers,
                num_attention_heads=heads,
                intermediate_size=4 * hidden,
                attn_implementation="eager",
            )
        )
        args, names, axes, extra = (ids, mask), ["input_ids", "attention_mask"], text, {}
    elif name == "gpt2":
        m = T.GPT2Model(
            T.GPT2Config(
                vocab_size=1000,
                n_embd=hidden,
                n_layer=layers,
                n_head=heads,
                attn_implementation="eager",
            )
        )
        args, names, axes, extra = (
            (ids, mask),
            ["input_ids", "attention_mask"],
            text,
            {"use_cache": False},
        )
    elif name == "llama":
        m = T.LlamaModel(
            T.LlamaConfig(
                vocab_size=1000,
                hidden_size=hidden,
                intermediate_size=2 * hidden,
                num_hidden_layers=layers,
                num_attention_heads=heads,
                num_key_value_heads=max(heads // 2, 1),
                attn_implementation="eager",
            )
        )
        args, names, axes, extra = (
            (ids, mask),
            ["input_ids", "attention_mask"],
            text,
            {"use_cache": False},
        )
    elif name == "t5":
        m = T.T5Model(
            T.T5Config(
                vocab_size=1000,
                d_model=hidden,
                d_kv=64,
                d_ff=4 * hidden,
                num_layers=layers,
                num_heads=heads,
            )
        )
        axes = {"input_ids": {0: "batch", 1: "seq"}, "decoder_input_ids": {0: "batch", 1: "dseq"}}
        args, names, extra = (
            (ids, ids[:, :8]),
            ["input_ids", "decoder_input_ids"],
            {"use_cache": False},
        )
    elif name == "vit":
        m = T.ViTModel(
            T.ViTConfig(
                image_size=64,
                patch_size=16,
                hidden_size=hidden,
                num_hidden_layers=layers,
                num_attention_heads=heads,
                intermediate_size=4 * hidden,
                attn_implementation="eager",
            )
        )
        args, names, axes, extra = (pixels,), ["pixel_values"], image, {}
    elif name == "swin":
        m = T.SwinModel(
            T.SwinConfig(
                image_size=64,
                patch_size=4,
                embed_dim=hidden // 8,
                depths=[2, 2],
                num_heads=[2, 4],
                window_size=4,
            )
        )
        args, names, axes, extra = (pixels,), ["pixel_values"], image, {}
    elif name == "mobilenetv2":
        m = T.MobileNetV2Model(T.MobileNetV2Config(image_size=64, depth_multiplier=0.35))
        args, names, axes, extra = (pixels,), ["pixel_values"], image, {}
    else:
        raise ValueError(f"unknown model {name!r}")
    wrapper = _Wrapper(_randomize(m), names, ["last_hidden_state"], **extra).eval()
    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            wrapper,
            args,
            buf,
            dynamo=False,
            opset_version=DYNAMIC_OPSET,
            input_names=names,
            output_names=["last_hidden_state"],
            dynamic_axes=axes,
            do_constant_folding=True,
        )
    proto = onnx.load_model_from_string(buf.getvalue())
    proto.ir_version = IR_VERSION
    onnx.checker.check_model(proto, full_check=True)
    return proto


MODELS = {"bert": bert, "gpt2": gpt2, "resnet": resnet, "vit": vit}


def random_feeds(model: onnx.ModelProto, seed: int = SEED) -> dict:
    """Random inputs for every graph input (ints in [0, 2), floats ~ N(0, 1))."""
    rng = np.random.default_rng(seed)
    feeds = {}
    for inp in model.graph.input:
        shape = [d.dim_value for d in inp.type.tensor_type.shape.dim]
        dtype = onnx.helper.tensor_dtype_to_np_dtype(inp.type.tensor_type.elem_type)
        if np.issubdtype(dtype, np.integer):
            feeds[inp.name] = rng.integers(0, 2, size=shape).astype(dtype)
        else:
            feeds[inp.name] = rng.standard_normal(shape).astype(dtype)
    return feeds


def run_ort(model: onnx.ModelProto) -> list:
    """Load ``model`` in onnxruntime (CPU) and run it once on random inputs."""
    import onnxruntime as ort

    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, random_feeds(model))


def main(argv=None) -> None:
    """CLI entry point: export the selected models into OUTDIR."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("outdir")
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--exporter", choices=["dynamo", "torchscript"], default="dynamo")
    args = parser.parse_args(argv)
    logging.getLogger("torch").setLevel(logging.ERROR)
    os.makedirs(args.outdir, exist_ok=True)
    for name in args.models.split(","):
        path = os.path.join(args.outdir, f"{name}.onnx")
        start = time.perf_counter()
        model = MODELS[name](path, exporter=args.exporter)
        seconds = time.perf_counter() - start
        run_ort(model)
        print(
            f"{name}: {len(model.graph.node)} nodes, {os.path.getsize(path) / 1024:.1f} KiB, "
            f"{seconds:.2f} s -> {path}"
        )


if __name__ == "__main__":
    main()
