"""The limits every model reader holds a file to, and the checks that apply them, in one module:
the fixed limits of each format (ranks, dimensions, nesting, geometry) and the checks run on a
file before anything is allocated or executed (JSON configs, zip members, the ranges of layer
configs). A file that fails them raises ``ModelFileError`` (or ``UnsupportedError`` for a
feature fastlayers does not read) naming the file and the member, layer or field.

The limits a user may move are fields of ``fastlayers.LoadOptions`` read at each check from the
options in force (``settings.current()``): ``fastlayers.load(path, options=LoadOptions(
max_layers=...))`` raises one for one load, and the environment variable named in each error
sets the process default (``fastlayers.settings.SETTINGS``). The fixed ones are the constants
below: no real model comes near them, and beyond them a value overflows C integers or numpy's
shapes.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import struct
import zipfile
import zlib

from . import settings
from .errors import ModelFileError, UnsupportedError

#: Largest absolute value of an integer in a layer config (sizes, strides, dilations, axes,
#: counts): beyond it a value is no real model's and overflows C integers. Not configurable.
MAX_CONFIG_INT = 2**31 - 1
#: Size of the chunks in which members are checksummed and copied.
CHUNK_BYTES = 8 << 20

# ----------------------------------------------------------------------------- fixed limits
#: ONNX: subgraphs (If / Loop / Scan bodies) nested deeper than this are refused.
ONNX_MAX_NESTING = 32
#: ONNX: tensor ranks above this, and axes or permutations addressing more, are refused.
ONNX_MAX_RANK = 32
#: ONNX: tensor dimensions above this are refused (numpy cannot shape an array, even an empty
#: one, whose dimensions multiply past 2**63 bytes).
ONNX_MAX_DIM = 1 << 40
#: ONNX: a sparse initializer's dense form may take at most this many bytes.
ONNX_MAX_SPARSE_DENSE_BYTES = 1 << 30
#: ONNX: the largest stride, dilation, kernel size, pad or pooled size an attribute may give.
ONNX_MAX_GEOMETRY = (1 << 31) - 1
#: torch: a tensor's rank may be at most this.
TORCH_MAX_TENSOR_RANK = 64
#: torch: the largest scale factor of a resize module (``io/torch/checks.py``).
TORCH_MAX_SCALE = 64.0
#: Keras: the most names a ``weight_names`` or ``layer_names`` HDF5 attribute may list.
KERAS_MAX_NAMES = 1 << 20

#: Config keys whose value is a size that sizes a weight (kernel, bias, embedding table):
#: it cannot exceed the number of weight elements the file holds.
WEIGHT_SIZED = re.compile(
    r"^(units|filters(_\w+)?|mlp_filters|num_classes|input_dim|output_dim|"
    r"num_heads|key_dim|value_dim|depth_multiplier|hidden_units|"
    r"output_units|proj_size|hidden_size|projection_dim)$"
)
#: Config keys whose value is the length of a table a layer computes at load (PositionalEncoding's
#: positions), which no weight in the file bounds: at most ``max_positions``.
POSITION_SIZED = ("max_length",)

#: Config keys (at any depth) whose values configure training or Keras internals, which the
#: readers ignore: not range-checked (Keras stores object ids and seeds there).
UNCHECKED = re.compile(
    r"^(\w+_(initializer|regularizer|constraint)|seed|shared_object_id|"
    r"build_config|compile_config|dtype|module|registered_name)$"
)

#: Config keys holding an input shape: sizes (null or non-negative integers).
SHAPE_KEYS = ("batch_shape", "batch_input_shape", "input_shape")
#: Config keys listing axes, each at most once (a repeated axis passes some layers' own checks
#: and fails at the first call).
DISTINCT_AXES = ("axis", "axes", "attention_axes", "dims")

#: What a corrupt zip makes zipfile (and the decompressors behind it) raise.
ZIP_ERRORS = (
    zipfile.BadZipFile,
    zipfile.LargeZipFile,
    OSError,
    EOFError,
    ValueError,
    UnicodeDecodeError,
    NotImplementedError,
    RuntimeError,
    zlib.error,
    struct.error,
    OverflowError,
    KeyError,
    IndexError,
    TypeError,
)


# ----------------------------------------------------------------------------------------- JSON
def parse_json(data, where: str, what: str):
    """``data`` (bytes or str) parsed as JSON after the size check, with the depth check.

    ModelFileError naming ``where`` (the file) and ``what`` (the member or attribute) for text
    over ``max_config_bytes``, bytes that are not UTF-8, malformed JSON, nesting deeper than
    ``max_json_depth`` (``settings.current()``) and integers too long to convert."""
    limit = settings.current().max_config_bytes
    if len(data) > limit:
        raise ModelFileError(
            f"{where}: {what} is {len(data):,} bytes, over the "
            f"{limit:,}-byte limit for a config (raise it with "
            "FASTLAYERS_MAX_CONFIG_BYTES if the file is trusted)"
        )
    try:
        text = bytes(data).decode("utf-8") if isinstance(data, (bytes, bytearray, memoryview)) else str(data)
        value = json.loads(text)
    except RecursionError:
        raise ModelFileError(
            f"{where}: {what} is nested too deeply to parse (limit {settings.current().max_json_depth} levels)"
        ) from None
    except (UnicodeError, ValueError) as e:  # JSONDecodeError, int digits over the limit
        raise ModelFileError(f"{where}: {what} is not valid JSON ({type(e).__name__}: {str(e)[:200]})") from None
    check_depth(value, where, what)
    return value


def check_depth(value, where: str, what: str) -> None:
    """ModelFileError where ``value`` nests lists and dicts deeper than ``max_json_depth``."""
    limit = settings.current().max_json_depth
    stack = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > limit:
            raise ModelFileError(
                f"{where}: {what} is nested deeper than the {limit}-level limit (FASTLAYERS_MAX_JSON_DEPTH)"
            )
        if isinstance(node, dict):
            stack.extend((v, depth + 1) for v in node.values() if isinstance(v, (dict, list)))
        elif isinstance(node, list):
            stack.extend((v, depth + 1) for v in node if isinstance(v, (dict, list)))


def short_repr(value, limit: int = 80) -> str:
    """``repr(value)``, cut to ``limit`` characters (values from a file can be huge)."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def describe(value, limit: int = 80) -> str:
    """A short description of a value found in a file (its type and repr), for error messages."""
    return f"{type(value).__name__} {short_repr(value, limit)}"


