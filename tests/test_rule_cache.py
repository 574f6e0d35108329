"""The on-disk cache of checked rule files (`dsl.cache`): a second `load_rules` of the same
files gives the same rules without parsing them, registers their op declarations in a new
process, and misses on a changed file, a broken entry or a cache turned off."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import dsl
from dsl import cache

ROOT = Path(__file__).resolve().parent.parent

DECLARING = """
(ruleset cached-acme)
(op com.cacheacme.Swish (@x) :cost elementwise
  (Mul @x (Sigmoid @x)))
;; x * sigmoid(x) -> Swish(x)
(simplify mul-sigmoid-to-cached-swish
  (Mul @x (Sigmoid @x))
  (com.cacheacme.Swish @x))
"""


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    folder = tmp_path / "cache"
    monkeypatch.setenv("REWRITE_CACHE_DIR", str(folder))
    monkeypatch.setattr(cache, "STATS", {"hits": 0, "misses": 0, "stores": 0})
    return folder


def test_second_load_of_the_library_is_a_hit_with_the_same_rules(cache_dir):
    first = dsl.load_rules()
    assert cache.STATS == {"hits": 0, "misses": 1, "stores": 1}
    assert len(list(cache_dir.glob("*.pkl"))) == 1
    second = dsl.load_rules()
    assert cache.STATS["hits"] == 1
    assert second == first
    assert len(second.rules) > 300


def test_a_changed_file_misses_and_errors_are_not_cached(cache_dir, tmp_path):
    f = tmp_path / "mine.rules"
    f.write_text(";; relu of relu\n(simplify relu-relu (Relu (Relu @x)) (Relu @x))\n")
    assert dsl.load_rules(f).names() == ["relu-relu"]
    f.write_text(";; the same, renamed\n(simplify sig (Relu (Relu @x)) (Relu @x))\n")
    assert dsl.load_rules(f).names() == ["sig"]
    assert cache.STATS == {"hits": 0, "misses": 2, "stores": 2}
    f.write_text("(simplify bad (Reluu @x) @x)\n")
    with pytest.raises(dsl.UnknownOperatorError):
        dsl.load_rules(f)
    with pytest.raises(dsl.UnknownOperatorError):  # again: checked again, same error
        dsl.load_rules(f)
    assert cache.STATS["stores"] == 2


def test_a_broken_entry_is_a_miss(cache_dir, tmp_path):
    f = tmp_path / "mine.rules"
    f.write_text(";; relu of relu\n(simplify relu-relu (Relu (Relu @x)) (Relu @x))\n")
    want = dsl.load_rules(f)
    (entry,) = cache_dir.glob("*.pkl")
    entry.write_bytes(b"not a pickle")
    assert dsl.load_rules(f) == want
    assert cache.STATS == {"hits": 0, "misses": 2, "stores": 2}
    assert dsl.load_rules(f) == want  # the entry was written again
    assert cache.STATS["hits"] == 1


def test_off_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("REWRITE_CACHE_DIR", "off")
    monkeypatch.setattr(cache, "STATS", {"hits": 0, "misses": 0, "stores": 0})
    assert cache.cache_dir() is None
    dsl.load_rules(dsl.shipped_rules_dir() / "quant" / "rounding.rules")
    assert cache.STATS == {"hits": 0, "misses": 1, "stores": 0}


def test_a_hit_in_a_new_process_declares_the_files_ops(tmp_path):
    """Declarations are process state (the op table): a hit must make them again, or a rule
    over a declared op would meet an op the table does not know."""
    f = tmp_path / "acme.rules"
    f.write_text(DECLARING)
    code = (
        "import sys; import dsl; from dsl import cache; from vocab.ops import OPS; "
        "r = dsl.load_rules(sys.argv[1]); "
        "print(cache.STATS['hits'], r.names(), OPS.get('com.cacheacme.Swish') is not None)"
    )
    env = {"REWRITE_CACHE_DIR": str(tmp_path / "cache"), "PATH": "", "HOME": str(tmp_path)}
    runs = [
        subprocess.run(
            [sys.executable, "-c", code, str(f)],
            capture_output=True,
            text=True,
            cwd=ROOT,
            env=env,
            check=True,
        ).stdout.split(maxsplit=1)
        for _ in range(2)
    ]
    assert [hits for hits, _ in runs] == ["0", "1"]
    assert runs[0][1] == runs[1][1] == "['mul-sigmoid-to-cached-swish'] True\n"


def test_a_file_that_checks_only_after_another_is_not_a_hit_alone(tmp_path):
    """B uses an op A declares: loaded after A in one process it checks; loaded alone in a new
    process it must be checked again (and fail), not come from the cache."""
    a, b = tmp_path / "a.rules", tmp_path / "b.rules"
    a.write_text("(op com.cacheb.Swish (@x) :cost elementwise (Mul @x (Sigmoid @x)))\n")
    b.write_text(";; swish\n(simplify to-swish (Mul @x (Sigmoid @x)) (com.cacheb.Swish @x))\n")
    code = (
        "import sys, dsl\n"
        "for f in sys.argv[1:]:\n"
        "    try:\n"
        "        print(dsl.load_rules(f).names())\n"
        "    except dsl.RulesError as e:\n"
        "        print(type(e).__name__)\n"
    )
    env = {"REWRITE_CACHE_DIR": str(tmp_path / "cache"), "PATH": "", "HOME": str(tmp_path)}

    def python(*files):
        args = [sys.executable, "-c", code, *map(str, files)]
        done = subprocess.run(args, capture_output=True, text=True, cwd=ROOT, env=env, check=True)
        return done.stdout.split("\n")[:-1]

    assert python(a, b) == ["[]", "['to-swish']"]
    assert python(b) == ["UnknownOperatorError"]


def test_an_entry_others_may_write_is_not_read(cache_dir, tmp_path):
    f = tmp_path / "mine.rules"
    f.write_text(";; relu of relu\n(simplify relu-relu (Relu (Relu @x)) (Relu @x))\n")
    dsl.load_rules(f)
    (entry,) = cache_dir.glob("*.pkl")
    entry.chmod(0o666)
    dsl.load_rules(f)
    assert cache.STATS["hits"] == 0 and cache.STATS["misses"] == 2
