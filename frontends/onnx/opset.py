"""Opset conversion before optimizing: `onnx.version_converter` up (or down) to a target opset.

The op table (`vocab.ops`) knows the operators in their forms of opset 13 and later; a node
of an older opset is imported as an opaque node, so no rule matches it (a BatchNormalization-9
with its removed `spatial` attribute, a Reshape-1 with a `shape` attribute, a Pad-2 with a
`pads` attribute are not the ops the rules are written for). Two ways to let the rules see them:

* normalize old nodes at import into the table's forms and write rewritten nodes back in the
  model's old forms: that needs, per op and per opset, the conditions under which the two forms
  mean the same thing and a writer for every old form (Unsqueeze's axes attribute before 13,
  Gemm's required C before 11, Softmax's 2-D coercion before 13, ...), i.e. the op table's
  per-version semantics, which it does not have yet;
* convert the whole model with `onnx.version_converter`, whose adapters are the ONNX project's
  own statement of what each version change means, and optimize the converted model, whose
  nodes are then in forms the table knows. The output is at the new opset.

The second is what this module does, and it is sound where it matters: the output check
compares the optimized model with the original, unconverted one, so an adapter that changed a
value would fail the check like a wrong rule would, and nothing would be written.
"""

from __future__ import annotations

import warnings

import onnx
from onnx import TensorProto, helper, version_converter

from frontends.onnx.importer import default_opset, is_weight, skeleton
from vocab.graph import unique_name
from vocab.ops import MAX_IR_VERSION, MAX_OPSET

# Models older than OLDEST_TABLE_OPSET (the op table's oldest forms) are converted to
# UPGRADE_OPSET when no opset is asked for: the first opset at which every op of the table
# that ONNX had at 13 is in the form the table declares (the Reduce ops' axes input is 18's).
OLDEST_TABLE_OPSET = 13
UPGRADE_OPSET = 18


class OpsetError(ValueError):
    """The model cannot be converted to the asked opset (bad target, or no adapter)."""


def convert_opset(model: onnx.ModelProto, target: int) -> onnx.ModelProto:
    """A copy of `model` converted to default-domain opset `target` by
    `onnx.version_converter.convert_version`, its IR version raised to the lowest one that
    allows `target` (at most `MAX_IR_VERSION`). A model already at `target` comes back as it
    is (the same object). Raises OpsetError with a one-line reason: a target outside
    1..MAX_OPSET, a model without a default-domain opset, or no adapter for one of its ops.
    """
    if not 1 <= target <= MAX_OPSET:
        raise OpsetError(f"opset {target} is outside 1..{MAX_OPSET} (what onnxruntime runs)")
    source = default_opset(model)
    if source == target:
        return model
    if source == 0:
        raise OpsetError("the model imports no ai.onnx opset to convert")
    try:
        out = _convert_skeleton(model, target)
    except Exception:  # an adapter that reads a weight's values: convert the whole model
        try:
            out = _convert(model, target)
        except Exception as e:  # the C++ converter raises RuntimeError/ConvertError
            text = str(e).strip().splitlines()
            raise OpsetError(
                f"onnx.version_converter cannot convert opset {source} to {target}: "
                f"{text[0] if text else type(e).__name__}"
            ) from None
    need = helper.find_min_ir_version_for(list(out.opset_import), ignore_unknown=True)
    out.ir_version = min(max(out.ir_version, need), MAX_IR_VERSION)
    if source < 7 <= target:
        _channel_slopes(out, target)
    return out


