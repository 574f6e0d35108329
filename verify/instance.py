"""An instance of a rule: a drawn example of its left side, bound the way the engine binds a
match, and both sides as ONNX models.

The left side is imported with the engine's own importer (`frontends.onnx.import_model`), so
guards and builders see exactly the facts the engine sees (`ClassInfo`: types from ONNX shape
inference, values of constants) and attribute captures take the canonical values the engine
matches on (defaults filled in, an absent Transpose perm written out). Guards and builders
are then evaluated by the engine's own apply step (`engine.apply`), not re-implemented.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import helper, numpy_helper

from dsl.ir import Absent, Capture, OpNode, Rule
from engine import apply as engine_apply
from engine.optimize import form_lacks
from frontends.onnx.importer import import_model
from verify.draw import Example
from vocab.declared import functions_for
from vocab.graph import ABSENT, Node
from vocab.onnx_nodes import export_node
from vocab.ops import MAX_OPSET, OPS, encode_attr
from vocab.types import UNKNOWN, ClassInfo, TensorType

IR_VERSION = 10  # onnxruntime 1.31 loads IR <= 13


class NotAMatch(Exception):
    """The drawn example is not a match the engine would make (e.g. a builder cannot build,
    or an op is imported as opaque)."""


@dataclass
class Instance:
    """One drawn example of `rule` (a directed rule), bound like an engine match.

    guards: the verdict of each of the rule's guards. lhs/rhs: the two sides as ONNX models
    (rhs None when the guards do not all hold). feeds: values of the graph inputs.
    """

    rule: Rule
    example: Example
    lhs: onnx.ModelProto
    rhs: onnx.ModelProto | None
    feeds: dict[str, np.ndarray]
    guards: tuple[bool, ...]
    attrs: dict[str, object]


def instantiate(rule: Rule, ex: Example, build_rhs: bool = True) -> Instance:
    """Bind `ex` as a match of `rule`; build the right side when every guard holds and
    `build_rhs`. Raises NotAMatch (see class doc)."""
    lhs = lhs_model(ex)
    imported = import_model(lhs)
    infos = _infos(ex, imported)
    attrs = _attr_binding(rule, ex, imported)
    kinds = engine_apply.attr_kinds(rule)
    binding = {name: name for name in rule.term_captures}
    binding.update({name: encode_attr(kinds[name], v) for name, v in attrs.items()})
    facts = _Facts(infos)
    verdicts = tuple(
        engine_apply._Match(
            dataclasses.replace(rule, guards=(g,)), binding, kinds, facts, None
        ).guards_hold()
        for g in rule.guards
    )
    rhs = None
    if build_rhs and all(verdicts):
        match = engine_apply._Match(rule, binding, kinds, facts, None)
        rhs = _RightSide(ex, match).model()
    feeds = {
        leaf.name: leaf.value for leaf in ex.leaves.values() if not leaf.absent and not leaf.const
    }
    return Instance(rule, ex, lhs, rhs, feeds, verdicts, attrs)


class _Facts:
    """The part of `engine.egraph.Snapshot` the apply step reads: `info(key)`."""

    def __init__(self, infos: dict[str, ClassInfo]):
        self.infos = infos

    def info(self, key: str) -> ClassInfo:
        return self.infos.get(key, ClassInfo(UNKNOWN))

    def is_absent(self, key: str) -> bool:
        """False: a drawn example's list items are all present inputs (`dsl.lists.concrete`)."""
        return False


def _infos(ex: Example, imported) -> dict[str, ClassInfo]:
    by_name = {v.name: vid for vid, v in enumerate(imported.values)}
    out = {}
    for name in ex.types:
        leaf = ex.leaves.get(name)
        if leaf is not None and leaf.absent:
            out[name] = ClassInfo(UNKNOWN)
        elif name in by_name:
            vid = by_name[name]
            out[name] = ClassInfo(imported.values[vid].type, imported.constants.get(vid))
        elif leaf is not None:  # a constant the importer shared with an identical one
            out[name] = ClassInfo(TensorType(leaf.dtype, leaf.shape), leaf.value)
    return out


def _attr_binding(rule: Rule, ex: Example, imported) -> dict[str, object]:
    """Attribute capture -> the canonical value the engine matches at its position."""
    nodes = {imported.values[n.outputs[0]].name: n for n in imported.nodes if n.outputs}
    out: dict[str, object] = {}

    def walk(t):
        if not isinstance(t, OpNode):
            return
        node = nodes.get(ex.output_of.get(id(t), ""))
        if node is None or node.opaque or node.op != t.op:
            raise NotAMatch(f"{t.op} is not imported as a matchable node")
        have = dict(node.attrs)
        for name, v in t.attrs:
            if isinstance(v, Capture):
                if v.name in out and out[v.name] != have[name]:
                    raise NotAMatch(f"@{v.name} would bind two different values")
                out[v.name] = have[name]
        for a in t.args:
            walk(a)

    walk(rule.lhs)
    return out


def lhs_model(
    ex: Example, extra_outputs: bool = False, swap: frozenset = frozenset()
) -> onnx.ModelProto:
    """The left side as a model. extra_outputs: every inner node's output is a graph output
    too (the multi-use case). swap: outputs of nodes whose first two inputs are swapped."""
    nodes = []
    for n in ex.nodes:
        ins = list(n.inputs)
        if n.output in swap:
            ins[0], ins[1] = ins[1], ins[0]
        nodes.append(proto(n.op, ins, n.output, n.attrs))
    roots = [ex.root, *ex.roots]
    outs = roots + ([n.output for n in ex.nodes if n.output not in roots] if extra_outputs else [])
    outputs = [helper.make_tensor_value_info(o, ex.types[o].dtype, ex.types[o].shape) for o in outs]
    return make_model(ex, nodes, outputs)


