"""TermGraph -> torch.fx GraphModule (or ExportedProgram, for graphs imported from one).

Every node the rewrite did not touch is copied from the source graph with `Graph.node_copy`,
keeping its name, target and `meta`; opaque nodes always are. Rewritten nodes are written as
call_function nodes on public torch APIs (`frontends.fx.raising`; ATen overloads for
torch.export graphs); a MatMul by a constant weight (plus a bias Add) is written back as
`F.linear`, the way nn.Linear computes it. Constants refer to where they came from (parameter
placeholders, get_attr targets, module attributes); folded constants become new buffers named
`_folded_<consumer>_<weight|bias|...>`. The graph passes `graph.lint()` before it is returned.
"""

from __future__ import annotations

import copy
import dataclasses
import operator
import re
from collections import defaultdict

import numpy as np
import torch
from torch import fx

from engine.egraph import constant_op_value
from frontends.fx.importer import FxSource, Origin, Source
from frontends.fx.linear import Linear, plan_linears
from frontends.fx.raising import RAISE, TUPLES, NoTorchForm
from frontends.fx.tensors import to_torch
from vocab.graph import ABSENT, TermGraph
from vocab.ops import OPS, encode_attr

_FRESH = re.compile(r"rw_\d+")  # names `engine.rebuild` gives values it cannot name otherwise
_VALUE_META = {"val", "example_value", "tensor_meta", "unbacked_bindings"}
_WORDS = {
    ("Conv", "W"): "weight",
    ("Conv", "B"): "bias",
    ("Gemm", "B"): "weight",
    ("Gemm", "C"): "bias",
    ("MatMul", "B"): "weight",
    ("Add", "B"): "bias",
}


class FxExportError(ValueError):
    """The optimized graph has a node torch cannot express (see `NoTorchForm`)."""


def export_fx(g: TermGraph):
    """Build the GraphModule (or ExportedProgram) for `g`, whose `meta` is an `FxSource`.

    Returns a new module; the source module is not modified. Raises FxExportError when a
    rewritten node has no torch form, ValueError if `g` was not imported from fx.
    """
    if not isinstance(g.meta, FxSource):
        raise ValueError("TermGraph has no fx module to export against (meta is not FxSource)")
    try:
        return _Exporter(g).run()
    except NoTorchForm as e:
        raise FxExportError(str(e)) from None


