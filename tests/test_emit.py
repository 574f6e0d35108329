"""The generated egglog is readable and stable: snapshot of a small rule file, and the whole
shipped library compiles and loads into egglog."""

from pathlib import Path

from dsl import load_rules, shipped_rules_dir
from engine.emit import emit, schema

DATA = Path(__file__).parent / "data"


def test_emit_snapshot(monkeypatch):
    monkeypatch.chdir(DATA.parent.parent)  # spans are relative to the repo root
    text = emit(load_rules([Path("tests/data/emit_example.rules")]))
    assert text == (DATA / "emit_example.egg").read_text()


def test_shipped_library_loads_into_egglog():
    import egglog.bindings as egg

    # the rules first: loading them declares their ops (rewrite.Rounded, ...), which the
    # schema then has (in a fresh process the schema built first lacked them)
    rules = load_rules([shipped_rules_dir()])
    program = emit(rules)
    # the ops the rules use, as engine.optimize declares them: the whole op table would
    # include every contrib op another test declared, and egglog's memory grows faster than
    # the count of constructors (238 ops: 0.6 GB; 487: 4.8 GB, which took this test to 14 GB)
    ops = set().union(*(r.lhs_ops | r.rhs_ops for r in rules.rules))
    e = egg.EGraph()
    e.run_program(*e.parse_program(schema(ops) + program))
