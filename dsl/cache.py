"""An on-disk cache of checked rule files: `load_rules` without parsing and checking again.

Parsing and checking the shipped library (22 files, 329 rules) takes about 0.5 s, a tenth of
quantizing BERT-base; every `rewrite` command and every `optimize_model` call of a new process
pays it for the same files. An entry is the checked `RuleSet` and the op declarations its
files made (`vocab.declared.Declaration`), pickled under a SHA-256 key of:

* the files' labels and text, in order;
* the source of what checking reads: the DSL (`dsl/*.py`, `dsl/grammar.lark`) and the op
  table, guards, builders and bounds (`vocab/*.py`); the names registered in the guard,
  builder and bound registries (a plugin may add some); the versions of Python, onnx and
  onnxruntime (the op table is read from their operator schemas).

An entry also holds the ops other files had declared in the process that checked it (a
file may check only because of them): it is a hit only where those are declared alike. A
hit registers the declarations again (`vocab.declared.declare`, which does nothing for one
already made) and returns the rules. An entry is read only from a directory and file of this
user that nobody else may write (unpickling runs code). Anything that fails (an unreadable or
stale entry, a declaration that clashes with one made differently in this process, a
directory that cannot be written) is a miss, and the files are parsed and checked as usual,
with their errors reported as usual: only rule sets that checked without error are stored.

Entries live in `$REWRITE_CACHE_DIR`, else `$XDG_CACHE_HOME/rewrite/rules`, else
`~/.cache/rewrite/rules`; `REWRITE_CACHE_DIR=off` turns the cache off. `STATS` counts hits,
misses and stores in this process.
"""

from __future__ import annotations

import hashlib
import os
import pickle
import stat
import sys
import tempfile
from collections.abc import Callable
from functools import cache
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from dsl.ir import RuleSet
from vocab.declared import DECLARED, Declaration, declare
from vocab.registry import BOUNDS, BUILDERS, GUARDS

STATS = {"hits": 0, "misses": 0, "stores": 0}
_ROOT = Path(__file__).resolve().parent.parent


def cache_dir() -> Path | None:
    """Where entries live (see the module doc), or None when the cache is off."""
    given = os.environ.get("REWRITE_CACHE_DIR")
    if given is not None:
        return None if given.strip().lower() in ("", "off", "0", "none") else Path(given)
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "rewrite" / "rules"


@cache
def _sources() -> bytes:
    """SHA-256 of the code whose change can change a checked rule (per process)."""
    h = hashlib.sha256(sys.version.encode())
    for dist in ("onnx", "onnxruntime"):
        try:
            h.update(f"{dist}=={version(dist)}".encode())
        except PackageNotFoundError:
            h.update(f"{dist} absent".encode())
    for folder, pattern in (("dsl", "*.py"), ("dsl", "*.lark"), ("vocab", "*.py")):
        for p in sorted((_ROOT / folder).rglob(pattern)):
            h.update(str(p.relative_to(_ROOT)).encode())
            h.update(p.read_bytes())
    return h.digest()


def key(texts: list[tuple[str, str]]) -> str:
    """The key of rule files given as (label, text) pairs, in order (see the module doc)."""
    h = hashlib.sha256(_sources())
    for registry in (GUARDS, BUILDERS, BOUNDS):
        h.update("\0".join(sorted(registry)).encode() + b"\1")
    for label, text in texts:
        h.update(f"\0{label}\0{len(text)}\0".encode())
        h.update(text.encode())
    return h.hexdigest()


def cached_rules(
    texts: list[tuple[str, str]], load: Callable[[], tuple[RuleSet, list[Declaration]]]
) -> RuleSet:
    """The RuleSet of rule files given as (label, text) pairs: from the cache when an entry
    for them exists, else `load()` (which parses and checks them and returns the rules and the
    declarations it made), stored for next time. `load`'s errors propagate unchanged."""
    folder = cache_dir()
    path = None if folder is None else folder / f"{key(texts)}.pkl"
    if path is not None:
        hit = _read(path)
        if hit is not None:
            STATS["hits"] += 1
            return hit
    STATS["misses"] += 1
    before = dict(DECLARED)
    rules, declarations = load()
    if path is not None:
        made = {d.spec.qualname for d in declarations}
        outside = {name: d for name, d in before.items() if name not in made}
        _write(path, (rules, declarations, outside))
    return rules


def _read(path: Path) -> RuleSet | None:
    """The entry at `path`, its declarations made; None (a miss) when there is none, it was
    not written by this user or others may write it (unpickling runs code), or it cannot be
    read or replayed (a clash is then reported by checking the files)."""
    try:
        if not (_private(path.parent) and _private(path)):
            return None
        with open(path, "rb") as f:
            rules, declarations, outside = pickle.load(f)
        if not isinstance(rules, RuleSet):
            return None
        if any(DECLARED.get(name) != d for name, d in outside.items()):
            return None  # checked beside ops declared elsewhere, which this process lacks
        for d in declarations:
            declare(d)
    except Exception:  # any broken or stale entry is a miss
        return None
    return rules


def _private(path: Path) -> bool:
    """Whether `path` belongs to this user and nobody else may write to it."""
    st = path.stat()
    return st.st_uid == os.getuid() and not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)


def _write(path: Path, entry: tuple) -> None:
    """Write `entry` to `path` atomically (a temporary file renamed into place); a failure
    leaves no entry and raises nothing."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".pkl")
        try:
            with os.fdopen(fd, "wb") as f:
                pickle.dump(entry, f, protocol=pickle.HIGHEST_PROTOCOL)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    except (OSError, pickle.PicklingError, TypeError, AttributeError, RecursionError):
        return  # (RecursionError: a rule nested hundreds deep, deeper than pickle recurses)
    STATS["stores"] += 1
