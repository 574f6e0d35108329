"""torch.fx -> TermGraph.

Takes the three dialects users have: `symbolic_trace` graphs (call_module, call_function,
call_method; parameters as get_attr), graphs torch.compile hands a backend (torch functions;
parameters as placeholders, constants only when frozen), and torch.export programs (ATen
overloads; parameters, buffers and constants named by the graph signature). Nodes are lowered
to the canonical ONNX vocabulary by `frontends.fx.table`; anything else is an opaque node (domain
"fx", never folded or matched) that export copies back unchanged.

Shapes and dtypes come from node metadata (`val`, `example_value`, `tensor_meta`) or, when it is
missing, from running the module on the example inputs.

Effects (`frontends.fx.effects`): an in-place op on a value only it reads becomes its pure
form. Any other in-place op pins the storage it writes: the nodes that read or view it are
imported opaque, and they and the random draws (dropout in training, ...) read their
predecessor implicitly (`Node.implicit`), so they stay in their order while the rest of the
graph is rewritten; `FxSource.in_order` says why. Only a switch of global state (grad mode,
autocast) raises `FxImportError`; `optimize_fx` then returns the module unchanged.
"""

from __future__ import annotations

import hashlib
import operator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import fx

from frontends.fx import effects, nodes
from frontends.fx.lower import Lowering, Unmapped
from frontends.fx.table import CREATORS, FUNCTIONS, MODULES, MULTI_OUTPUT
from frontends.fx.tensors import onnx_elem, to_numpy
from vocab.graph import Node, TermGraph, Value
from vocab.types import UNKNOWN, TensorType, onnx_dtype

OPSET = 23  # default-domain opset of imported graphs: Gelu (20), AveragePool (19) and
# RMSNormalization (23) included
_DEDUP_MAX_BYTES = 1 << 16


@dataclass(frozen=True)
class Source:
    """Where a constant comes from, so export can refer to it instead of copying it.

    kind: "node" (an fx node of the source graph: a parameter placeholder, a get_attr, a
    creator call), "attr" (a module attribute path, `ref`), or "value" (made at import, e.g.
    a Python number; export writes its value). transposed: the constant is ref's transpose.
    """

    kind: str
    ref: Any = None
    transposed: bool = False


@dataclass(frozen=True, eq=False)
class Origin:
    """`Node.payload` of imported nodes: what export needs to copy the original fx node(s).

    fx: the fx nodes to copy (on the head piece only). ins: the piece's input value ids at
    import. reads: (fx node, value id) for every fx node the group's nodes read. group: the id
    shared by the canonical pieces one fx node was lowered to.
    """

    fx: tuple[fx.Node, ...]
    ins: tuple[int, ...]
    reads: tuple[tuple[fx.Node, int], ...]
    group: int
    head: bool


@dataclass(frozen=True, eq=False)
class FxSource:
    """`TermGraph.meta` of an imported graph: the source module and what export needs.

    dialect: "aten" when call_function targets are ATen overloads, else "torch".
    n_outputs: graph outputs in `TermGraph.outputs`; the rest keep effectful nodes alive.
    groups: group id -> output value names of its pieces. readers: (canonical op, name of its
    first input) -> source fx node name, to name folded weights after the layer they replace.
    devices: value name -> device. pure_only: groups export never copies (in-place ops made
    pure; nodes reading sizes from the symbolic types).
    program: the ExportedProgram, if any. in_order: why nodes were kept as they are, in order
    (see `frontends.fx.effects`); empty when nothing was.
    """

    module: fx.GraphModule
    dialect: str
    n_outputs: int
    sources: dict[str, Source]
    groups: dict[int, tuple[str, ...]]
    readers: dict[tuple[str, str], tuple[str, ...]] = field(default_factory=dict)
    devices: dict[str, torch.device] = field(default_factory=dict)
    pure_only: frozenset[int] = frozenset()
    program: Any = None
    in_order: tuple[str, ...] = ()


def import_fx(gm, example_inputs=None, *, freeze: bool = False) -> TermGraph:
    """Import a GraphModule (or a torch.export ExportedProgram). Neither is modified.

    example_inputs: tensors (or fake tensors) for the placeholders; needed only when nodes
    carry no shape metadata. freeze: treat placeholders that torch.compile marks as parameters
    or buffers as constants (their current values). Raises FxImportError (see module doc).
    """
    program = None
    if isinstance(gm, torch.export.ExportedProgram):
        program, gm = gm, gm.graph_module
    order = effects.plan(gm)
    while True:
        try:
            return _Importer(gm, program, example_inputs, freeze, order).run()
        except _Unlowered as e:  # an in-place op with no pure form: pin what it writes
            order = effects.plan(gm, order.unlowered | {e.node})