class _Exporter:
    def __init__(self, g: TermGraph):
        self.g, self.meta = g, g.meta
        self.src: fx.GraphModule = g.meta.module
        old = self.src.graph
        self.graph = fx.Graph(tracer_cls=old._tracer_cls, tracer_extras=old._tracer_extras)
        self.graph._codegen = copy.deepcopy(old._codegen)
        self.aten = g.meta.dialect == "aten"
        self.env: dict[int, fx.Node] = {}
        self.copied: dict[fx.Node, fx.Node] = {}
        self.buffers: dict[str, torch.Tensor] = {}
        self.attrs: dict[str, fx.Node] = {}
        self.constants: dict[int, fx.Node] = {}
        self.placeholders = {p.name: p for p in old.nodes if p.op == "placeholder"}
        self.users: dict[int, list] = defaultdict(list)
        for n in g.nodes:
            for i in n.inputs:
                self.users[i].append(n)
        self.device = next((d for d in g.meta.devices.values() if d is not None), None)
        self.node_names: dict[int, str] = {}
        self.heirs: dict[int, str] = {}  # rewritten node -> the source node it replaces
        self.src_nodes = {f.name: f for f in old.nodes}
        self.sizes: dict[str, fx.Node] = {}  # symbolic dimension -> node reading it (Builder.size)
        self.names = {g.values[v].name for n in g.nodes for v in n.outputs}
        self.names |= {g.values[v].name for v in (*g.inputs, *g.outputs, *g.constants)}
        self.copies: dict[tuple, fx.Node] = {}  # (source node, its new inputs) -> its copy
        self.tuples: dict[tuple, fx.Node] = {}  # multi-output application -> its torch call
        self.copyable: dict[tuple, list] = {}  # application -> a group copying its source call
        self.unbound: dict[tuple, list] = {}  # Split application -> a group copying an unbind item
        self.producer = {v: n for n in g.nodes for v in n.outputs}
        self.projected = {_application(n) for n in g.nodes if "#" in n.op and not n.opaque}

    def run(self):
        for p in self.placeholders.values():
            self.copied[p] = self.graph.node_copy(p)
        groups = self._groups()
        self.copyable, self.unbound = _copyable_items(groups)
        skip, fused = plan_linears(self, {id(n) for nodes in groups.values() for n in nodes})
        for n in self.g.nodes:
            origin = n.payload if isinstance(n.payload, Origin) else None
            if origin is not None and origin.group in groups:
                if origin.head:
                    self._copy_group(groups[origin.group])
            elif id(n) in fused:
                self.env[n.outputs[0]] = self._inherit(n, self._linear(n, fused[id(n)]))
            elif id(n) not in skip:
                self.env[n.outputs[0]] = self._inherit(n, self._raise(n))
        self._output()
        return self._module()

    # ---- values ------------------------------------------------------------------------------

    def resolve(self, vid: int, user=None) -> fx.Node:
        """The new fx node holding value `vid`; `user` = (node, slot) names new buffers."""
        if vid in self.env:
            return self.env[vid]
        if vid in self.g.constants:
            if vid not in self.constants:
                self.constants[vid] = self._constant(vid, user)
            return self.constants[vid]
        p = self.placeholders.get(self.g.values[vid].name)
        if p is None:
            raise NoTorchForm(f"value {self.g.values[vid].name} is computed by no node")
        return self.copied[p]

    def source(self, vid: int) -> Source | None:
        return self.meta.sources.get(self.g.values[vid].name)

    def _constant(self, vid: int, user) -> fx.Node:
        src = self.source(vid)
        if src is None or src.kind == "value":
            node = self.buffer(np.asarray(self.g.constants[vid]), vid, user)
            if self.g.values[vid].provenance is not None:
                node.meta["rewrite"] = self.g.values[vid].provenance
            return node
        base = self._leaf(src.ref) if src.kind == "node" else self._get_attr(src.ref)
        if src.transposed:
            target = self._target(torch.t, torch.ops.aten.t.default)
            return self.graph.call_function(target, (base,))
        return base

    def _leaf(self, n: fx.Node) -> fx.Node:
        """The copy of a source node without node inputs (placeholder, get_attr, creator)."""
        if n not in self.copied:
            self.copied[n] = self.graph.node_copy(n)
        return self.copied[n]

    def _get_attr(self, path: str) -> fx.Node:
        if path not in self.attrs:
            self.attrs[path] = self.graph.get_attr(path)
        return self.attrs[path]

    def buffer(self, array: np.ndarray, vid: int, user) -> fx.Node:
        """A new buffer (a placeholder of kind BUFFER for ExportedPrograms) holding `array`."""
        name = self._buffer_name(vid, user)
        tensor = to_torch(array)
        self.buffers[name] = tensor.to(self.device) if self.device is not None else tensor
        if self.meta.program is None:
            return self._get_attr(name)
        users = [
            p
            for p in self.copied.values()
            if p.op == "placeholder" and _input_kind(self.meta.program, p.name) == "USER_INPUT"
        ]
        anchor = users[0] if users else next(iter(self.graph.nodes))
        with self.graph.inserting_before(anchor):
            p = self.graph.placeholder(name)
        p.meta["val"] = _fake(self.meta.program, self.buffers[name])
        return p

    def _buffer_name(self, vid: int, user) -> str:
        """`_folded_<value>` for a folded source value (e.g. an embedding of constant ids), else
        `_folded_<consumer>_<weight|bias|...>`, unique on the module."""
        base = self.g.values[vid].name
        if _FRESH.fullmatch(base) and user is not None:
            node, slot = user
            slot_name = OPS.get(node.op).inputs[slot]
            base = f"{self.node_name(node)}_{_WORDS.get((node.op, slot_name), slot_name.lower())}"
        name = re.sub(r"\W", "_", f"_folded_{base}")
        taken = set(self.buffers) | set(self.placeholders)
        stem, i = name, 0
        while name in taken or hasattr(self.src, name):
            i += 1
            name = f"{stem}_{i}"
        return name

    def node_name(self, n) -> str:
        """Name for the fx node of rewritten node `n`: the one source node of its op that read
        the same first input when that name is free (a Conv with folded BatchNorm keeps the
        conv's name), else its value's name, else `<op>_rw`."""
        if id(n) in self.node_names:
            return self.node_names[id(n)]
        out = self.g.values[n.outputs[0]].name
        reader = self._reader(n)
        if reader and reader not in self.names and n.outputs[0] not in self.g.outputs:
            self.names.add(reader)
            self.heirs[id(n)] = reader
            name = reader
        else:
            name = f"{n.op.lower()}_rw" if _FRESH.fullmatch(out) else out
        self.node_names[id(n)] = name
        return name

    def _reader(self, n) -> str | None:
        first = n.inputs[0] if n.inputs and n.inputs[0] != ABSENT else None
        if first is None:
            return None
        readers = self.meta.readers.get((n.op, self.g.values[first].name), ())
        return readers[0] if len(readers) == 1 else None

    def _inherit(self, n, new: fx.Node) -> fx.Node:
        """A rewritten node that replaces a source node of the same op (see `node_name`), or
        computes a source node's own value (a split item written as a Slice), takes its
        metadata (stack trace, module stack), except values of the old computation. A node
        with provenance gets it as `meta["rewrite"]` (`engine.provenance`)."""
        name = self.heirs.get(id(n), self.g.values[n.outputs[0]].name)
        old = self.src_nodes.get(name)
        if old is not None and new.op == "call_function" and not new.meta:
            new.meta.update({k: v for k, v in old.meta.items() if k not in _VALUE_META})
        if n.provenance is not None:
            new.meta["rewrite"] = n.provenance
        return new

    def _target(self, fn, op):
        """The ATen overload in ATen graphs, else the torch function (whichever exists)."""
        return op if (self.aten and op is not None) or fn is None else fn

    # ---- nodes -------------------------------------------------------------------------------

    def _groups(self) -> dict[int, list]:
        """Groups (pieces of one source fx node) that are untouched and can be copied."""
        by_group: dict[int, list] = defaultdict(list)
        for n in self.g.nodes:
            if isinstance(n.payload, Origin):
                by_group[n.payload.group].append(n)
        outputs = set(self.g.outputs)
        ok = {}
        for gid, nodes in by_group.items():
            ids = {id(n) for n in nodes}
            inner = [n for n in nodes if not n.payload.head]
            if len(nodes) != len(self.meta.groups[gid]) or len(inner) != len(nodes) - 1:
                continue
            if gid in self.meta.pure_only:
                continue
            outside = [u for n in inner for u in self.users[n.outputs[0]] if id(u) not in ids]
            if outside or any(n.outputs[0] in outputs for n in inner):
                continue
            if self._old2new(nodes) is not None:
                ok[gid] = nodes
        return ok

    def _old2new(self, nodes) -> dict | None:
        old2new = {o: n for p in nodes for o, n in zip(p.payload.ins, p.inputs) if o != ABSENT}
        head = next(n for n in nodes if n.payload.head)
        for f, old in head.payload.reads:
            if old not in old2new and not _is_leaf(f):
                return None
        return old2new

    def _copy_group(self, nodes) -> None:
        old2new = self._old2new(nodes)
        head = next(n for n in nodes if n.payload.head)
        env = {
            f: self.resolve(old2new[old]) if old in old2new else self._leaf(f)
            for f, old in head.payload.reads
        }
        new = None
        for f in head.payload.fx:
            # the items of one split (one group each) copy the split once
            key = (f, tuple(env[a] for a in f.all_input_nodes))
            if key not in self.copies:
                self.copies[key] = self.graph.node_copy(f, lambda a: env[a])
                _as_reshape(self.copies[key])
            new = env[f] = self.copies[key]
        self.env[head.outputs[0]] = new

    def _raise(self, n) -> fx.Node:
        base, _, k = n.op.partition("#")
        key = _application(n)
        if base in TUPLES and not n.opaque and (k or base not in RAISE or key in self.projected):
            return self._item(n, key, int(k or 0))
        if n.op == "Squeeze" and not n.opaque and (item := self._unbound_item(n)) is not None:
            return item
        fn = RAISE.get(n.op)
        if fn is None or n.opaque:
            raise NoTorchForm(f"no torch form for {n.op}")
        return fn(Builder(self, n))

    def _item(self, n, key: tuple, k: int) -> fx.Node:
        """Output k of multi-output node `n` (`Op` or `Op#K`): item k of the one torch call
        (`raising.TUPLES`) written for all the outputs of its application `key`."""
        if key not in self.tuples and key in self.copyable:
            # the other items of the same application are copied from the source call (a
            # chunk two of whose three items are untouched): read this one from that call too
            self._copy_group(self.copyable[key])
            head = next(p for p in self.copyable[key] if p.payload.head)
            self.tuples[key] = self.env[head.outputs[0]].args[0]
        if key not in self.tuples:
            name, fn = TUPLES[key[0]]
            self.tuples[key] = fn(Builder(self, n, name))
        return Builder(self, n).getitem(self.tuples[key], k)

    def _unbound_item(self, n) -> fx.Node | None:
        """Squeeze(Split#K(x), axis) read from an unbind call copied for the application's
        untouched items (`_copyable_items`: unbind's item K is that Squeeze), so that a rewritten
        item does not write a second split of x beside it; None when there is none."""
        split = self.producer.get(n.inputs[0])
        if split is None or split.op.partition("#")[0] != "Split":
            return None
        nodes = self.unbound.get(_application(split))
        if nodes is None:
            return None
        head = next(p for p in nodes if p.payload.head)
        axes = [self.g.constants.get(v) for v in (n.inputs[1], head.inputs[1])]
        if any(a is None for a in axes) or not np.array_equal(*axes):
            return None
        self._copy_group(nodes)
        call = self.env[head.outputs[0]].args[0]
        return Builder(self, n).getitem(call, int(split.op.partition("#")[2] or 0))

    def _linear(self, n, plan: Linear) -> fx.Node:
        """F.linear(x, weight, bias) for a planned MatMul/Gemm (see `frontends.fx.linear`)."""
        w = plan.weight
        src = self.source(w)
        if not plan.transpose:
            weight = self.resolve(w, (n, 1))
        elif src is not None and src.transposed:
            weight = self._leaf(src.ref) if src.kind == "node" else self._get_attr(src.ref)
        else:
            user = (plan.weight_user, 1)
            weight = self.buffer(np.ascontiguousarray(self.g.constants[w].T), w, user)
        bias = None
        if plan.bias is not None:
            bias = self.resolve(plan.bias, (plan.bias_user, plan.bias_slot))
        x = self.resolve(plan.x)
        target = torch.ops.aten.linear.default if self.aten else torch.nn.functional.linear
        name = self.node_name(plan.weight_user)
        y = self.graph.call_function(target, (x, weight, bias), name=name)
        if plan.reshape is None:
            return y
        shape = [int(d) for d in self.g.constants[plan.reshape]]
        target = torch.ops.aten.reshape.default if self.aten else torch.reshape
        return self.graph.call_function(target, (y, shape), name=self.node_name(n))

    # ---- finishing -------------------------------------------------------------------------

    def _output(self) -> None:
        """The graph's output node. An output the rewrite reduced to an input or a parameter
        (x * 1.0 to x) is returned as a clone of it, as the original returned a tensor of its
        own: the caller may write into it without writing into its input."""
        old = next(n for n in self.src.graph.nodes if n.op == "output")
        leaves = iter(self.g.outputs[: self.meta.n_outputs])

        def output(o):
            new = self.resolve(next(leaves))
            if new.op in _STORED and o.op not in _STORED:
                clone = torch.ops.aten.clone.default if self.aten else torch.clone
                new = self.graph.call_function(clone, (new,))
            return new

        args = fx.node.map_arg(old.args[0], output)
        out = self.graph.output(args, type_expr=old.type)
        out.meta = copy.copy(old.meta)

    def _module(self):
        targets = {n.target for n in self.graph.nodes if n.op in ("get_attr", "call_module")}
        root = {t: self.buffers[t] if t in self.buffers else _resolve(self.src, t) for t in targets}
        gm = fx.GraphModule(root, self.graph, self.src.__class__.__name__)
        gm.meta = dict(getattr(self.src, "meta", {}))
        gm.train(self.src.training)
        # a sink (an in-place write, a random draw, an effect nobody reads) is kept though
        # nothing reads it; torch would drop a call_method `add_` as dead
        sinks = {self.env[v] for v in self.g.outputs[self.meta.n_outputs :] if v in self.env}
        if gm.graph.eliminate_dead_code(lambda n: n in sinks or n.is_impure()):
            gm.recompile()
        gm.graph.lint()
        if self.meta.program is None:
            return gm
        # a copied placeholder may be renamed (`input`, nn.Sequential's argument, shadows a
        # builtin: fx names the copy `input_1`); its spec follows it by the node, not the name
        was = {new.name: old.name for old, new in self.copied.items() if old.op == "placeholder"}
        return _program(self.meta.program, gm, self.buffers, was)


