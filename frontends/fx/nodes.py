"""What the fx importer needs to know about nodes beyond their target.

Types and devices (from `val` / `example_value` / `tensor_meta` metadata, or a run on example
inputs), whether a node mutates an input in place, and which placeholders torch.compile lifted
from module state. What follows from effects for the order of nodes is `frontends.fx.effects`.
"""

from __future__ import annotations

import contextlib
import operator
from typing import Any

import numpy as np
import torch
from torch import fx

from frontends.fx.tensors import onnx_elem, to_numpy, type_of
from vocab.types import TensorType

MAX_CREATED = 1 << 16  # elements of a creator call (arange, zeros) evaluated at import
INPLACE_OPERATORS = {
    "iadd",
    "isub",
    "imul",
    "itruediv",
    "ifloordiv",
    "imod",
    "ipow",
    "iand",
    "ior",
    "ixor",
    "ilshift",
    "irshift",
    "imatmul",
    "iconcat",
    "setitem",
    "delitem",
}


class FxImportError(ValueError):
    """The graph cannot be rewritten safely (see `frontends.fx.importer`); says why."""


def is_state(n: fx.Node, value: torch.Tensor) -> bool:
    """Is placeholder `n` a module parameter or buffer that torch.compile lifted to an input?
    Dynamo's GraphArg source says so while the backend runs; afterwards its naming scheme
    (`L_self_modules_conv_parameters_weight_`) or the Parameter type does."""
    source = getattr(getattr(n.meta.get("grapharg"), "source", None), "name", "")
    if "._parameters[" in source or "._buffers[" in source:
        return True
    name = str(n.target)
    return isinstance(value, torch.nn.Parameter) or (
        name.startswith("L_") and ("_parameters_" in name or "_buffers_" in name)
    )


def mutating(n: fx.Node, module) -> bool:
    """True for in-place ops: `x.add_()`, `operator.iadd`, `inplace=True`, mutable ATen ops."""
    if module is not None:
        return bool(getattr(module, "inplace", False))
    if n.kwargs.get("inplace") is True or "out" in n.kwargs:
        return True
    t = n.target
    if isinstance(t, torch._ops.OpOverload):
        return t._schema.is_mutable
    if getattr(t, "__module__", None) in ("_operator", "operator"):
        return t.__name__ in INPLACE_OPERATORS
    name = t if isinstance(t, str) else getattr(t, "__name__", "")
    return (name.endswith("_") and not name.endswith("__")) or name.startswith("__i")


def read_by_items(n: fx.Node) -> bool:
    """True when a node returning a tuple or list (split, native batch norm, ...) is used, and
    only through `getitem(n, k)` with a Python int k."""
    users = list(n.users)
    return bool(users) and all(
        u.target is operator.getitem and type(u.args[1]) is int for u in users
    )


def evaluate(n: fx.Node) -> np.ndarray | None:
    """The value of a creator call without node inputs (arange, zeros, ...), if it is small."""
    try:
        value = n.target(*n.args, **n.kwargs)
    except Exception:  # an argument only the real run knows (e.g. a symbolic size)
        return None
    if not isinstance(value, torch.Tensor) or value.numel() > MAX_CREATED:
        return None
    return to_numpy(value)


def is_fake(t: torch.Tensor) -> bool:
    """A fake or meta tensor: it has a shape and dtype but no values."""
    return isinstance(t, torch._subclasses.FakeTensor) or t.device.type == "meta"


def node_info(gm: fx.GraphModule, program, inputs) -> dict[fx.Node, tuple[TensorType, Any]]:
    """fx node -> (type, device), from metadata or, if a node has none, from a run."""
    info = {}
    missing = False
    for n in gm.graph.nodes:
        val = n.meta.get("val", n.meta.get("example_value"))
        tm = n.meta.get("tensor_meta")
        if val is None and hasattr(tm, "shape"):
            info[n] = (TensorType(onnx_elem(tm.dtype), tuple(tm.shape)), None)
            continue
        if val is None and n.op not in ("output", "get_attr") and n.users:
            missing = True
        info[n] = (type_of(val), getattr(val, "device", None))
    if (
        missing
        and program is None
        and inputs
        and not any(is_fake(t) for t in inputs if isinstance(t, torch.Tensor))
    ):
        info.update(run(gm, inputs))
    for n in gm.graph.nodes:
        if n.op == "get_attr":
            v = resolve(gm, n.target)
            info[n] = (type_of(v), getattr(v, "device", None))
    return info


def run(gm: fx.GraphModule, inputs) -> dict[fx.Node, tuple[TensorType, Any]]:
    """Types and devices of every node from running `gm` on copies of real example inputs (a
    graph may write into its inputs; the caller's tensors are left alone)."""
    seen = {}
    inputs = [x.clone() if isinstance(x, torch.Tensor) else x for x in inputs]

    class Recorder(fx.Interpreter):
        def run_node(self, n):
            result = super().run_node(n)
            seen[n] = (type_of(result), getattr(result, "device", None))
            return result

    with torch.no_grad(), untouched(gm):
        Recorder(gm).run(*inputs)
    return seen


@contextlib.contextmanager
def untouched(m):
    """Run code on `m` (a module or an ExportedProgram) from a fixed random state (seed 0: a
    Dropout in training mode draws the same mask on each run, the original and the rewritten
    graph alike) and leave no trace on the user's state: the global random state and the
    buffers (BatchNorm's running statistics in training mode) are as they were before."""
    if isinstance(m, torch.export.ExportedProgram):  # persistent ones, then the others
        named = [m.state_dict[n] for n in m.graph_signature.buffers if n in m.state_dict]
        named += [t for t in m.constants.values() if isinstance(t, torch.Tensor)]
    else:
        named = [b for _, b in m.named_buffers()] if m is not None else []
    buffers = [(b, b.clone()) for b in named]
    # every CUDA device's generator too: torch.manual_seed seeds them all
    cuda = list(range(torch.cuda.device_count())) if torch.cuda.is_available() else []
    try:
        with torch.random.fork_rng(devices=cuda):
            torch.manual_seed(0)
            yield
    finally:
        with torch.no_grad():
            for b, saved in buffers:
                b.copy_(saved)


def resolve(gm: torch.nn.Module, target: str):
    """The attribute of `gm` at dotted path `target` (None if missing)."""
    obj = gm
    for part in target.split("."):
        obj = getattr(obj, part, None)
    return obj
