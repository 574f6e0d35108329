"""Models with external data: read without copying the weights, written with external data on
request or above the size threshold (lowered here), locations outside the model's folder
refused before anything is read."""

import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnx.helper as oh
import pytest
from onnx import numpy_helper
from onnx.external_data_helper import ExternalDataInfo

from frontends.onnx import api, external, import_model, load_model
from frontends.onnx.check import compare
from rewrite.cli import main

ROOT = Path(__file__).resolve().parent.parent


def weighted_model() -> onnx.ModelProto:
    """y = Relu(Identity(x @ W) * 1): W float[32,32] (4 KB, external when saved so), and two
    nodes the shipped rules remove."""
    w = np.random.default_rng(0).standard_normal((32, 32)).astype(np.float32)
    nodes = [
        oh.make_node("MatMul", ["x", "W"], ["m"]),
        oh.make_node("Identity", ["m"], ["i"]),
        oh.make_node("Mul", ["i", "one"], ["s"]),
        oh.make_node("Relu", ["s"], ["y"]),
    ]
    graph = oh.make_graph(
        nodes,
        "weighted",
        [oh.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, 32])],
        [oh.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2, 32])],
        [numpy_helper.from_array(w, "W"), numpy_helper.from_array(np.float32(1.0), "one")],
    )
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18)], ir_version=10)


def save_external(model: onnx.ModelProto, path: Path, location: str) -> Path:
    onnx.save_model(
        model, str(path), save_as_external_data=True, location=location, size_threshold=1024
    )
    return path


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "rewrite.cli", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )


def _external_names(model: onnx.ModelProto) -> list[str]:
    return [t.name for t in external.external_tensors(model)]


def _same_outputs(a: Path, b: Path) -> bool:
    diffs = compare(
        onnx.load(str(a), load_external_data=False),
        onnx.load(str(b), load_external_data=False),
        original_source=str(a),
        optimized_source=str(b),
    )
    return all(d.ok for d in diffs)


def test_weights_are_mapped_not_read(tmp_path):
    src = save_external(weighted_model(), tmp_path / "m.onnx", "m.weights")
    model = load_model(src)
    assert _external_names(model) == ["W"]
    graph = import_model(model, tmp_path)
    w = next(a for v, a in graph.constants.items() if graph.values[v].name == "W")
    assert isinstance(w, np.memmap) and Path(w.filename) == (tmp_path / "m.weights").resolve()
    np.testing.assert_array_equal(w, numpy_helper.to_array(weighted_model().graph.initializer[0]))


def test_external_input_gives_external_output_by_default(tmp_path):
    """Weights in a file beside the input: the output gets its weights in OUT.data beside it."""
    src = save_external(weighted_model(), tmp_path / "m.onnx", "m.weights")
    out = tmp_path / "out.onnx"
    r = cli("optimize", str(src), str(out))
    assert r.returncode == 0, r.stderr
    result = onnx.load(str(out), load_external_data=False)
    assert _external_names(result) == ["W"]
    assert ExternalDataInfo(result.graph.initializer[0]).location == "out.onnx.data"
    assert [n.op_type for n in result.graph.node] == ["MatMul", "Relu"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "m.onnx",
        "m.weights",
        "out.onnx",
        "out.onnx.data",
    ]
    assert _same_outputs(src, out)


def test_no_external_data_writes_one_file(tmp_path):
    src = save_external(weighted_model(), tmp_path / "m.onnx", "m.weights")
    out = tmp_path / "out.onnx"
    r = cli("optimize", str(src), str(out), "--no-external-data")
    assert r.returncode == 0, r.stderr
    result = onnx.load(str(out), load_external_data=False)
    assert _external_names(result) == [] and [n.op_type for n in result.graph.node] == [
        "MatMul",
        "Relu",
    ]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx", "m.weights", "out.onnx"]
    assert _same_outputs(src, out)


def test_inline_input_gives_inline_output(tmp_path):
    src = tmp_path / "m.onnx"
    onnx.save(weighted_model(), str(src))
    out = tmp_path / "out.onnx"
    r = cli("optimize", str(src), str(out), "--quiet")
    assert r.returncode == 0 and r.stdout == "", r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx", "out.onnx"]


def test_external_data_on_request(tmp_path):
    src = save_external(weighted_model(), tmp_path / "m.onnx", "m.weights")
    out = tmp_path / "out.onnx"
    r = cli("optimize", str(src), str(out), "--external-data")
    assert r.returncode == 0, r.stderr
    result = onnx.load(str(out), load_external_data=False)
    assert _external_names(result) == ["W"]
    assert {ExternalDataInfo(t).location for t in external.external_tensors(result)} == {
        "out.onnx.data"
    }
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "m.onnx",
        "m.weights",
        "out.onnx",
        "out.onnx.data",
    ]
    onnx.checker.check_model(str(out), full_check=True)
    assert _same_outputs(src, out)