_STORED = ("placeholder", "get_attr")  # values the caller or the module holds


# `view` needs a layout its input may have lost: the import reads `contiguous()` as Identity,
# which the rewrite removes, so x.t().contiguous().view(-1) reaches its copied view as x.t()
_VIEWS = {
    ("call_method", "view"): ("call_method", "reshape"),
    ("call_function", torch.Tensor.view): ("call_function", torch.Tensor.reshape),
    ("call_function", torch.ops.aten.view.default): (
        "call_function",
        torch.ops.aten.reshape.default,
    ),
}


def _as_reshape(n: fx.Node) -> None:
    """A copied `view` (x.view(shape), aten.view) becomes the same call of `reshape`, which
    is a view wherever `view` would be one and a copy where `view` would raise (torch's
    documented semantics of Tensor.reshape); a view of a dtype (x.view(torch.int32)) stays."""
    target = _VIEWS.get((n.op, n.target))
    if target is None or any(isinstance(a, torch.dtype) for a in (*n.args, *n.kwargs.values())):
        return
    n.op, n.target = target


def _placeholder_shape(p: fx.Node) -> tuple:
    val = p.meta.get("val", p.meta.get("example_value"))
    return tuple(val.shape) if isinstance(val, torch.Tensor) else ()


class Builder:
    """What a `frontends.fx.raising` function sees of one canonical node."""

    def __init__(self, ex: _Exporter, node, name: str | None = None):
        self.ex, self.node, self.aten = ex, node, ex.aten
        self.name = name or ex.node_name(node)

    def x(self, i: int) -> fx.Node:
        """The fx node holding input `i` of the canonical node (raises NoTorchForm if no node
        computes it)."""
        return self.ex.resolve(self.node.inputs[i], (self.node, i))

    def absent(self, i: int) -> bool:
        """True if input `i` is omitted (past the end of the input list, or `ABSENT`)."""
        return i >= len(self.node.inputs) or self.node.inputs[i] == ABSENT

    def const(self, i: int):
        """The constant (numpy array) held by input `i`, or None if it is absent or not constant."""
        return None if self.absent(i) else self.ex.g.constants.get(self.node.inputs[i])

    def scalar_or_x(self, i: int):
        """A Python number for a 0-d constant made at import or by folding, else `x(i)`."""
        c, src = self.const(i), None if self.absent(i) else self.ex.source(self.node.inputs[i])
        if c is None or np.ndim(c) != 0 or (src is not None and src.kind != "value"):
            return self.x(i)
        kind = np.asarray(c).dtype.kind
        return bool(c) if kind == "b" else int(c) if kind in "iu" else float(c)

    def type(self, i: int):
        """The tensor type of input `i`."""
        return self.ex.g.values[self.node.inputs[i]].type

    @property
    def out(self):
        """The tensor type of the node's first output."""
        return self.ex.g.values[self.node.outputs[0]].type

    def attr(self, name: str):
        """The node's attribute `name` (None if it does not set it)."""
        return self.node.attr(name)

    def call(self, fn, op, *args, **kwargs) -> fx.Node:
        """A new call_function node named after the canonical node: ATen overload `op` in ATen
        graphs, else torch function `fn` (whichever exists), applied to `args` and `kwargs`."""
        return self.ex.graph.call_function(self.ex._target(fn, op), args, kwargs, name=self.name)

    def size(self, i: int, axis: int) -> fx.Node | int:
        """Dimension `axis` of input `i`: the number, or a node reading the symbolic size at run
        time. One node per symbol for the whole graph, read from a graph input that has it
        when there is one (it then precedes every use), else from input `i` itself."""
        d = self.type(i).shape[axis]
        if isinstance(d, int):
            return d
        sizes = self.ex.sizes
        if d not in sizes:
            home = next(
                (
                    (p, j)
                    for p in self.ex.placeholders.values()
                    for j, pd in enumerate(_placeholder_shape(p))
                    if str(pd) == d
                ),
                None,
            )
            size = torch.ops.aten.sym_size.int
            if home is None:
                return self.ex.graph.call_function(size, (self.x(i), axis))
            p, j = home
            last = [n for n in self.ex.graph.nodes if n.op == "placeholder"][-1]
            with self.ex.graph.inserting_after(last):  # placeholders stay first
                sizes[d] = self.ex.graph.call_function(size, (self.ex.copied[p], j))
        return sizes[d]

    def getitem(self, node: fx.Node, i: int) -> fx.Node:
        """A node taking item `i` of the tuple `node` returns (e.g. output 0 of a native op)."""
        return self.ex.graph.call_function(operator.getitem, (node, i), name=self.name)

    def own_constant(self) -> fx.Node:
        """A buffer holding the value of this `Constant` node (decoded from its attributes)."""
        spec = OPS.get("Constant")
        attrs = tuple(encode_attr(a.kind, self.node.attr(a.name)) for a in spec.attrs)
        value = constant_op_value(attrs)
        return self.ex.buffer(value, self.node.outputs[0], None)


