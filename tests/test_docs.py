"""docs/dsl.md cannot drift from the DSL: every `lisp` example in it is parsed and checked
against the op table and the registry, every form of the grammar is shown, and every guard and
builder of the registry has a line in its tables (and no line names one that does not exist)."""

import re
from pathlib import Path

import pytest

from dsl import check, parse
from vocab.registry import BOUNDS, BUILDERS, GUARDS

ROOT = Path(__file__).resolve().parent.parent
DOC = (ROOT / "docs" / "dsl.md").read_text()
EXAMPLES = re.findall(r"```lisp\n(.*?)```", DOC, re.S)


@pytest.mark.parametrize("text", EXAMPLES, ids=[f"example-{i}" for i in range(len(EXAMPLES))])
def test_example_parses_and_checks(text):
    rules = check(parse(text, "docs/dsl.md"))
    assert rules, "an example with no rule shows nothing"


def test_every_form_is_shown():
    shown = "\n".join(EXAMPLES)
    for form in (
        "(ruleset ",
        "(simplify ",
        "(equal ",
        "(for ",
        "(if ",
        "(not ",
        ":fp ",
        ":c ",
        ":attrs @",
        "@y ",
        " _",
        "{op}",
        "(for op UNARY_ELEMENTWISE",
        "(com.microsoft.",
        "#1 ",
        "(or ",
        "? @x",
        "absent",
        "@xs...",
        "(roots ",
        ":domain ",
        ":opset ",
        "(with (@",
        "(op ",
        ":attr (",
        "@lo?",
        ":fp quant",
        "(bound ",
    ):
        assert form in shown, f"no example shows {form!r}"


def _table(kind: str) -> set[str]:
    return set(
        re.findall(r"^\| `([a-z0-9-]+)` \|", DOC.split(f"| {kind} |")[1].split("\n\n")[0], re.M)
    )


def test_registry_tables_match_the_registry():
    assert _table("guard") == set(GUARDS)
    assert _table("builder") == set(BUILDERS)
    assert _table("bound") == set(BOUNDS)