def test_external_data_above_threshold(tmp_path, monkeypatch):
    """Above EXTERNAL_DATA_THRESHOLD (2 GB, lowered to 2 KB here) the output is written with
    external data without being asked."""
    monkeypatch.setattr(external, "EXTERNAL_DATA_THRESHOLD", 2048)
    src, out = tmp_path / "m.onnx", tmp_path / "out.onnx"
    onnx.save(weighted_model(), str(src))  # inline, 4 KB of weights
    assert main(["optimize", str(src), str(out)]) == 0
    assert _external_names(onnx.load(str(out), load_external_data=False)) == ["W"]
    assert (tmp_path / "out.onnx.data").stat().st_size == 32 * 32 * 4
    assert _same_outputs(src, out)


def test_output_onto_input_with_external_data(tmp_path):
    """OUT may be IN with external data too: the new data file replaces the old one only
    once it is complete, and the weights the optimizer mapped stay readable until then."""
    (tmp_path / "keep").mkdir()
    keep = save_external(weighted_model(), tmp_path / "keep" / "m.onnx", "m.onnx.data")
    src = save_external(weighted_model(), tmp_path / "m.onnx", "m.onnx.data")
    r = cli("optimize", str(src), str(src), "--external-data")
    assert r.returncode == 0, r.stderr
    assert [n.op_type for n in onnx.load(str(src)).graph.node] == ["MatMul", "Relu"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["keep", "m.onnx", "m.onnx.data"]
    assert _same_outputs(keep, src)


def _with_location(tmp_path: Path, location: str) -> Path:
    """A model whose W points to `location` (relative to tmp_path/model/)."""
    folder = tmp_path / "model"
    folder.mkdir()
    src = save_external(weighted_model(), folder / "m.onnx", "m.weights")
    model = onnx.load(str(src), load_external_data=False)
    for entry in model.graph.initializer[0].external_data:
        if entry.key == "location":
            entry.value = location
    onnx.save(model, str(src))
    return src


@pytest.mark.parametrize("location", ["../outside.bin", "/etc/passwd", "sub/../../outside.bin"])
def test_location_outside_folder_refused(tmp_path, location):
    (tmp_path / "outside.bin").write_bytes(bytes(4096))
    src = _with_location(tmp_path, location)
    out = tmp_path / "out.onnx"
    r = cli("optimize", str(src), str(out))
    assert r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "tensor 'W'" in r.stderr and (
        "outside the model's folder" in r.stderr or "not relative" in r.stderr
    )
    assert not out.exists()


def test_symlink_out_of_folder_refused_before_reading(tmp_path):
    """A symlink in the folder that leads to a FIFO outside it: reading would block forever,
    so the prompt refusal shows nothing was read."""
    os.mkfifo(tmp_path / "pipe")
    src = _with_location(tmp_path, "link.bin")
    (src.parent / "link.bin").symlink_to(tmp_path / "pipe")
    r = cli("optimize", str(src), str(tmp_path / "out.onnx"))
    assert r.returncode == 1 and "outside the model's folder" in r.stderr, r.stderr


def test_symlink_inside_folder_refused_by_checker(tmp_path):
    """onnx.checker refuses external data through any symlink (onnx 1.23), also one that
    stays in the folder: a one-line error, nothing written."""
    src = _with_location(tmp_path, "link.bin")
    (src.parent / "link.bin").symlink_to("m.weights")
    r = cli("optimize", str(src), str(tmp_path / "out.onnx"))
    assert r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "symbolic link" in r.stderr and not (tmp_path / "out.onnx").exists()


def test_missing_data_file(tmp_path):
    src = _with_location(tmp_path, "gone.bin")
    r = cli("optimize", str(src), str(tmp_path / "out.onnx"))
    assert r.returncode == 1 and "external data file 'gone.bin' not found" in r.stderr, r.stderr


def _anon_bytes() -> int:
    """Resident anonymous memory of this process (Linux: not file-backed pages)."""
    status = Path("/proc/self/status").read_text().splitlines()
    line = next(x for x in status if x.startswith("RssAnon"))
    return int(line.split()[1]) * 1024


def test_loading_holds_no_weights(tmp_path):
    """Loading and importing a model with 128 MiB of external weights allocates a small part
    of that: the weights stay in their file until the export copies them, once."""
    w = np.ones((4096, 8192), dtype=np.float32)  # 128 MiB
    graph = oh.make_graph(
        [oh.make_node("MatMul", ["x", "W"], ["y"])],
        "big",
        [oh.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 4096])],
        [oh.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 8192])],
        [numpy_helper.from_array(w, "W")],
    )
    del w
    src = save_external(
        oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18)], ir_version=10),
        tmp_path / "m.onnx",
        "m.weights",
    )
    del graph
    before = _anon_bytes()
    model = load_model(src)
    imported = import_model(model, tmp_path)
    grown = _anon_bytes() - before
    assert imported.constants and grown < 32 * 2**20, f"{grown / 2**20:.0f} MiB"


