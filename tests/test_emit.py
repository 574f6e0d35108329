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
    program = emit(load_rules([shipped_rules_dir()]))
    e = egg.EGraph()
    e.run_program(*e.parse_program(schema() + program))
