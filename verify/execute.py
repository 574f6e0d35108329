"""The executors both sides of a rule run on, and what they cannot run.

- `onnxruntime`: CPU, graph optimizations disabled (its own fusions would hide ours).
- `onnx.reference`: the ONNX reference implementation (numpy), an independent code base.

A rule is wrong when its two sides disagree on every executor that ran both; when only one
executor disagrees, the executor is suspect (see `verify.check`).

onnxruntime has no kernel for some (op, dtype) pairs that ONNX allows (Gemm on int64, ...).
Each such error is recorded in `NO_KERNEL` with its message, the example is compared on the
other executor only, and the skip is reported. Only onnxruntime's "no implementation" errors
count: any other failure is an error, never a skip.

Integer division by zero is undefined in ONNX and kills onnxruntime (SIGFPE), so a model is
scanned with the reference's intermediate values before onnxruntime sees it (`hazard`).
"""

from __future__ import annotations

import re
import warnings
from collections import OrderedDict

import numpy as np
import onnx
import onnx.inliner
import onnx.numpy_helper
import onnxruntime as ort
from onnx.reference import ReferenceEvaluator

from engine.runtime import cpu_session
from verify.dtypes import slot_types

ort.set_default_logger_severity(4)

NO_KERNEL: dict[tuple[str, str, int], str] = {}  # (op, type param, dtype) -> onnxruntime's message
_NO_KERNEL_RE = re.compile(
    r"(?:Could not find an implementation|Failed to find kernel) for (\w+)\(\d+\)"
)
_SESSIONS: OrderedDict[bytes, ort.InferenceSession] = OrderedDict()
_EVALUATORS: OrderedDict[bytes, ReferenceEvaluator] = OrderedDict()  # the same, for onnx.reference
_MAX_SESSIONS = 256
_RUN_OPTIONS = ort.RunOptions()
_RUN_OPTIONS.log_severity_level = 4  # failures are reported by the verifier, not logged


_NO_FEED = frozenset({"int4", "uint4"})  # numpy dtypes onnxruntime's Python API cannot feed


class ExecError(Exception):
    """An executor could not run a model. kind: `no-kernel` or `error`."""

    def __init__(self, executor: str, kind: str, message: str):
        super().__init__(f"{executor}: {message}")
        self.executor, self.kind, self.message = executor, kind, message


def run_ort(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    """Outputs of `model` under onnxruntime (sessions cached by model bytes). Raises
    ExecError; a missing kernel is recorded in NO_KERNEL for every input dtype of the op."""
    key = model.SerializeToString()
    names = {i.name for i in model.graph.input}
    feeds = {k: v for k, v in feeds.items() if k in names}
    four_bit = sorted({v.dtype.name for v in feeds.values() if v.dtype.name in _NO_FEED})
    if four_bit:  # its Python API has no conversion: "Numpy_type 272 can't be converted"
        raise ExecError("onnxruntime", "no-kernel", f"takes no {four_bit[0]} input from Python")
    try:
        sess = _SESSIONS.get(key)
        if sess is None:
            sess = cpu_session(key, threads=1)
            _SESSIONS[key] = sess
            if len(_SESSIONS) > _MAX_SESSIONS:
                _SESSIONS.popitem(last=False)
        return [np.asarray(o) for o in sess.run(None, feeds, _RUN_OPTIONS)]
    except Exception as e:  # onnxruntime raises its own exception types
        msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        found = _NO_KERNEL_RE.search(msg)
        if found:
            for key in _kernel_keys(model, found[1]):
                NO_KERNEL.setdefault(key, msg)
            raise ExecError("onnxruntime", "no-kernel", msg) from None
        raise ExecError("onnxruntime", "error", msg) from None


def run_reference(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> tuple[list, dict]:
    """(outputs, every intermediate value by name) of `model` under `onnx.reference`
    (evaluators cached by model bytes, like onnxruntime's sessions). Raises ExecError."""
    try:
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # NaN from empty means etc. is what ONNX specifies
            key = model.SerializeToString()
            evaluator = _EVALUATORS.get(key)
            if evaluator is None:
                evaluator = _EVALUATORS[key] = ReferenceEvaluator(_inlined(model))
                if len(_EVALUATORS) > _MAX_SESSIONS:
                    _EVALUATORS.popitem(last=False)
            values = evaluator.run(None, feeds, intermediate=True)
    except Exception as e:  # the reference raises numpy and its own errors
        msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ExecError("onnx.reference", "error", f"{type(e).__name__}: {msg}") from None
    return [np.asarray(values[o.name]) for o in model.graph.output], values


def _inlined(model: onnx.ModelProto) -> onnx.ModelProto:
    """`model` with its model-local functions (the bodies of declared ops, `vocab.declared`)
    inlined: onnx.reference (onnx 1.23) fails on a function node whose attribute refers to the
    function's (`ref_attr_name`: "unexpected keyword argument 'linked_attributes'")."""
    return onnx.inliner.inline_local_functions(model) if model.functions else model


def hazard(model: onnx.ModelProto, values: dict) -> str | None:
    """Why `model` is undefined on these values (an integer Div or Mod by zero, INT_MIN / -1,
    an integer mean of nothing), or None. `values` are the reference's intermediate values."""
    for n in model.graph.node:
        data = values.get(n.input[0]) if n.input else None
        if (
            n.op_type == "ReduceMean"
            and data is not None
            and _int(data)
            and np.asarray(data).size == 0
        ):
            return "integer ReduceMean of no elements (a division by zero)"
        if n.op_type not in ("Div", "Mod") or len(n.input) < 2:
            continue
        a, b = values.get(n.input[0]), values.get(n.input[1])
        if a is None or b is None or not np.issubdtype(np.asarray(b).dtype, np.integer):
            continue
        a, b = np.broadcast_arrays(np.asarray(a), np.asarray(b))
        if np.any(b == 0):
            return f"integer {n.op_type} by zero"
        if np.issubdtype(a.dtype, np.signedinteger) and np.any(
            (a == np.iinfo(a.dtype).min) & (b == -1)
        ):
            return f"integer {n.op_type} overflow (INT_MIN / -1)"
    return None


def is_random(model: onnx.ModelProto) -> bool:
    """True if two runs of `model` may differ: a Dropout whose training_mode input is not a
    constant false (it then drops at random; ONNX Dropout-13)."""
    inits = {i.name: i for i in model.graph.initializer}
    for n in model.graph.node:
        if n.op_type == "Dropout" and len(n.input) > 2 and n.input[2]:
            init = inits.get(n.input[2])
            if init is None or onnx.numpy_helper.to_array(init).any():
                return True
    return False


def _int(a) -> bool:
    return np.issubdtype(np.asarray(a).dtype, np.integer)


def _kernel_keys(model: onnx.ModelProto, op: str) -> set[tuple[str, str, int]]:
    """(op, type param, dtype) of the inputs of `op` nodes in `model` whose schema type
    parameter allows more than one dtype (a parameter with one choice is not the culprit)."""
    opset = next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))
    ins, _ = slot_types(op, opset)
    inferred = onnx.shape_inference.infer_shapes(model)
    types = {
        v.name: v.type.tensor_type.elem_type
        for v in [*inferred.graph.input, *inferred.graph.value_info, *inferred.graph.output]
    }
    types.update({i.name: i.data_type for i in model.graph.initializer})
    keys = set()
    for n in model.graph.node:
        for i, name in enumerate(n.input) if n.op_type == op else ():
            param, allowed = ins[min(i, len(ins) - 1)]
            if name and param and len(allowed) > 1 and types.get(name):
                keys.add((op, param, types[name]))
    return keys