def _channel_slopes(model: onnx.ModelProto, target: int) -> None:
    """PRelu's slope of one value per channel, as opsets 1-6 read it ("shared across
    channels" when of size 1: a slope [C] is per channel, axis 1), given the shape [C, 1, ...]
    for opset 7's unidirectional broadcasting, which would align [C] with the last axis; the
    converter's adapter keeps [C] (onnxruntime then refuses the model: "broadcast an axis by
    a dimension other than 1. 3 by 5", and onnx.reference reads it leniently, so the check
    passed). An initializer slope gets a reshaped copy (a graph input of the old name keeps
    its declared shape); a computed one (a Constant node's) an Unsqueeze before the PRelu.
    Only where the input's rank is known (shape inference) and is at least 3."""
    g = model.graph
    prelus = [n for n in g.node if n.op_type == "PRelu" and n.domain in ("", "ai.onnx")]
    prelus = [n for n in prelus if len(n.input) == 2 and n.input[1]]
    if not prelus:
        return
    inferred = onnx.shape_inference.infer_shapes(skeleton(model)).graph
    ranks = {
        v.name: len(v.type.tensor_type.shape.dim)
        for v in (*inferred.input, *inferred.value_info, *inferred.output)
        if v.type.tensor_type.HasField("shape")
    }
    slopes = {t.name: t for t in g.initializer}
    taken = {t.name for t in g.initializer} | {i.name for i in g.input}
    taken |= {o for n in g.node for o in n.output}
    for n in prelus:
        slope, rank = n.input[1], ranks.get(n.input[0], 0)
        t = slopes.get(slope)
        if rank < 3:
            continue
        if t is not None and (len(t.dims) != 1 or t.dims[0] <= 1):
            continue
        if t is None and ranks.get(slope) != 1:
            continue
        name = unique_name(f"{slope}_per_channel", taken)
        if t is not None:
            channel = onnx.TensorProto()
            channel.CopyFrom(t)
            channel.name = name
            channel.dims.extend([1] * (rank - 2))
            g.initializer.append(channel)
        else:
            axes = list(range(1, rank - 1))
            if target >= 13:  # Unsqueeze-13 takes its axes as an input
                axes_name = unique_name(f"{slope}_channel_axes", taken)
                g.initializer.append(
                    helper.make_tensor(axes_name, TensorProto.INT64, [len(axes)], axes)
                )
                inputs, attrs = [slope, axes_name], {}
            else:
                inputs, attrs = [slope], {"axes": axes}
            unsqueeze = helper.make_node("Unsqueeze", inputs, [name], **attrs)
            position = list(g.node).index(n)
            g.node.insert(position, unsqueeze)
        n.input[1] = name


def _convert(model: onnx.ModelProto, target: int) -> onnx.ModelProto:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return version_converter.convert_version(model, target)


def _convert_skeleton(model: onnx.ModelProto, target: int) -> onnx.ModelProto:
    """`model` converted without passing its weights through the converter: its `skeleton`
    (large initializers as graph inputs of the same type and shape) is converted, and the
    large initializers are put back in place of those inputs. The C++ converter serializes
    and parses the whole model; on BERT-base's 440 MB that took 7 s of 7.3. The adapters
    read only small constants (axes, shapes, scales), which the skeleton keeps. Raises what
    the converter raises, and ValueError when a weight's input did not survive the
    conversion (then the whole model is converted instead)."""
    weights = [t for t in model.graph.initializer if is_weight(t)]
    if not weights:
        return _convert(model, target)
    out = _convert(skeleton(model), target)
    # the inputs the skeleton added (an old model may declare its weights as inputs too)
    added = {t.name for t in weights} - {i.name for i in model.graph.input}
    kept = [i for i in out.graph.input if i.name not in added]
    if len(out.graph.input) - len(kept) != len(added):
        raise ValueError("a weight's graph input did not survive the conversion")
    del out.graph.input[:]
    out.graph.input.extend(kept)
    small = list(out.graph.initializer)
    del out.graph.initializer[:]
    out.graph.initializer.extend(weights)
    out.graph.initializer.extend(small)
    return out


def auto_target(model: onnx.ModelProto) -> int | None:
    """The opset to convert `model` to when none is asked for: UPGRADE_OPSET for a model
    older than the op table's forms, MAX_OPSET for one newer than them (the onnx package
    writes opset 28 by default, and ops such as Cast, QuantizeLinear and Range changed at 27
    and 28), None (keep it) otherwise."""
    source = default_opset(model)
    if source > MAX_OPSET:
        return MAX_OPSET
    return UPGRADE_OPSET if 0 < source < OLDEST_TABLE_OPSET else None
