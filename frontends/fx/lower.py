"""Lowering one fx node to canonical ops: argument binding and the context handlers write to.

A spelling (see `frontends.fx.spellings`) is a parameter list plus a handler. `Params` binds a
node's args and kwargs to names (`"input|self other alpha=1"`: aliases after `|`, defaults
after `=`, `*name` collects the remaining positional arguments); the handler reads them and
calls `Lowering.emit` once per canonical node. The last node emitted writes the fx node's own
value. A handler that meets anything it cannot express exactly raises `Unmapped`, and the fx
node becomes opaque instead.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import fx

from engine.infer import infer_type
from frontends.fx.tensors import FLOATS, onnx_elem, scalar_array, torch_dtype, type_of
from vocab.graph import ABSENT
from vocab.ops import NONE, OPS, REQUIRED
from vocab.types import TensorType

_MISSING = object()


class Unmapped(Exception):
    """The node has no exact canonical form; it is imported as an opaque node."""


@dataclass(frozen=True)
class Param:
    """One parameter of a `Params` list: its names, its default (`_MISSING` if required), and
    whether it collects the remaining positional arguments."""

    names: tuple[str, ...]  # canonical name first, then aliases
    default: Any = _MISSING
    rest: bool = False  # `*name`: every remaining positional argument, as a tuple


class Params:
    """A parameter list parsed from its spelling, e.g. `"input|self dim keepdim=False"`."""

    def __init__(self, text: str):
        self.params: list[Param] = []
        for word in text.split():
            rest = word.startswith("*")
            word = word.lstrip("*")
            names, _, default = word.partition("=")
            value = ast.literal_eval(default) if default else (() if rest else _MISSING)
            self.params.append(Param(tuple(names.split("|")), value, rest))
        self.by_alias = {a: p for p in self.params for a in p.names}

    def bind(self, args: tuple, kwargs: dict) -> dict[str, Any]:
        """name -> value for every parameter. Raises Unmapped on an unknown keyword, a missing
        required argument or too many positional ones."""
        out: dict[str, Any] = {}
        i = 0
        for p in self.params:
            if p.rest:
                out[p.names[0]] = tuple(args[i:])
                i = len(args)
            elif i < len(args):
                out[p.names[0]] = args[i]
                i += 1
        if i < len(args):
            raise Unmapped(f"{len(args)} positional arguments")
        for k, v in kwargs.items():
            p = self.by_alias.get(k)
            if p is None or p.names[0] in out:
                raise Unmapped(f"keyword {k}")
            out[p.names[0]] = v
        for p in self.params:
            if p.names[0] not in out:
                if p.default is _MISSING:
                    raise Unmapped(f"missing {p.names[0]}")
                out[p.names[0]] = p.default
        return out


def canonical_attrs(op: str, given: dict[str, Any]) -> tuple[tuple[str, Any], ...]:
    """All attributes of `op` in op-table order, defaults filled in (None for NONE)."""
    spec = OPS.get(op)
    unknown = set(given) - set(spec.attr_index)
    if unknown:
        raise ValueError(f"{op} has no attribute {sorted(unknown)}")
    out = []
    for a in spec.attrs:
        v = given.get(a.name, a.default)
        if v is REQUIRED:
            raise ValueError(f"{op} needs attribute {a.name}")
        out.append((a.name, None if v is NONE else v))
    return tuple(out)


@dataclass(frozen=True, eq=False)
class Attr:
    """A tensor attribute of the called module (call_module nodes), e.g. a Conv2d's weight."""

    name: str
    tensor: torch.Tensor