def test_import_without_folder_refused(tmp_path, monkeypatch):
    """External data not loaded and no folder: refused, never read from the current folder."""
    from frontends.onnx.importer import ImportError_

    src = save_external(weighted_model(), tmp_path / "m.onnx", "m.weights")
    monkeypatch.chdir(tmp_path)  # where a relative read would find the file
    with pytest.raises(ImportError_, match="external data not loaded"):
        import_model(load_model(src))


def _bounded_tensors():
    """Tensors in every encoding `size_bound` bounds: raw data, typed fields of negative
    varints, complex, packed 4-bit, external data locations, long names and doc strings."""
    rng = np.random.default_rng(0)
    arrays = {
        "f32": rng.standard_normal((30, 50)).astype(np.float32),
        "f64": rng.standard_normal(700),
        "i64neg": -rng.integers(1, 2**40, size=1100),
        "i32neg": -rng.integers(1, 2**20, size=(20, 90)).astype(np.int32),
        "u8": rng.integers(0, 255, size=1300).astype(np.uint8),
        "bool": rng.integers(0, 2, size=500).astype(bool),
        "c64": (rng.standard_normal(400) + 1j * rng.standard_normal(400)).astype(np.complex64),
        "f16": rng.standard_normal(600).astype(np.float16),
        "scalar": np.array(3.0, np.float32),
        "empty": np.zeros((0, 4), np.float32),
    }
    out = []
    for name, a in arrays.items():
        raw = numpy_helper.from_array(a, name)
        typed = oh.make_tensor(
            f"{name}_typed" * 30,
            oh.np_dtype_to_tensor_dtype(a.dtype),
            a.shape,
            a.flatten().tolist(),
        )
        typed.doc_string = "ä" * 100
        out += [raw, typed]
    int4 = oh.make_tensor("i4", onnx.TensorProto.INT4, [5], [-8, 7, -1, 0, 3])
    out.append(int4)
    ext = onnx.TensorProto(name="ext", data_type=onnx.TensorProto.FLOAT, dims=[1000, 1000])
    ext.data_location = onnx.TensorProto.EXTERNAL
    for k, v in (("location", "weights.bin" * 20), ("offset", "4096"), ("length", "4000000")):
        entry = ext.external_data.add()
        entry.key, entry.value = k, v
    out.append(ext)
    return out


def test_size_bound_is_an_upper_bound():
    """`size_bound` is at least `ByteSize()` for every encoding of every element type it
    bounds, and None for strings (whose elements have no bound)."""
    for t in _bounded_tensors():
        bound = external.size_bound(t)
        assert bound is not None and bound >= t.ByteSize(), (t.name[:20], bound, t.ByteSize())
    strings = oh.make_tensor("s", onnx.TensorProto.STRING, [2], [b"a", b"b" * 1000])
    assert external.size_bound(strings) is None
    assert external.size_bound(onnx.TensorProto(name="new", data_type=99, dims=[4])) is None


def test_needs_external_data_sizes_exactly_near_the_limit(monkeypatch):
    """A model whose bound exceeds the threshold but whose exact size does not is written
    inline: the bound only spares the exact sizing of models far below the limit."""
    model = weighted_model()  # one 32 x 32 float32 weight, raw data: 4 KB
    exact = sum(t.ByteSize() for t in model.graph.initializer)
    rest = sum(n.ByteSize() for n in model.graph.node)
    bound = sum(external.size_bound(t) for t in model.graph.initializer)
    assert bound > exact
    monkeypatch.setattr(external, "EXTERNAL_DATA_THRESHOLD", rest + exact)
    assert not external.needs_external_data(model)
    monkeypatch.setattr(external, "EXTERNAL_DATA_THRESHOLD", rest + exact - 1)
    assert external.needs_external_data(model)
    monkeypatch.setattr(external, "EXTERNAL_DATA_THRESHOLD", rest + bound)
    assert not external.needs_external_data(model)