def _copyable_items(groups: dict[int, list]) -> tuple[dict[tuple, list], dict[tuple, list]]:
    """Two maps from an application (`_application`) to a group of `groups` (untouched,
    copied as it is) whose last copied fx node is `operator.getitem(call, k)`, the call
    computing every item of the application: (1) groups whose head is item k itself (`Op#K`,
    or `Op` for item 0); (2) groups of an unbind's item k, a Split#K (or Split) and the head
    Squeeze of that axis (`spellings.unbind_item`), keyed by the Split's application."""
    items, unbound = {}, {}
    for nodes in groups.values():
        head = next(p for p in nodes if p.payload.head)
        last = head.payload.fx[-1] if head.payload.fx else None
        if last is None or head.opaque or last.target is not operator.getitem:
            continue
        inner = [p for p in nodes if not p.payload.head]
        item, out = head, items
        if head.op == "Squeeze" and len(inner) == 1 and head.inputs[0] == inner[0].outputs[0]:
            item, out = inner[0], unbound  # unbind's item: the Squeeze of a Split's output
        base, _, k = item.op.partition("#")
        if base not in TUPLES or item.opaque or (out is unbound and base != "Split"):
            continue
        if last.args[1:] == (int(k or 0),):
            out.setdefault(_application(item), nodes)
    return items, unbound


