"""External data: models whose weights live in files beside the `.onnx` (ONNX's external data,
required above 2 GB, protobuf's message size limit).

Reading: the locations are checked before any byte of them is read (a location outside the
model's folder, absolute, or reached through a symlink that leads out of it is refused, as a
path in a downloaded model must not read `/etc/passwd` or `~/.ssh`); the initializers of the
main graph are then mapped (`numpy.memmap`), not read, so the optimizer holds the weights once,
in the model it writes. Writing: a model goes to a staging folder beside the output, its
weights in one `<name>.data` file next to it; both are renamed into place after the checks.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx
from onnx import helper
from onnx.external_data_helper import (
    ExternalDataInfo,
    load_external_data_for_tensor,
    uses_external_data,
)

# serialized size above which a model is written with external data: protobuf refuses
# messages of 2 GiB or more; 64 MiB of margin for what is not weights
EXTERNAL_DATA_THRESHOLD = 2**31 - 2**26
# tensors smaller than this stay inline in a model written with external data (onnx's default)
INLINE_MAX_BYTES = 1024


class ExternalDataError(ValueError):
    """An external-data location that may not be read (outside the folder, missing, ...)."""


def external_tensors(
    model: onnx.ModelProto, main_initializers: bool = True
) -> Iterator[onnx.TensorProto]:
    """Every tensor of `model` whose data is external: initializers, sparse initializers and
    node attributes, in the main graph (its initializers only with `main_initializers`), in
    subgraphs and in functions."""
    graphs = [model.graph]
    nodes = [n for f in model.functions for n in f.node]
    skip = not main_initializers  # the first graph popped is the main graph
    while graphs:
        g = graphs.pop()
        tensors = [] if skip else [*g.initializer, *(s.values for s in g.sparse_initializer)]
        skip = False
        yield from (t for t in tensors if uses_external_data(t))
        nodes.extend(g.node)
        for n in nodes:
            for a in n.attribute:
                yield from (t for t in [a.t, *a.tensors] if uses_external_data(t))
                graphs.extend([a.g] if a.HasField("g") else [])
                graphs.extend(a.graphs)
        nodes = []


def data_files(path: Path) -> list[Path]:
    """The external data files the model at `path` reads its tensors from (its locations,
    under its folder), read without its data; [] for a file onnx cannot parse."""
    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception:  # not a model: nothing of it can be overwritten by its data file
        return []
    locations = {ExternalDataInfo(t).location for t in external_tensors(model)}
    return [path.parent / loc for loc in sorted(locations)]


def check_locations(model: onnx.ModelProto, folder: Path) -> None:
    """Refuse external-data locations that leave `folder` (the model's folder): absolute
    paths, `..`, symlinks that resolve outside it, and missing files. Reads no data.
    Raises ExternalDataError with a one-line reason."""
    root = folder.resolve()
    for t in external_tensors(model):
        location = ExternalDataInfo(t).location
        path = folder / location
        if not location or Path(location).is_absolute():
            raise ExternalDataError(
                f"tensor {t.name!r}: external data location {location!r} is not relative"
            )
        if not path.resolve().is_relative_to(root):
            raise ExternalDataError(
                f"tensor {t.name!r}: external data {location!r} is outside the model's folder"
            )
        if not path.is_file():
            raise ExternalDataError(f"tensor {t.name!r}: external data file {location!r} not found")


def load_small_tensors(model: onnx.ModelProto, folder: Path) -> None:
    """Read into `model` the external data of every tensor that is not an initializer of the
    main graph (node attributes, subgraphs: small, and copied as they are on export)."""
    for t in list(external_tensors(model, main_initializers=False)):
        load_external_data_for_tensor(t, str(folder))


def mapped_array(t: onnx.TensorProto, folder: Path) -> np.ndarray:
    """The value of external tensor `t` as a read-only `numpy.memmap` of its file (nothing is
    read until used), or read whole for element types numpy cannot map (packed 4-bit types).
    Shape `t.dims`, dtype as `onnx.numpy_helper.to_array`. Raises ExternalDataError if the
    file is shorter than the tensor."""
    info = ExternalDataInfo(t)
    dtype = np.dtype(helper.tensor_dtype_to_np_dtype(t.data_type))
    shape = tuple(int(d) for d in t.dims)
    size = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    path, offset = folder / info.location, int(info.offset or 0)
    if _packed(t) or sys.byteorder == "big":  # ONNX stores little-endian, whole bytes
        copy = onnx.TensorProto()
        copy.CopyFrom(t)
        load_external_data_for_tensor(copy, str(folder))
        return onnx.numpy_helper.to_array(copy)
    if path.stat().st_size < offset + size:
        raise ExternalDataError(
            f"tensor {t.name!r}: external data file {info.location!r} is too short"
        )
    if size == 0:
        return np.zeros(shape, dtype)
    return np.memmap(path, dtype=dtype, mode="r", offset=offset, shape=shape)


def _packed(t: onnx.TensorProto) -> bool:
    """True for element types stored two or four to a byte (int4, uint4, float4e2m1, int2)."""
    return _packed_type(t.data_type)


def needs_external_data(model: onnx.ModelProto) -> bool:
    """True if `model` serialized inline would exceed EXTERNAL_DATA_THRESHOLD bytes. Sized
    part by part: protobuf cannot size (or serialize) a message of 2 GiB or more at once.
    The initializers are bounded from their shapes first (`size_bound`): sizing them exactly
    serializes them (0.15 s of BERT-base's 440 MB), which only a model near the limit needs."""
    g = model.graph
    rest = sum(p.ByteSize() for p in (*g.sparse_initializer, *g.node, *model.functions))
    bounds = [size_bound(t) for t in g.initializer]
    if rest + sum(b for b in bounds if b is not None) <= EXTERNAL_DATA_THRESHOLD and all(
        b is not None for b in bounds
    ):
        return False
    return rest + sum(t.ByteSize() for t in g.initializer) > EXTERNAL_DATA_THRESHOLD


def _itemsizes() -> dict[int, int]:
    out = {}
    for code in onnx.TensorProto.DataType.values():
        if code in (onnx.TensorProto.UNDEFINED, onnx.TensorProto.STRING) or _packed_type(code):
            continue
        try:
            out[code] = helper.tensor_dtype_to_np_dtype(code).itemsize
        except (KeyError, ValueError, TypeError):  # a type this onnx has no numpy form of
            pass
    return out


def _packed_type(code: int) -> bool:
    """True for element types stored two or four to a byte (int4, uint4, float4e2m1, int2);
    False for a code this onnx does not name."""
    try:
        name = onnx.TensorProto.DataType.Name(code)
    except ValueError:
        return False
    return name in {"INT4", "UINT4", "FLOAT4E2M1", "INT2", "UINT2"}


# the bytes of raw_data per element of each element type that fills whole bytes (not strings,
# nor int4 and the like, packed): a tensor's raw_data is its element count times this
RAW_ITEMSIZE = _itemsizes()
# the most bytes one element takes in a typed field: a negative int32 or int64 as a varint
_MAX_VARINT = 10


def size_bound(t: onnx.TensorProto) -> int | None:
    """An upper bound of `t.ByteSize()` (bytes) read from its type, shape and names, without
    serializing its data; None for a string tensor (its elements have no bound) or an
    unknown element type. Raw data
    takes the element type's itemsize per element (4-bit types a byte: at least twice their
    packed size), a typed field (`int32_data`, `float_data`, ...) up to 10 bytes per element
    (protobuf's varints), every other field its bytes plus 11 per tag and length."""
    if _packed_type(t.data_type):
        itemsize = 1  # at least twice their packed size
    elif t.data_type in RAW_ITEMSIZE:
        itemsize = RAW_ITEMSIZE[t.data_type]
    else:
        return None
    per_element = itemsize if t.HasField("raw_data") else max(itemsize, _MAX_VARINT)
    strings = [t.name, t.doc_string]
    for entry in (*t.external_data, *t.metadata_props):
        strings += [entry.key, entry.value]
    texts = sum(len(s.encode()) + 2 * 11 for s in strings)
    return int(np.prod(t.dims, dtype=np.int64)) * per_element + 11 * (len(t.dims) + 8) + texts


def data_name(path: Path) -> str:
    """The external data file of a model written to `path`: `<file name>.data` beside it."""
    return f"{path.name}.data"


def stage(model: onnx.ModelProto, path: Path) -> Path:
    """Write `model` with its tensors of INLINE_MAX_BYTES or more in one external data file,
    into a new staging folder beside `path`, under `path`'s name and `data_name(path)`, both
    of mode 0666 less the umask, as a file the user creates. `model` is changed in place (its
    tensors point to the file). Returns the staged model's path; `commit` moves it into place,
    `discard` removes it. Raises OSError."""
    folder = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
    try:
        onnx.save_model(
            model,
            str(folder / path.name),
            save_as_external_data=True,
            all_tensors_to_one_file=True,
            location=data_name(path),
            size_threshold=INLINE_MAX_BYTES,
        )
        for f in (folder / path.name, folder / data_name(path)):
            if f.exists():  # onnx creates the data file 0600
                os.chmod(f, 0o666 & ~_umask())
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise
    return folder / path.name


def _umask() -> int:
    """The process's file mode creation mask (read by setting it, and set back at once)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def commit(staged: Path, path: Path) -> None:
    """Move a staged model (and its data file) to `path`, data first: once the model file is
    in place, the data it names is complete. Raises OSError."""
    data = staged.parent / data_name(path)
    if data.exists():
        os.replace(data, path.parent / data_name(path))
    os.replace(staged, path)
    discard(staged)


def discard(staged: Path) -> None:
    """Remove a staging folder and what is left in it."""
    shutil.rmtree(staged.parent, ignore_errors=True)