def make_model(ex: Example, nodes, outputs) -> onnx.ModelProto:
    """A model of `nodes` over the example's leaves (inputs and initializers) at its opset."""
    used = {i for n in nodes for i in n.input}
    leaves = [leaf for leaf in ex.leaves.values() if not leaf.absent and leaf.name in used]
    inputs = [
        helper.make_tensor_value_info(x.name, x.dtype, x.shape) for x in leaves if not x.const
    ]
    inits = [numpy_helper.from_array(np.asarray(x.value), x.name) for x in leaves if x.const]
    graph = helper.make_graph(nodes, "rule", inputs, outputs, inits)
    # a rule may write ops of another domain (onnxruntime's contrib ops): import each at the
    # op table's version of it
    domains = {n.domain: OPS.get(f"{n.domain}.{n.op_type}") for n in nodes if n.domain}
    imports = [helper.make_opsetid("", ex.opset)]
    imports += [helper.make_opsetid(d, spec.version) for d, spec in sorted(domains.items()) if spec]
    # an op a rule file declares runs on both executors through its body (vocab.declared)
    model = helper.make_model(
        graph, opset_imports=imports, functions=functions_for(nodes, ex.opset)
    )
    model.ir_version = IR_VERSION
    return model


def proto(op: str, inputs: list[str], output: str, attrs) -> onnx.NodeProto:
    """One NodeProto, attributes at their default left out (`vocab.onnx_nodes.export_node`, as
    the exporter writes it)."""
    names = [*inputs, output]
    ids = tuple(ABSENT if n == "" else i for i, n in enumerate(inputs))
    node = Node(op, ids, (len(inputs),), tuple(attrs))
    return export_node(node, lambda v: "" if v == ABSENT else names[v])


class _RightSide:
    """Builds the right side of a match over the example's leaves; attribute values and
    builder calls go through the engine's `_Match.value`."""

    def __init__(self, ex: Example, match):
        self.ex, self.match = ex, match
        self.nodes: list[onnx.NodeProto] = []
        self.count = 0

    def model(self) -> onnx.ModelProto:
        """The right side as a model: one output per result (`out`, then `out1`, ... for a
        multi-root rule's other results), in the order of the left side's roots."""
        names = []
        for k, result in enumerate(self.match.rule.results_all):
            name = f"out{k}" if k else "out"
            root = self.term(result, name)
            if root != name:
                self.nodes.append(helper.make_node("Identity", [root], [name]))
            names.append(name)
        needed = self._inner_nodes({i for n in self.nodes for i in n.input})
        outputs = [helper.make_value_info(n, onnx.TypeProto()) for n in names]
        return make_model(self.ex, needed + self.nodes, outputs)

    def term(self, t, name: str | None = None) -> str:
        if isinstance(t, Absent):
            return ""
        if isinstance(t, Capture):
            leaf = self.ex.leaves.get(t.name)
            return "" if leaf is not None and leaf.absent else t.name
        ins = [self.term(a) for a in t.args]
        try:
            attrs = [(n, self.match.value(v)) for n, v in t.attrs]
        except engine_apply._Skip as e:
            raise NotAMatch(f"builder {e} could not build") from None
        self.count += 1
        out = name or f"_r{self.count}"
        self.nodes.append(proto(t.op, ins, out, attrs))
        return out

    def _inner_nodes(self, names: set[str]) -> list[onnx.NodeProto]:
        """The left side's nodes that compute `names` (an `Op@y` capture used on the right)."""
        by_out = {n.output: n for n in self.ex.nodes}
        keep, todo = set(), [n for n in names if n in by_out]
        while todo:
            name = todo.pop()
            if name not in keep:
                keep.add(name)
                todo += [i for i in by_out[name].inputs if i in by_out]
        return [
            proto(n.op, list(n.inputs), n.output, n.attrs)
            for n in self.ex.nodes
            if n.output in keep
        ]


def reversed_rule(rule: Rule) -> Rule:
    """The right-to-left direction of an `equal` rule, named `NAME (reverse)` as the engine
    reports it."""
    return dataclasses.replace(rule, name=f"{rule.name} (reverse)", lhs=rule.rhs, rhs=rule.lhs)


def op_names(t) -> set[str]:
    """The operators of a term."""
    if isinstance(t, OpNode):
        return {t.op}.union(*(op_names(a) for a in t.args))
    return set()


def lowest_opset(rule: Rule) -> int:
    """The lowest default-domain opset at which every op of both sides is in the op table, in
    a form with every input slot and non-default attribute the rule writes
    (`engine.optimize.form_lacks`: Reshape's allowzero is opset 14's), and the engine runs the
    rule: at or above its ruleset's `:opset` (`Rule.opset`)."""
    ops = op_names(rule.lhs) | op_names(rule.rhs)
    first = max([13, rule.opset, *(OPS.first_opset(op) for op in ops)])
    for opset in range(first, MAX_OPSET + 1):
        if not form_lacks(rule.lhs, opset) and not form_lacks(rule.rhs, opset):
            return opset
    return first