def _application(n) -> tuple:
    """What the projections of one multi-output application share: op, inputs, attributes."""
    return (n.op.partition("#")[0], n.inputs, n.attrs)


def _is_leaf(n: fx.Node) -> bool:
    if n.op in ("placeholder", "get_attr"):
        return True
    return n.op == "call_function" and not n.all_input_nodes


def _resolve(module, target: str):
    obj = module
    for part in target.split("."):
        obj = getattr(obj, part)
    return obj


def _input_kind(program, name: str) -> str:
    spec = next((s for s in program.graph_signature.input_specs if s.arg.name == name), None)
    return "BUFFER" if spec is None else spec.kind.name


def _fake(program, tensor: torch.Tensor):
    vals = [n.meta.get("val") for n in program.graph.nodes if n.op == "placeholder"]
    mode = torch._guards.detect_fake_mode([v for v in vals if isinstance(v, torch.Tensor)])
    return mode.from_tensor(tensor, static_shapes=True) if mode is not None else tensor


def _propagate_vals(gm: fx.GraphModule) -> None:
    """Fill `meta["val"]` (fake tensors) of every node, as torch.export's verifier requires.
    A node copied from the program keeps its own: propagating through it again, in the
    program's shape environment, specialized MobileViT's dynamic batch to the example's 2 at
    an `upsample_bilinear2d` (the black-box tester's finding), in the user's program too."""
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp

    class Missing(FakeTensorProp):
        def run_node(self, n):
            if n.op != "placeholder" and "val" in n.meta:
                return n.meta["val"]
            return super().run_node(n)

    vals = [p.meta.get("val") for p in gm.graph.nodes if p.op == "placeholder"]
    mode = torch._guards.detect_fake_mode([v for v in vals if isinstance(v, torch.Tensor)])
    Missing(gm, mode).propagate_dont_convert_inputs(*vals)


