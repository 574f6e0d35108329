"""Every example in the README and the user guide runs: the `python` blocks are executed, and
the `rewrite` commands of the `sh` blocks (other than the set-up lines and usage synopses) run
in order, each document's in one temporary directory, and exit 0. Files the examples write
(`*.opt.onnx`, `*.json`, anything under /tmp) go to that directory, never into the checkout."""

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = {name: (ROOT / name).read_text() for name in ("README.md", "docs/guide.md")}


def _python_blocks(text: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", text, re.S)


def _commands(text: str) -> list[str]:
    return [
        line.split("  #")[0].strip()
        for block in re.findall(r"```sh\n(.*?)```", text, re.S)
        for line in block.splitlines()
        if line.startswith("rewrite ") and "[" not in line and "IN.onnx" not in line
    ]


PYTHON = [(n, i, code) for n, t in DOCS.items() for i, code in enumerate(_python_blocks(t))]


@pytest.mark.parametrize("doc,i,code", PYTHON, ids=[f"{n}-python-{i}" for n, i, _ in PYTHON])
def test_python_example(doc, i, code, monkeypatch, tmp_path):
    monkeypatch.chdir(ROOT)
    exec(compile(code, doc, "exec"), {"__name__": "__readme__"})


def _local(arg: str, tmp: Path) -> str:
    if arg.startswith("/tmp/") or arg.endswith((".opt.onnx", ".json")):
        return str(tmp / Path(arg).name)
    return arg


@pytest.mark.parametrize("doc", sorted(DOCS))
def test_cli_examples(doc, tmp_path):
    commands = _commands(DOCS[doc])
    assert commands, f"{doc} shows no rewrite command"
    for command in commands:
        args = [_local(a, tmp_path) for a in shlex.split(command)[1:]]
        r = subprocess.run(
            [sys.executable, "-m", "rewrite.cli", *args], cwd=ROOT, capture_output=True, text=True
        )
        assert r.returncode == 0, f"{command}\n{r.stderr}"


def test_readme_has_examples():
    assert _python_blocks(DOCS["README.md"]) and len(_commands(DOCS["README.md"])) >= 5


def test_setup_commands_are_what_ci_runs():
    """`.ci/run` runs the README's test command, and nothing else."""
    ci = (ROOT / ".ci" / "run").read_text()
    blocks = re.findall(r"```sh\n(.*?)```", DOCS["README.md"], re.S)
    test_command = next(b.strip() for b in blocks if "pytest" in b)
    assert test_command in ci.splitlines()