class Lowering:
    """What a handler sees of one fx node and how it emits canonical nodes.

    imp: the importer (value ids, types, constants). node: the fx node. module: the called
    nn.Module for call_module nodes. Pieces and constants are staged and only committed by the
    importer when the handler finishes without `Unmapped`.
    """

    def __init__(self, imp, node: fx.Node, module: torch.nn.Module | None = None):
        self.imp, self.node, self.module = imp, node, module
        self.pieces: list[tuple[str, tuple[int, ...], tuple, int]] = []  # op, inputs, attrs, out
        self.reads: dict[fx.Node, int] = {}  # fx node argument -> its value id
        self.out = imp.type_of_node(node)

    # ---- reading the fx node ---------------------------------------------------------------

    def type(self, x) -> TensorType | None:
        """Type of a tensor argument (fx node or module attribute); None for anything else."""
        if isinstance(x, fx.Node):
            return self.imp.type_of_node(x)
        return type_of(x.tensor) if isinstance(x, Attr) else None

    def dtype(self, x) -> torch.dtype | None:
        """torch dtype of a tensor argument (None when unknown or not a tensor)."""
        t = self.type(x)
        return torch_dtype(t.dtype) if t is not None and t.dtype else None

    @property
    def out_dtype(self) -> torch.dtype:
        """torch dtype of the node's output; Unmapped if it is unknown."""
        if not self.out.dtype:
            raise Unmapped("unknown output dtype")
        return torch_dtype(self.out.dtype)

    def rank(self, x) -> int:
        """Rank of a tensor argument; Unmapped if it is unknown or `x` is not a tensor."""
        t = self.type(x)
        if t is None or t.rank is None:
            raise Unmapped("unknown rank")
        return t.rank

    def shape(self, x) -> tuple[int, ...]:
        """The static shape of a tensor argument; Unmapped if any dimension is symbolic."""
        t = self.type(x)
        if t is None or not t.static:
            raise Unmapped("shape not static")
        return t.shape

    def out_shape(self) -> tuple[int, ...]:
        """The node's static output shape; Unmapped if any dimension is symbolic or unknown."""
        if not self.out.static:
            raise Unmapped("output shape not static")
        return self.out.shape

    # ---- making inputs ---------------------------------------------------------------------

    def tensor(self, x) -> int:
        """Value id of a tensor argument (an fx node with a known tensor type, or an Attr)."""
        if isinstance(x, Attr):
            return self.imp.attr_constant(f"{self.node.target}.{x.name}", x.tensor)
        if not isinstance(x, fx.Node) or not self.imp.type_of_node(x).dtype:
            raise Unmapped("not a tensor argument")
        self.reads[x] = self.imp.vid_of[x]
        return self.reads[x]

    def optional(self, x) -> int:
        """ABSENT for None, else `tensor(x)`."""
        return ABSENT if x is None else self.tensor(x)

    def operand(self, x, dtype: torch.dtype) -> int:
        """A tensor argument, or a Python number as a 0-d constant of `dtype`."""
        if isinstance(x, fx.Node):
            return self.tensor(x)
        if isinstance(x, bool) or not isinstance(x, (int, float)):
            if not (isinstance(x, bool) and dtype == torch.bool):
                raise Unmapped(f"operand {x!r}")
        if dtype not in FLOATS and isinstance(x, float):
            raise Unmapped("float scalar with an integer tensor")
        return self.constant(scalar_array(x, dtype))

    def ints(self, values, dtype=np.int64) -> int:
        """A 1-D int64 constant from a list of Python ints (never fx nodes)."""
        values = tuple(values)
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
            raise Unmapped("non-constant int list")
        return self.constant(np.asarray(values, dtype=dtype).reshape(len(values)))

    def constant(self, array: np.ndarray) -> int:
        """Value id of a new constant holding `array`, imported for this node."""
        return self.imp.value_constant(array, self.node)

    def transposed(self, w) -> int:
        """A 2-D weight transposed: a constant when w is one (export refers back to w itself),
        else a Transpose node."""
        if isinstance(w, Attr):
            return self.imp.attr_constant(f"{self.node.target}.{w.name}", w.tensor, transposed=True)
        vid = self.tensor(w)
        if vid in self.imp.constants:
            return self.imp.transposed_constant(vid)
        return self.emit("Transpose", [vid], {"perm": (1, 0)})

    # ---- emitting --------------------------------------------------------------------------

    def emit(self, op: str, inputs, attrs: dict | None = None) -> int:
        """Stage one canonical node; returns the id of its output value.

        inputs: value ids (ABSENT for absent optional inputs; missing trailing ones are padded).
        attrs: attribute values by name; the op table's defaults fill in the rest.
        """
        spec = OPS.get(op, self.imp.opset)
        if spec is None or len(inputs) > spec.arity or len(inputs) < spec.n_required:
            raise Unmapped(f"{op} arity")
        ins = tuple(inputs) + (ABSENT,) * (spec.arity - len(inputs))
        canon = canonical_attrs(op, attrs or {})
        name = f"{self.node.name}_{op.lower().replace('#', '_')}"  # Split#1: split_1
        vid = self.imp.new_value(name, self._infer(op, canon, ins))
        self.pieces.append((op, ins, canon, vid))
        return vid

    def _infer(self, op: str, attrs, ins) -> TensorType:
        types = tuple(None if i == ABSENT else self.imp.values[i].type for i in ins)
        vals = tuple(None if i == ABSENT else self.imp.constants.get(i) for i in ins)
        return infer_type(op, attrs, types, vals)


def elem(dtype: torch.dtype) -> int:
    """ONNX element type of a torch dtype; Unmapped when ONNX has none."""
    e = onnx_elem(dtype)
    if not e:
        raise Unmapped(f"dtype {dtype}")
    return e
