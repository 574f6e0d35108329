"""An on-disk cache of the torch.compile backend's rewrites, beside inductor's own caches.

A warm-cache first call of `torch.compile(model, backend="rewrite")` (a script run again)
finds inductor's compiled kernels on disk; without this cache it would still import,
saturate and extract the captured graph again. The key (`key`) is a SHA-256 of:

* the captured graph's code and each placeholder's example value: shape, stride, dtype,
  device, requires_grad, and with `freeze` (or for a get_attr tensor) its bytes, since frozen
  values are folded into the result;
* the backend's options, the shipped rules' text (`patterns/*.rules`) and the source of the
  engine and the fx frontend (`rewrite/`, `dsl/`, `frontends/fx/`), and torch's version.

The entry is the rewritten GraphModule pickled with every tensor it shares with the captured
graph (its get_attr tensors, the example inputs) stored as a reference to it, so only the
tensors the rewrite made (folded constants) are written. Loading it rebinds the references to
the tensors of the graph being compiled. Entries live in `<inductor cache dir>/rewrite/`
(`torch._inductor.runtime.cache_dir_utils.cache_dir()`, `TORCHINDUCTOR_CACHE_DIR`).
Anything that fails (a graph that does not pickle, an unreadable entry) is a miss, never an
error. `STATS` counts hits, misses and stores in this process.
"""

from __future__ import annotations

import hashlib
import io
import os
import pickle
from functools import cache
from pathlib import Path

import torch

STATS = {"hits": 0, "misses": 0, "stores": 0}
ROOT = Path(__file__).resolve().parents[2]


def cache_dir() -> Path:
    """`<inductor cache dir>/rewrite`."""
    from torch._inductor.runtime.cache_dir_utils import cache_dir as inductor_dir

    return Path(inductor_dir()) / "rewrite"


@cache
def _sources() -> str:
    """SHA-256 of the rules and the sources whose change can change a rewrite (per process)."""
    h = hashlib.sha256(torch.__version__.encode())
    for folder, pattern in (
        ("patterns", "*.rules"),
        ("vocab", "*.py"),
        ("engine", "*.py"),
        ("rewrite", "*.py"),
        ("dsl", "*.py"),
        ("frontends/fx", "*.py"),
    ):
        for p in sorted((ROOT / folder).rglob(pattern)):
            h.update(str(p.relative_to(ROOT)).encode())
            h.update(p.read_bytes())
    return h.hexdigest()


def _tensor_bytes(t: torch.Tensor) -> memoryview:
    t = t.detach().contiguous().cpu()
    return memoryview(t.view(torch.uint8).numpy() if t.numel() else b"")


def key(gm: torch.fx.GraphModule, example_inputs, options: dict, freeze: bool) -> str | None:
    """The cache key of a compile (see the module doc), or None when the graph cannot be keyed
    (an example input that is not a plain tensor or an int, e.g. symbolic sizes)."""
    from torch._subclasses.fake_tensor import FakeTensor

    h = hashlib.sha256(_sources().encode())
    h.update(repr(sorted(options.items())).encode())
    h.update(f"freeze={freeze}".encode())
    h.update(gm.code.encode())
    for x in example_inputs:
        if isinstance(x, bool | int | float):
            h.update(repr(x).encode())
            continue
        if not isinstance(x, torch.Tensor) or isinstance(x, FakeTensor):
            return None
        if any(isinstance(d, torch.SymInt) for d in (*x.shape, *x.stride())):
            return None
        h.update(repr((tuple(x.shape), x.stride(), x.dtype, x.device, x.requires_grad)).encode())
        if freeze:
            h.update(_tensor_bytes(x))
    for n in gm.graph.nodes:
        if n.op == "get_attr":
            obj = gm
            for part in n.target.split("."):
                obj = getattr(obj, part, None)
            if isinstance(obj, torch.Tensor):
                h.update(n.target.encode())
                h.update(repr((tuple(obj.shape), obj.dtype)).encode())
                h.update(_tensor_bytes(obj))
    return h.hexdigest()


def _known(gm: torch.fx.GraphModule, example_inputs) -> dict[int, str]:
    """id of each tensor the captured graph holds or is given -> its reference."""
    known = {id(x): f"input:{i}" for i, x in enumerate(example_inputs)}
    for name, t in [*gm.named_parameters(), *gm.named_buffers()]:
        known.setdefault(id(t), f"attr:{name}")
    for name, t in gm.__dict__.items():
        if isinstance(t, torch.Tensor):
            known.setdefault(id(t), f"attr:{name}")
    return known


class _Pickler(pickle.Pickler):
    def __init__(self, f, known: dict[int, str]):
        super().__init__(f, protocol=pickle.HIGHEST_PROTOCOL)
        self.known = known

    def persistent_id(self, obj):
        return self.known.get(id(obj)) if isinstance(obj, torch.Tensor) else None


class _Unpickler(pickle.Unpickler):
    def __init__(self, f, gm: torch.fx.GraphModule, example_inputs):
        super().__init__(f)
        self.gm, self.example_inputs = gm, example_inputs

    def persistent_load(self, pid):
        kind, _, rest = pid.partition(":")
        if kind == "input":
            return self.example_inputs[int(rest)]
        obj = self.gm
        for part in rest.split("."):
            obj = getattr(obj, part)
        return obj


def load(
    k: str, gm: torch.fx.GraphModule, example_inputs, count: bool = True
) -> torch.fx.GraphModule | None:
    """The cached rewrite of key `k` with its references bound to `gm`'s tensors and
    `example_inputs`, or None (counted as a miss; `count=False` counts neither)."""
    p = cache_dir() / f"{k}.pkl"
    try:
        with open(p, "rb") as f:
            out = _Unpickler(f, gm, example_inputs).load()
    except Exception:  # missing, truncated or stale: recompute
        STATS["misses"] += count
        return None
    if not isinstance(out, torch.fx.GraphModule):
        STATS["misses"] += count
        return None
    STATS["hits"] += count
    return out


def store(k: str, result: torch.fx.GraphModule, gm: torch.fx.GraphModule, example_inputs) -> bool:
    """Write the rewrite `result` of `gm` under key `k` (atomically: a temporary file renamed
    into place); whether it was written. A result that does not pickle is not cached."""
    buf = io.BytesIO()
    try:
        _Pickler(buf, _known(gm, example_inputs)).dump(result)
    except Exception:  # e.g. a target pickle cannot name: compile without caching
        return False
    d = cache_dir()
    try:
        d.mkdir(parents=True, exist_ok=True)
        tmp = d / f".{k}.{os.getpid()}.tmp"
        tmp.write_bytes(buf.getvalue())
        os.replace(tmp, d / f"{k}.pkl")
    except OSError:
        return False
    STATS["stores"] += 1
    return True