class _Unlowered(Exception):
    """An in-place op the plan took for a pure one has no pure form (see `import_fx`)."""

    def __init__(self, node: fx.Node):
        super().__init__(node.name)
        self.node = node


class _Importer:
    def __init__(
        self, gm: fx.GraphModule, program, example_inputs, freeze: bool, order: effects.Order
    ):
        self.gm, self.program, self.freeze, self.order = gm, program, freeze, order
        self.last_in_order: int | None = None  # output of the last chained node
        self.inputs = list(example_inputs or ())
        self.opset = OPSET
        self.values: list[Value] = []
        self.vid_of: dict[fx.Node, int] = {}
        self.nodes: list[Node] = []
        self.constants: dict[int, np.ndarray] = {}
        self.sources: dict[str, Source] = {}
        self.groups: dict[int, tuple[str, ...]] = {}
        self.readers: dict[tuple[str, str], tuple[str, ...]] = {}
        self.taken = {n.name for n in gm.graph.nodes}
        self.info = nodes.node_info(gm, program, self.inputs)
        self.aten = any(isinstance(n.target, torch._ops.OpOverload) for n in gm.graph.nodes)
        self.canonical: dict[fx.Node, str] = {}  # fx node -> canonical op of its head piece
        self.absorbed: set[fx.Node] = set()
        self.pure_only: set[int] = set()
        self.graph_inputs: list[int] = []
        self.sinks: list[int] = []
        self._by_digest: dict[tuple, int] = {}

    def run(self) -> TermGraph:
        outputs: list[int] = []
        for n in self.gm.graph.nodes:
            if n.op == "output":
                fx.node.map_arg(n.args[0], lambda a: outputs.append(self.vid_of[a]))
                continue
            self.vid_of[n] = self.new_value(n.name, self.type_of_node(n), reserve=False)
            if n in self.order.pinned or n in self.order.chain:
                self._opaque(n)
            else:
                getattr(self, f"_{n.op}")(n)
        meta = FxSource(
            self.gm,
            "aten" if self.aten else "torch",
            len(outputs),
            self.sources,
            self.groups,
            self.readers,
            {v.name: d for v, d in self._devices()},
            frozenset(self.pure_only),
            self.program,
            self.order.reasons,
        )
        return TermGraph(
            tuple(self.values),
            tuple(self.nodes),
            tuple(self.graph_inputs),
            tuple(outputs + self.sinks),
            self.constants,
            self.opset,
            meta,
        )

    # ---- values and constants --------------------------------------------------------------

    def type_of_node(self, n: fx.Node) -> TensorType:
        return self.info.get(n, (UNKNOWN, None))[0]

    def device_of(self, n: fx.Node) -> torch.device | None:
        return self.info.get(n, (UNKNOWN, None))[1]

    def _devices(self):
        return ((self.values[v], self.device_of(n)) for n, v in self.vid_of.items())

    def new_value(self, name: str, t: TensorType, reserve: bool = True) -> int:
        if reserve:
            base, i = name, 0
            while name in self.taken:
                i += 1
                name = f"{base}_{i}"
            self.taken.add(name)
        self.values.append(Value(name, t))
        return len(self.values) - 1

    def _constant(self, name: str, array: np.ndarray, source: Source, vid: int | None = None):
        # only constants made at import are shared; parameters and buffers stay distinct
        # (they are different tensors to torch, e.g. one may require grad)
        small = source.kind == "value" and array.nbytes <= _DEDUP_MAX_BYTES
        key = None
        if small:
            key = (array.dtype.str, array.shape, hashlib.sha1(array.tobytes()).hexdigest())
        if key is not None and key in self._by_digest and vid is None:
            return self._by_digest[key]
        if vid is None:
            vid = self.new_value(name, UNKNOWN)
        self.values[vid] = Value(self.values[vid].name, _array_type(array))
        self.constants[vid] = array
        self.sources[self.values[vid].name] = source
        if key is not None:
            self._by_digest.setdefault(key, vid)
        return vid

    def value_constant(self, array: np.ndarray, node: fx.Node) -> int:
        """A constant made at import (a Python number, a fill): export writes its value."""
        return self._constant(f"{node.name}_const", array, Source("value"))

    def attr_constant(self, path: str, tensor: torch.Tensor, transposed: bool = False) -> int:
        """A tensor attribute of the module at `path` (e.g. `conv1.weight`)."""
        array = to_numpy(tensor.T if transposed else tensor)
        name = path.replace(".", "_") + ("_t" if transposed else "")
        return self._constant(name, array, Source("attr", path, transposed))

    def transposed_constant(self, vid: int) -> int:
        """The transpose of 2-D constant `vid`, referring back to the same source: a view, not
        a copy (copying every linear weight of ViT-base took 0.4 s)."""
        src = self.sources[self.values[vid].name]
        array = self.constants[vid].T
        name = f"{self.values[vid].name}_t"
        return self._constant(name, array, Source(src.kind, src.ref, not src.transposed))

    # ---- fx node kinds ---------------------------------------------------------------------

    def _placeholder(self, n: fx.Node) -> None:
        tensor = self._placeholder_constant(n)
        if tensor is None:
            self.graph_inputs.append(self.vid_of[n])
        else:
            self._constant(n.name, to_numpy(tensor), Source("node", n), self.vid_of[n])

    def _placeholder_constant(self, n: fx.Node) -> torch.Tensor | None:
        if self.program is not None:
            spec = next(s for s in self.program.graph_signature.input_specs if s.arg.name == n.name)
            if spec.kind.name in ("PARAMETER", "BUFFER"):
                state = self.program.state_dict
                return state.get(spec.target, self.program.constants.get(spec.target))
            if spec.kind.name == "CONSTANT_TENSOR":
                return self.program.constants[spec.target]
            return None
        if not self.freeze:
            return None
        index = [p for p in self.gm.graph.nodes if p.op == "placeholder"].index(n)
        value = self.inputs[index] if index < len(self.inputs) else None
        real = isinstance(value, torch.Tensor) and not nodes.is_fake(value)
        return value if real and nodes.is_state(n, value) else None

    def _get_attr(self, n: fx.Node) -> None:
        value = nodes.resolve(self.gm, n.target)
        if isinstance(value, torch.Tensor) and not nodes.is_fake(value):
            self._constant(n.name, to_numpy(value), Source("node", n), self.vid_of[n])
        else:
            self._opaque(n)

    def _call_function(self, n: fx.Node) -> None:
        if n.target is torch.ops.aten._assert_tensor_metadata.default and self._holds(n):
            return  # decided at export time: keeping it would pin the value it reads
        if n.target in CREATORS and not n.all_input_nodes:
            value = nodes.evaluate(n)
            if value is not None:
                self._constant(n.name, value, Source("node", n), self.vid_of[n])
                return
        if self._read_by_items(n):
            self.absorbed.add(n)
            return
        parent = n.args[0] if n.target is operator.getitem else None
        if parent in self.absorbed:
            self._lower_item(n, parent)
            return
        if not self._lower(n, FUNCTIONS.get(n.target), n.args, n.kwargs, (n,)):
            self._opaque(n)

    def _call_method(self, n: fx.Node) -> None:
        if self._read_by_items(n):
            self.absorbed.add(n)
            return
        if not self._lower(n, FUNCTIONS.get(f"method:{n.target}"), n.args, n.kwargs, (n,)):
            self._opaque(n)

    def _holds(self, n: fx.Node) -> bool:
        """Does torch.export's `_assert_tensor_metadata(a, dtype=, device=, layout=)` hold for
        every run? A value's dtype, device and layout are fixed by the program's input checks,
        so it holds when they are the ones the graph's metadata gives `a`. Sizes and strides
        may vary with symbolic shapes: an assertion on them is kept."""
        a = dict(zip(("a", "size", "stride", "dtype"), n.args)) | dict(n.kwargs)
        x = a.get("a")
        if not isinstance(x, fx.Node) or a.get("size") is not None or a.get("stride") is not None:
            return False
        t, device = self.type_of_node(x), self.device_of(x)
        if a.get("dtype") is not None and (not t.dtype or t.dtype != onnx_elem(a["dtype"])):
            return False
        if a.get("device") is not None and (device is None or torch.device(a["device"]) != device):
            return False
        return a.get("layout") in (None, torch.strided)

    def _read_by_items(self, n: fx.Node) -> bool:
        """A multi-output op (split, chunk, unbind, native_layer_norm, ...: `MULTI_OUTPUT`)
        whose every use is `getitem(n, k)`: each item is lowered at its getitem."""
        return _key(n) in MULTI_OUTPUT and nodes.read_by_items(n)

    def _lower_item(self, n: fx.Node, parent: fx.Node) -> None:
        """getitem(parent, k) of an absorbed multi-output node: output k of the canonical
        application the parent is (`Split#K`, `LayerNormalization#K`, ...), or its first output
        (batch norm). Every item's pieces copy the parent and the getitem when untouched (export
        copies the parent once). If one item cannot be lowered, the parent and that item stay
        opaque."""
        spelling = MULTI_OUTPUT[_key(parent)]
        try:
            bound = {**spelling.params.bind(parent.args, parent.kwargs), "item": n.args[1]}
        except Unmapped:
            bound = None
        if bound is None or not self._lower(n, (spelling.lower, bound), (), {}, (parent, n)):
            self.absorbed.discard(parent)
            self._opaque(parent)
            self._opaque(n)

    def _call_module(self, n: fx.Node) -> None:
        module = nodes.resolve(self.gm, n.target)
        entry = MODULES.get(type(module))
        args = None
        if entry is not None and len(n.args) == 1 and not n.kwargs:
            try:
                args = (entry[0], entry[1](module, n.args[0]))
            except Unmapped:
                pass
        if not self._lower(n, args, (), {}, (n,), module):
            self._opaque(n)

    # ---- lowering --------------------------------------------------------------------------

    def _lower(self, n, spelling, args, kwargs, fx_nodes, module=None) -> bool:
        """Lower `n` (with `spelling`, or a (handler, bound args) pair) and commit it; True on
        success. An in-place op the plan left here writes a value only it reads, and becomes
        its pure form; one that has none raises `_Unlowered` (its storage is then pinned)."""
        mutating = nodes.mutating(n, module)
        try:
            if spelling is None:
                raise Unmapped("no spelling")
            handler, bound = (
                spelling
                if isinstance(spelling, tuple)
                else (spelling.lower, spelling.params.bind(args, kwargs))
            )
            if bound.get("inplace") is True and not mutating:  # F.relu(x, True)
                raise _Unlowered(n)
            lo = Lowering(self, n, module)
            handler(lo, bound)
            self._commit(lo, n, fx_nodes, pure_only=mutating)
            return True
        except (Unmapped, TypeError, ValueError):  # TypeError: a symbolic value where a literal
            # is needed (e.g. float(eps) of a SymFloat node); the node stays as it is
            if mutating:
                raise _Unlowered(n) from None
            return False

    def _commit(self, lo: Lowering, n: fx.Node, fx_nodes, pure_only: bool = False) -> None:
        needed = {a for f in fx_nodes for a in f.all_input_nodes} - set(fx_nodes)
        sizes = {a for a in needed - set(lo.reads) if _symbolic_size(a)}
        if not lo.pieces or not needed - sizes <= set(lo.reads):
            raise Unmapped("an argument is not a tensor input")
        # a size read from the symbolic types: export writes the canonical form, which reads
        # sizes itself, never a copy of the source node (its size inputs may be gone)
        pure_only = pure_only or bool(sizes)
        op, ins, attrs, tmp = lo.pieces[-1]
        want, got = self.type_of_node(n), self.values[tmp].type
        if want.dtype == 0 or (got.static and want.static and got != want):
            raise Unmapped(f"{op}: inferred {got}, torch says {want}")
        group = len(self.groups)
        names = []
        reads = tuple(lo.reads.items())
        for i, (op, ins, attrs, out) in enumerate(lo.pieces):
            head = i == len(lo.pieces) - 1
            out = self.vid_of[n] if head else out
            names.append(self.values[out].name)
            origin = Origin(tuple(fx_nodes) if head else (), ins, reads, group, head)
            if ins and ins[0] >= 0:
                key = (op, self.values[ins[0]].name)
                self.readers[key] = (*self.readers.get(key, ()), n.name)
            name = self.values[out].name
            self.nodes.append(Node(op, ins, (out,), attrs, False, name, "", origin))
        self.groups[group] = tuple(names)
        if pure_only:  # export writes the canonical form, never the source nodes
            self.pure_only.add(group)
        self.canonical[n] = op

    def _opaque(self, n: fx.Node) -> None:
        ins = tuple(self.vid_of[a] for a in n.all_input_nodes)
        origin = Origin((n,), ins, tuple(zip(n.all_input_nodes, ins)), len(self.groups), True)
        self.groups[origin.group] = (n.name,)
        implicit = ()
        if n in self.order.chain:  # after the previous chained node, whatever the data flow
            implicit = () if self.last_in_order is None else (self.last_in_order,)
            self.last_in_order = self.vid_of[n]
        self.nodes.append(
            Node(_label(n), ins, (self.vid_of[n],), (), True, n.name, "fx", origin, implicit)
        )
        effectful = n.op == "call_function" and n.is_impure(impure_random=False)
        if not n.users and n.op != "get_attr" and (effectful or n in self.order.chain):
            self.sinks.append(self.vid_of[n])


def _key(n: fx.Node):
    """The spelling table's key of a call node: its target, or "method:<name>"."""
    return f"method:{n.target}" if n.op == "call_method" else n.target


def _symbolic_size(n: fx.Node) -> bool:
    """Does `n` compute a size (a SymInt) rather than a tensor? Lowerings that meet one read
    the size from the symbolic types instead (see `spellings.reshape`)."""
    return isinstance(n.meta.get("val", n.meta.get("example_value")), torch.SymInt)


def _label(n: fx.Node) -> str:
    if n.op == "call_method":
        return f"fx.{n.target}"
    if n.op == "call_function":
        return f"fx.{getattr(n.target, '__name__', str(n.target))}"
    return f"fx.{n.op}"


def _array_type(a: np.ndarray) -> TensorType:
    return TensorType(onnx_dtype(a.dtype), tuple(int(d) for d in a.shape))