def _program(program, gm: fx.GraphModule, buffers: dict[str, torch.Tensor], was: dict[str, str]):
    """A new ExportedProgram around `gm`: the old signature plus the new buffers. `was`: the
    name in `program` of each placeholder of `gm` copied from it, whose spec it keeps (under
    its new name); a placeholder not in `was` is a new buffer."""
    from torch.export.graph_signature import (
        ExportGraphSignature,
        InputKind,
        InputSpec,
        TensorArgument,
    )

    _propagate_vals(gm)
    old = {s.arg.name: s for s in program.graph_signature.input_specs}
    specs = []
    for p in (n for n in gm.graph.nodes if n.op == "placeholder"):
        spec = old.get(was.get(p.name, ""))
        if spec is None:
            specs.append(InputSpec(InputKind.BUFFER, TensorArgument(p.name), p.name, True))
        elif getattr(spec.arg, "name", p.name) != p.name:
            specs.append(dataclasses.replace(spec, arg=dataclasses.replace(spec.arg, name=p.name)))
        else:
            specs.append(spec)
    out_node = next(n for n in gm.graph.nodes if n.op == "output")
    # an export graph returns a flat tuple, one item per output spec (a None output too)
    result = out_node.args[0]
    flat = list(result) if isinstance(result, tuple | list) else [result]
    outs = []
    for spec, node in zip(program.graph_signature.output_specs, flat, strict=True):
        tensor = isinstance(spec.arg, TensorArgument) and isinstance(node, fx.Node)
        arg = TensorArgument(node.name) if tensor else spec.arg
        outs.append(dataclasses.replace(spec, arg=arg))
    state = {**program.state_dict, **buffers}
    signature = ExportGraphSignature(specs, outs)
    return torch.export.ExportedProgram(
        root=gm,
        graph=gm.graph,
        graph_signature=signature,
        state_dict=state,
        range_constraints=copy.deepcopy(program.range_constraints),
        module_call_graph=copy.deepcopy(program.module_call_graph),
        example_inputs=program.example_inputs,
        constants=program.constants,
        verifiers=program.verifiers,
    )
