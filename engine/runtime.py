"""onnxruntime CPU sessions, made one way for the whole package: constant folding
(engine/fold.py), the output check and calibration (frontends/onnx/check.py, quantize.py) and
the rule verifier's onnxruntime executor (verify/execute.py, conformance.py) all run models
through `cpu_session`."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort


def cpu_session(
    model: onnx.ModelProto | bytes | str,
    *,
    optimized: bool = False,
    threads: int | None = None,
    arrays: dict[str, np.ndarray] | None = None,
    log_severity: int = 4,
) -> ort.InferenceSession:
    """An onnxruntime session on the CPU execution provider of `model` (a ModelProto, its
    serialized bytes, or a file path: the cheapest, nothing is serialized in Python).

    optimized: onnxruntime's graph optimizations at its default, ORT_ENABLE_ALL, as a user
    runs the model; False (the default) turns them off, so the nodes run as written (what
    constant folding and per-node verification need). threads: intra-op threads (None:
    onnxruntime's default, one per core). arrays: initializers the model holds as external
    data in memory, by name; onnxruntime copies them in before any graph optimization
    (`SessionOptions.add_external_initializers`), and they must live until this returns.
    log_severity: onnxruntime's log level (4: fatal only; 3: errors too).

    Raises what onnxruntime raises for a model it cannot load (its own exception types)."""
    opts = ort.SessionOptions()
    if not optimized:
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    opts.log_severity_level = log_severity
    if threads is not None:
        opts.intra_op_num_threads = threads
    if arrays:
        values = [
            ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(a)) for a in arrays.values()
        ]
        opts.add_external_initializers(list(arrays), values)
    src = model.SerializeToString() if isinstance(model, onnx.ModelProto) else model
    return ort.InferenceSession(src, opts, providers=["CPUExecutionProvider"])