def check_layer_config(config: dict, where: str, here: str, weight_elements: int | None) -> None:
    """The ranges of a layer config's values, before the layer is constructed: every integer
    within +-MAX_CONFIG_INT, weight sizes (``WEIGHT_SIZED`` keys) non-negative and at most the
    weight elements the file can hold (``weight_elements``; None: unknown), and table lengths
    (``POSITION_SIZED`` keys) at most ``max_positions``. ``here`` names the layer."""
    stack = [(key, value) for key, value in config.items()]
    while stack:
        key, value = stack.pop()
        if isinstance(value, bool) or value is None or UNCHECKED.match(key.rsplit(".", 1)[-1]):
            continue
        if isinstance(value, int):
            if abs(value) > MAX_CONFIG_INT:
                raise ModelFileError(
                    f"{where}: {here}: field {key!r} is {value}, outside the "
                    f"range of a layer option (|value| <= {MAX_CONFIG_INT})"
                )
            last = key.rsplit(".", 1)[-1].split("[")[0]  # "layer.config.units", "mlp_filters[1]"
            if WEIGHT_SIZED.match(last):
                if value < 0:
                    raise ModelFileError(f"{where}: {here}: field {key!r} is {value}; expected a non-negative size")
                if weight_elements is not None and value > max(weight_elements, 1):
                    raise ModelFileError(
                        f"{where}: {here}: field {key!r} is {value:,}, more than the "
                        f"{weight_elements:,} weight elements the file can hold"
                    )
        elif isinstance(value, dict):
            stack.extend((f"{key}.{k}", v) for k, v in value.items())
        elif isinstance(value, list):
            stack.extend((f"{key}[{i}]", v) for i, v in enumerate(value))
    for key in SHAPE_KEYS:
        shape = config.get(key)
        if shape is not None and not (
            isinstance(shape, (list, tuple))
            and len(shape) <= 32
            and all(d is None or (type(d) is int and 0 <= d <= MAX_CONFIG_INT) for d in shape)
        ):
            raise ModelFileError(
                f"{where}: {here}: field {key!r} is {short_repr(shape)}; expected a "
                "list of sizes (null or non-negative integers)"
            )
    for key in DISTINCT_AXES:
        axes = config.get(key)
        if isinstance(axes, list) and len({repr(a) for a in axes}) != len(axes):
            raise ModelFileError(f"{where}: {here}: field {key!r} is {short_repr(axes)}; expected distinct axes")
    for key in POSITION_SIZED:
        length = config.get(key)
        limit = settings.current().max_positions
        if isinstance(length, int) and not isinstance(length, bool) and length > limit:
            raise ModelFileError(
                f"{where}: {here}: field {key!r} is {length:,}, over the "
                f"{limit:,}-position limit for the table built at load "
                "(FASTLAYERS_MAX_POSITIONS)"
            )