@pytest.mark.parametrize("umask, mode", [(0o022, 0o644), (0o027, 0o640)])
def test_a_written_data_file_has_the_mode_the_umask_gives(tmp_path, umask, mode):
    """onnx creates an external data file 0600: a model written as one user and served as
    another read its graph and not its weights. Both files follow the umask."""
    src, out = tmp_path / "m.onnx", tmp_path / "out.onnx"
    onnx.save(weighted_model(), str(src))
    old = os.umask(umask)
    try:
        assert main(["optimize", str(src), str(out), "--external-data"]) == 0
    finally:
        os.umask(old)
    assert (out.stat().st_mode & 0o777, (tmp_path / "out.onnx.data").stat().st_mode & 0o777) == (
        mode,
        mode,
    )


@pytest.mark.parametrize("how", ["sigterm", "sigint"])
@pytest.mark.parametrize("external_data", [False, True])
def test_a_run_stopped_after_staging_leaves_nothing_beside_the_output(
    tmp_path, monkeypatch, capsys, how, external_data
):
    """SIGTERM (or Ctrl-C) while the staged output is checked: the staged file, or the
    staging folder of a model with external data, is removed, OUT is as it was, and the exit
    status says how the run ended (143, 130)."""
    src, out = tmp_path / "m.onnx", tmp_path / "out.onnx"
    onnx.save(weighted_model(), str(src))
    out.write_bytes(b"the user's old file")

    def stopped(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM if how == "sigterm" else signal.SIGINT)
        raise AssertionError("the signal did not stop the run")

    monkeypatch.setattr(api, "check_outputs", stopped)
    handler = signal.getsignal(signal.SIGTERM)
    args = ["optimize", str(src), str(out)] + (["--external-data"] if external_data else [])
    assert main(args) == (143 if how == "sigterm" else 130)
    assert (
        capsys.readouterr()
        .err.strip()
        .endswith("terminated" if how == "sigterm" else "interrupted")
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx", "out.onnx"]
    assert out.read_bytes() == b"the user's old file"
    assert signal.getsignal(signal.SIGTERM) == handler  # set back


@pytest.mark.parametrize("mode", ["dynamic", "static"])
def test_a_quantized_model_keeps_the_inputs_external_data(tmp_path, mode):
    """Modes that run the model (static: its calibration) read its weights into it, and the
    output was then written inline, as if the input had had none. (The int8 weight is 1 KB,
    onnx's threshold for external data; weight-only's 4-bit one would be half of it.)"""
    src = save_external(weighted_model(), tmp_path / "m.onnx", "m.weights")
    cal = tmp_path / "cal.npz"
    np.savez(cal, x=np.random.default_rng(1).standard_normal((8, 2, 32)).astype(np.float32))
    out = tmp_path / "out.onnx"
    calibration = ["--calibration", str(cal)] if mode == "static" else []
    assert main(["quantize", str(src), str(out), "--mode", mode, *calibration, "--no-check"]) == 0
    assert _external_names(onnx.load(str(out), load_external_data=False))
    assert (tmp_path / "out.onnx.data").exists()


def test_a_report_onto_a_model_or_into_no_folder_is_refused_before_anything_is_written(
    tmp_path, capsys
):
    """--report IN overwrote the input model with JSON (exit 0); --report OUT replaced the
    output; a report into a missing folder failed with a traceback after OUT was written."""
    src = tmp_path / "m.onnx"
    onnx.save(weighted_model(), str(src))
    before = src.read_bytes()
    out = tmp_path / "out.onnx"
    cases = [
        (src, "is the model IN"),
        (out, "is the model OUT"),
        (tmp_path / "no" / "r.json", "does not exist"),
    ]
    for report, says in cases:
        assert main(["optimize", str(src), str(out), "--report", str(report)]) == 1
        err = capsys.readouterr().err
        assert says in err and len(err.splitlines()) == 1, err
        assert src.read_bytes() == before and not out.exists()


def test_an_output_whose_data_file_the_input_reads_is_refused(tmp_path, capsys):
    """IN keeps its weights in `dst.onnx.data`: writing OUT = dst.onnx with external data
    replaced that file, and IN no longer loaded. Refused; OUT = IN stays allowed."""
    src = save_external(weighted_model(), tmp_path / "m.onnx", "dst.onnx.data")
    data = (tmp_path / "dst.onnx.data").read_bytes()
    dst = tmp_path / "dst.onnx"
    assert main(["optimize", str(src), str(dst)]) == 1
    err = capsys.readouterr().err
    assert "which" in err and "reads its weights from" in err and len(err.splitlines()) == 1
    assert (tmp_path / "dst.onnx.data").read_bytes() == data and not dst.exists()
    assert _same_outputs(src, src)  # the input loads and runs as before
