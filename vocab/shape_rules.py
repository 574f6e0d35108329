"""Shape rules beside the ops: the one lookup of each op's rules.

Every op's output shapes (symbolic: `vocab.symbolic`), the values of the small integer tensors
it computes, and, for the simplest ops, its output type come from the rules registered with
the op (`vocab.shape_registry`): the elementwise ops' in `vocab.elementwise_rules`, the shape,
movement, contraction and reduction ops' in `vocab.movement_rules`, registered over the op
families of `vocab.ops.FAMILIES` or by name. The symbolic shape analysis (`engine.shapes`),
type inference (`engine.infer`) and `rewrite ops` all read them here, so an op's shape
knowledge lives in one place. An op without a rule gets its output types from ONNX shape
inference on the single node (`engine.infer`).
"""

from __future__ import annotations

from vocab import elementwise_rules, movement_rules
from vocab.graph import Node
from vocab.shape_registry import RULES, ShapeRule

# the modules whose decorators fill RULES: imported here so that every lookup sees all rules
RULE_MODULES = (elementwise_rules, movement_rules)


def rule_of(op: str) -> ShapeRule | None:
    """The rules of `op` (a default-domain op name; `Op#K`, output K of `Op`, has its op's
    rules when they cover the other outputs), or None when it has none."""
    rule = RULES.get(op)
    if rule is None and "#" in op:
        base = RULES.get(op.partition("#")[0])
        rule = base if base is not None and base.projections else None
    return rule


def rule_kind(op: str) -> str:
    """How the engine gets `op`'s output type, as `rewrite ops` shows it: `direct` (a type
    rule: from the input types alone), `symbolic` (a symbolic shape rule, with ONNX shape
    inference for the dtype), or `onnx` (ONNX shape inference on the one node)."""
    rule = rule_of(op)
    if rule is not None and rule.type is not None:
        return "direct"
    return "symbolic" if rule is not None and rule.shape is not None else "onnx"


def old_form(n: Node, opset: int) -> bool:
    """True if default-domain node `n` at `opset` is in an older form than the one its shape
    rule reads (`ShapeRule.since`: Reshape-1's `shape` attribute, Slice-1's `starts`/`ends`
    attributes, Pad-2's `pads` attribute, Split-1's optional `split` input beside the
    attribute, Concat-1's optional axis). The analysis leaves such a node alone: its output
    keeps the type ONNX shape inference gave it, and it is never folded or dropped."""
    rule = rule_of(n.op)
    return n.domain in ("", "ai.onnx") and rule is not None and opset < rule.since