def count_layers(total: list, where: str, n: int = 1) -> None:
    """Add ``n`` to the running count ``total[0]`` of layers and calls; ModelFileError past
    ``max_layers``."""
    total[0] += n
    limit = settings.current().max_layers
    if total[0] > limit:
        raise ModelFileError(
            f"{where}: the model config describes more than {limit:,} layers and calls (FASTLAYERS_MAX_LAYERS)"
        )


# ------------------------------------------------------------------------------------------ zip
_METHODS = {zipfile.ZIP_BZIP2: "bzip2", zipfile.ZIP_LZMA: "lzma"}


def open_zip(source, where: str) -> zipfile.ZipFile:
    """A ZipFile over ``source`` (a path or a binary file object) whose members all pass
    ``check_member``; ModelFileError (UnsupportedError for bzip2/lzma members) otherwise."""
    try:
        z = zipfile.ZipFile(source)
    except ZIP_ERRORS as e:
        raise ModelFileError(f"{where}: not a readable zip archive ({type(e).__name__}: {str(e)[:200]})") from None
    try:
        size = source_size(z)
        names = set()
        for info in z.infolist():
            check_member(info, where, size)
            if info.filename in names:
                raise ModelFileError(f"{where}: zip member {info.filename!r} appears twice")
            names.add(info.filename)
    except BaseException:
        z.close()
        raise
    return z


def source_size(z: zipfile.ZipFile) -> int:
    """The size in bytes of the archive file that ``z`` reads (open: its file is set)."""
    fp = z.fp
    assert fp is not None, "an open ZipFile reads a file"
    here = fp.tell()
    fp.seek(0, io.SEEK_END)
    size = fp.tell()
    fp.seek(here)
    return size


def check_member(info: zipfile.ZipInfo, where: str, archive_size: int) -> None:
    """A member's flags, method and sizes: not encrypted, stored or deflated, inside the
    archive, and (deflated) within ``max_compression_ratio``."""
    name = info.filename
    if info.flag_bits & 0x41:
        raise ModelFileError(
            f"{where}: zip member {name!r} is encrypted (flags {info.flag_bits:#x}); model files are never encrypted"
        )
    if info.compress_type in _METHODS:
        raise UnsupportedError(
            f"{where}: zip member {name!r} is compressed with "
            f"{_METHODS[info.compress_type]}; fastlayers reads stored and "
            "deflated members"
        )
    if info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
        raise ModelFileError(f"{where}: zip member {name!r} has an unknown compression method {info.compress_type}")
    if info.header_offset + 30 + info.compress_size > archive_size:
        raise ModelFileError(
            f"{where}: zip member {name!r} claims {info.compress_size:,} bytes "
            f"at offset {info.header_offset:,}, past the end of the "
            f"{archive_size:,}-byte archive"
        )
    if info.compress_type == zipfile.ZIP_STORED and info.file_size != info.compress_size:
        raise ModelFileError(
            f"{where}: stored zip member {name!r} has size {info.file_size:,} but {info.compress_size:,} bytes of data"
        )
    ratio = settings.current().max_compression_ratio
    if info.compress_type == zipfile.ZIP_DEFLATED and info.file_size > ratio * info.compress_size + (1 << 16):
        raise ModelFileError(
            f"{where}: zip member {name!r} claims {info.file_size:,} bytes from "
            f"{info.compress_size:,} compressed, over the "
            f"{ratio}x ratio limit (FASTLAYERS_MAX_COMPRESSION_RATIO)"
        )


@contextlib.contextmanager
def zip_errors(where: str, what: str):
    """Reading a zip member inside: zipfile's and zlib's errors become ModelFileError naming
    ``where`` and ``what``."""
    try:
        yield
    except ModelFileError:
        raise
    except ZIP_ERRORS as e:
        raise ModelFileError(f"{where}: cannot read {what} ({type(e).__name__}: {str(e)[:200]})") from None


def open_file(source, where: str):
    """``source`` opened for binary reading when it is a path; None for a file object, which
    stays the caller's. ModelFileError naming ``where`` when the file cannot be opened."""
    if not isinstance(source, (str, os.PathLike)):
        return None
    try:
        return open(source, "rb")
    except FileNotFoundError:
        raise ModelFileError(f"{where}: no such file") from None
    except OSError as e:
        raise ModelFileError(f"{where}: cannot open the file ({e.strerror or e})") from None


