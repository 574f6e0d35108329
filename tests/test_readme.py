"""Every example in the README runs: the Python blocks are executed, and the `rewrite`
commands shown in `sh` blocks (other than the set-up lines) exit 0."""

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TEXT = (ROOT / "README.md").read_text()
PYTHON_BLOCKS = re.findall(r"```python\n(.*?)```", TEXT, re.S)
SH_COMMANDS = [
    line.split("#")[0].strip()
    for block in re.findall(r"```sh\n(.*?)```", TEXT, re.S)
    for line in block.splitlines()
    if line.startswith("rewrite ") and "[" not in line and "IN.onnx" not in line
]


@pytest.mark.parametrize(
    "code", PYTHON_BLOCKS, ids=[f"python-{i}" for i in range(len(PYTHON_BLOCKS))]
)
def test_python_example(code, monkeypatch):
    monkeypatch.chdir(ROOT)
    exec(compile(code, "README.md", "exec"), {"__name__": "__readme__"})


@pytest.mark.parametrize("command", SH_COMMANDS)
def test_cli_example(command, tmp_path):
    args = shlex.split(command)[1:]
    args = [str(tmp_path / Path(a).name) if a.endswith((".opt.onnx", ".json")) else a for a in args]
    r = subprocess.run(
        [sys.executable, "-m", "rewrite.cli", *args], cwd=ROOT, capture_output=True, text=True
    )
    assert r.returncode == 0, r.stderr


def test_readme_has_examples():
    assert PYTHON_BLOCKS and len(SH_COMMANDS) >= 2
