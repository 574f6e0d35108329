"""Determinism: the same model optimized in two processes with different hash seeds is written
byte for byte the same (no set or dict iteration order leaks into the output)."""

import os
import subprocess
import sys
from pathlib import Path

import onnx
import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "examples"))

pytestmark = pytest.mark.slow


def _optimize_in_process(src: Path, dst: Path, hash_seed: int) -> bytes:
    env = {**os.environ, "PYTHONHASHSEED": str(hash_seed), "PYTHONPATH": str(ROOT)}
    args = ["optimize", str(src), str(dst), "--allow", "reassoc,approx", "--no-check"]
    r = subprocess.run(
        [sys.executable, "-m", "rewrite.cli", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
    )
    assert r.returncode == 0, r.stderr
    return dst.read_bytes()


@pytest.mark.parametrize("name", ["gpt2", "bert"])
def test_two_hash_seeds_write_identical_files(tmp_path, name):
    import make_models

    src = tmp_path / f"{name}.onnx"
    onnx.save(getattr(make_models, name)(None, exporter="dynamo"), str(src))
    first = _optimize_in_process(src, tmp_path / "a.onnx", hash_seed=0)
    second = _optimize_in_process(src, tmp_path / "b.onnx", hash_seed=4242)
    assert len(onnx.load_from_string(first).graph.node) < len(onnx.load(str(src)).graph.node)
    assert first == second