def get_member(z: zipfile.ZipFile, name: str, where: str) -> zipfile.ZipInfo:
    try:
        return z.getinfo(name)
    except KeyError:
        raise ModelFileError(f"{where}: the archive has no {name!r} member") from None


def read_member(z: zipfile.ZipFile, info: zipfile.ZipInfo, where: str, limit: int, what: str | None = None) -> bytes:
    """A member's bytes, CRC-checked, refused (before anything is decompressed) when it declares
    more than ``limit`` bytes; reads at most ``limit`` bytes whatever the header says."""
    what = what or f"zip member {info.filename!r}"
    if info.file_size > limit:
        raise ModelFileError(
            f"{where}: {what} is {info.file_size:,} bytes, over the {limit:,}-byte limit (FASTLAYERS_MAX_CONFIG_BYTES)"
        )
    with zip_errors(where, what), z.open(info) as member:
        data = member.read(limit + 1)
        if len(data) != info.file_size:
            raise ModelFileError(f"{where}: {what} holds {len(data):,} bytes, its header says {info.file_size:,}")
        if member.read(1):
            raise ModelFileError(f"{where}: {what} is longer than its header says")
    return data


def read_member_into(member, out, where: str, what: str) -> None:
    """Fill the writable buffer ``out`` from the open member stream ``member`` in chunks, then
    check that the member ends there (zipfile verifies the CRC at its end)."""
    view = memoryview(out).cast("B")
    with zip_errors(where, what):
        done = 0
        while done < len(view):
            n = member.readinto(view[done : done + CHUNK_BYTES])
            if not n:
                raise ModelFileError(f"{where}: {what} is truncated ({done:,} of {len(view):,} bytes)")
            done += n
        if member.read(1):
            raise ModelFileError(f"{where}: {what} is longer than its header says")


def member_data_offset(fobj, info: zipfile.ZipInfo, where: str, archive_size: int) -> int:
    """Offset of a member's data in the archive: after its local header (30 bytes, then the
    name and extra field), checked against the archive's size."""
    fobj.seek(info.header_offset)
    header = fobj.read(30)
    if len(header) != 30 or header[:4] != b"PK\x03\x04":
        raise ModelFileError(f"{where}: corrupt local header of zip member {info.filename!r}")
    name_len, extra_len = struct.unpack("<HH", header[26:30])
    start = info.header_offset + 30 + name_len + extra_len
    if start + info.compress_size > archive_size:
        raise ModelFileError(f"{where}: zip member {info.filename!r} runs past the end of the archive")
    return start


def check_crc(fobj, start: int, size: int, expected: int, where: str, what: str) -> None:
    """The CRC-32 of ``size`` bytes at ``start`` in ``fobj``, read in chunks, against
    ``expected`` (a stored member read in place, bypassing zipfile)."""
    crc, left = 0, size
    fobj.seek(start)
    buf = bytearray(min(CHUNK_BYTES, max(size, 1)))
    view = memoryview(buf)
    while left:
        n = fobj.readinto(view[: min(left, len(buf))])
        if not n:
            raise ModelFileError(f"{where}: {what} is truncated")
        crc = zlib.crc32(view[:n], crc)
        left -= n
    if crc != expected:
        raise ModelFileError(
            f"{where}: {what} fails its CRC-32 check (stored {expected:#010x}, "
            f"computed {crc:#010x}): the file is corrupt"
        )


# ---------------------------------------------------------------------------------- activations
def check_graph(nodes, where: str) -> None:
    """Every tensor of a model's graph (its ``model.graph.all_graph_nodes``, nested models'
    included) has sizes that are None or from 0 to ``MAX_CONFIG_INT``: a config that passed its
    layers' checks but gives a negative or absurd size (padding of 2**31 on each side, an Input
    of shape (-5,)) is refused at load, not at the first call. ModelFileError naming the layer
    and the shape."""
    for node in nodes:
        for out in node.outputs:
            if any(d is not None and not 0 <= d <= MAX_CONFIG_INT for d in out.shape):
                raise ModelFileError(
                    f"{where}: layer {node.layer.name!r} "
                    f"({type(node.layer).__name__}) gives an output of shape "
                    f"{tuple(out.shape)}: sizes must be from 0 to {MAX_CONFIG_INT}"
                )
