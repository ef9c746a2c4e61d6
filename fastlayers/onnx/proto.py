"""A reader of ONNX model files: the protobuf wire format of ``onnx.proto``, for the messages
and fields that running a model needs, with no dependency beyond numpy.

Why not the ``onnx`` package: importing it takes about 80 ms, its parse copies every weight into
a ``bytes`` object and ``numpy_helper.to_array`` copies it again, so a loaded model held three
copies of its weights at its peak. Here the file is read once into one buffer. Read from a file
(``read_model``, ``own=True``), each little-endian ``raw_data`` tensor is copied into memory of
its own and the buffer's pages under it are handed back to the system as it goes, so the parse
holds about one copy of the weights at its peak and each weight is freed on its own once the
optimiser replaces it (a view of the buffer would keep the whole file alive for one small
constant). Parsed from bytes the caller keeps (``own=False``), tensors are views of them where
aligned to their element size and writeable, else copies. ``onnx.proto`` is stable: fields are
only ever added, and unknown ones are skipped, as protobuf requires.

The file is data. Every length and offset is checked against the bytes that hold it before it is
used; a tensor's dimensions must match the bytes it carries before anything is allocated; nested
graphs may be at most ``limits.ONNX_MAX_NESTING`` deep; external data must lie beside the model. Every defect
raises ``ModelFileError`` naming the file and the tensor, node or field concerned.

Wire format: https://protobuf.dev/programming-guides/encoding/; messages:
https://github.com/onnx/onnx/blob/main/onnx/onnx.proto.
"""

from __future__ import annotations

import mmap
import os
from pathlib import Path

import numpy as np

from .. import limits
from ..errors import ModelFileError, UnsupportedError

_VARINT, _I64, _LEN, _I32 = 0, 1, 2, 5

#: TensorProto.DataType -> numpy dtype (little-endian), for the types fastlayers computes with.
TENSOR_DTYPES = {
    1: "<f4",
    2: "u1",
    3: "i1",
    4: "<u2",
    5: "<i2",
    6: "<i4",
    7: "<i8",
    9: "?",
    10: "<f2",
    11: "<f8",
    12: "<u4",
    13: "<u8",
}
_TYPE_NAMES = {
    0: "UNDEFINED",
    8: "STRING",
    14: "COMPLEX64",
    15: "COMPLEX128",
    16: "BFLOAT16",
    17: "FLOAT8E4M3FN",
    18: "FLOAT8E4M3FNUZ",
    19: "FLOAT8E5M2",
    20: "FLOAT8E5M2FNUZ",
    21: "UINT4",
    22: "INT4",
    23: "FLOAT4E2M1",
}
#: Which typed field holds a tensor's values when it has no raw_data, by data type.
_INT32_FIELD_TYPES = {2, 3, 4, 5, 6, 9, 10}  # int32_data (float16 as its uint16 bits)
_UINT64_FIELD_TYPES = {12, 13}  # uint64_data

# AttributeProto.AttributeType
_FLOAT, _INT, _STRING, _TENSOR, _GRAPH, _FLOATS, _INTS, _STRINGS, _TENSORS, _GRAPHS = range(1, 11)
_SPARSE_TENSOR, _SPARSE_TENSORS = 11, 12


class ValueInfo:
    """A graph input or output: name, element type (TensorProto.DataType, 0 when not a tensor)
    and shape (None when absent; each dimension an int, a symbolic name or None)."""

    __slots__ = ("name", "elem_type", "shape")

    def __init__(self, name, elem_type, shape):
        self.name, self.elem_type, self.shape = name, elem_type, shape


class NodeProto:
    """One node as written: op type, domain, name, input and output names, and its attributes
    (name -> value: int, float, str, list, ndarray or ``Graph``)."""

    __slots__ = ("op_type", "domain", "name", "inputs", "outputs", "attrs")

    def __init__(self, op_type, domain, name, inputs, outputs, attrs):
        self.op_type, self.domain, self.name = op_type, domain, name
        self.inputs, self.outputs, self.attrs = inputs, outputs, attrs


class Graph:
    """A graph: name, nodes in order, initializers (name -> ndarray), inputs, outputs and the
    value_info the exporter recorded."""

    __slots__ = ("name", "nodes", "initializers", "inputs", "outputs", "value_info")

    def __init__(self):
        self.name, self.nodes, self.initializers = "", [], {}
        self.inputs, self.outputs, self.value_info = [], [], []


class Model:
    """A model file: IR version, opsets (domain -> version, "" for the default domain),
    producer and main graph; ``external_data``: whether a tensor's values came from a file
    beside it."""

    __slots__ = ("ir_version", "opsets", "producer", "graph", "external_data")

    def __init__(self, ir_version, opsets, producer, graph, external_data=False):
        self.ir_version, self.opsets, self.producer, self.graph = ir_version, opsets, producer, graph
        self.external_data = external_data


#: Files at least this large are read into an anonymous mapping, whose pages a parse with
#: ``own`` hands back as it copies the tensors out (``_Parser.raw_array``).
MAPPED_READ_BYTES = 1 << 20


def read_buffer(f, size: int):
    """The ``size`` bytes of the open file ``f`` in one fresh buffer: an anonymous mapping for
    files of ``MAPPED_READ_BYTES`` or more (page-aligned, so that ``parse_model(..., own=True)``
    can release what it has copied out), else a numpy array. OSError where the file is shorter."""
    if size >= MAPPED_READ_BYTES and hasattr(mmap, "MAP_PRIVATE"):
        # private: a shared anonymous mapping keeps pages handed back with MADV_DONTNEED
        data = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    else:
        data = np.empty(size, np.uint8)
    # not zero-filled (np.empty) or zero pages (the mapping): the read writes every byte
    if f.readinto(memoryview(data)) != size:  # type: ignore[arg-type]
        raise OSError("the file changed size while it was read")
    return data


def read_model(path) -> Model:
    """Read an ONNX model file (external data from beside it)."""
    path = Path(path)
    try:
        with open(path, "rb") as f:
            data = read_buffer(f, os.fstat(f.fileno()).st_size)
    except OSError as e:
        raise ModelFileError(f"{path}: cannot read the file ({e})") from e
    return parse_model(data, str(path), path.parent, own=True)


def parse_model(data, where: str = "ONNX model", directory: Path | None = None, *, own: bool = False) -> Model:
    """Parse a serialized ModelProto (any bytes-like object). ``directory``: where external
    data lies (None: external data is refused). ``own``: every tensor gets memory of its own,
    and where ``data`` is an ``mmap.mmap`` its pages under each tensor's bytes are handed back
    once copied (``data`` is then spent: read nothing else from it); else the weights are views
    of ``data`` where it is writeable and they are aligned, and copies otherwise."""
    return _Parser(data, where, directory, own).model()


class _Parser:
    def __init__(self, data, where, directory, own=False):
        self.buf = memoryview(data).cast("B")
        self.where, self.directory, self.own = where, directory, own
        self.release = data if own and isinstance(data, mmap.mmap) and hasattr(mmap, "MADV_DONTNEED") else None
        self.external_used = False
        self.view = np.frombuffer(self.buf, np.uint8) if len(self.buf) else np.empty(0, np.uint8)
        self.address = self.view.ctypes.data

    # ------------------------------------------------------------------ wire format
    def fail(self, what):
        raise ModelFileError(f"{self.where}: not a readable ONNX model: {what}")

    def varint(self, pos, end):
        buf, shift, value = self.buf, 0, 0
        while True:
            if pos >= end:
                self.fail("a number runs past the end of its message (truncated file?)")
            b = buf[pos]
            pos += 1
            value |= (b & 0x7F) << shift
            if b < 0x80:
                return value, pos
            shift += 7
            if shift > 63:
                self.fail("a number is longer than 10 bytes")

    def fields(self, start, end, what):
        """(field number, wire type, value, position) of each field of the message in
        buf[start:end]: value is an int for numbers, (start, end) for length-delimited fields."""
        pos = start
        while pos < end:
            key, pos = self.varint(pos, end)
            number, wire = key >> 3, key & 7
            if number == 0:
                self.fail(f"field number 0 in {what}")
            if wire == _VARINT:
                value, pos = self.varint(pos, end)
            elif wire == _LEN:
                n, pos = self.varint(pos, end)
                if n > end - pos:
                    self.fail(f"a field of {what} claims {n} bytes where {end - pos} remain (truncated file?)")
                value, pos = (pos, pos + n), pos + n
            elif wire == _I64 or wire == _I32:
                n = 8 if wire == _I64 else 4
                if n > end - pos:
                    self.fail(f"a field of {what} runs past its end (truncated file?)")
                value, pos = pos, pos + n
            else:
                self.fail(f"wire type {wire} (field {number} of {what}) is not one protobuf writes")
            yield number, wire, value

    def text(self, span, what):
        try:
            return bytes(self.buf[span[0] : span[1]]).decode("utf-8")
        except UnicodeDecodeError:
            self.fail(f"{what} is not UTF-8 text")

    def signed(self, value):
        return value - (1 << 64) if value >= 1 << 63 else value

    def number(self, wire, value, what):
        if wire != _VARINT:
            self.fail(f"{what}: expected a number")
        return self.signed(value)

    def span(self, wire, value, what):
        if wire != _LEN:
            self.fail(f"{what}: expected a length-delimited field")
        return value

    def f32(self, wire, value, what):
        if wire != _I32:
            self.fail(f"{what}: expected a float")
        return float(self.view[value : value + 4].view("<f4")[0])

    def repeated(self, wire, value, kind, what):
        """The values of one occurrence of a repeated number field, packed or not: ``kind`` is
        "varint" (signed), "uvarint", "<f4" or "<f8" (fixed width)."""
        if kind in ("varint", "uvarint"):
            convert = self.signed if kind == "varint" else int
            if wire == _VARINT:
                return [convert(value)]
            start, end = self.span(wire, value, what)
            out, pos = [], start
            while pos < end:
                v, pos = self.varint(pos, end)
                out.append(convert(v))
            return out
        size = np.dtype(kind).itemsize
        if wire == (_I32 if size == 4 else _I64):
            return self.view[value : value + size].view(kind).tolist()
        start, end = self.span(wire, value, what)
        if (end - start) % size:
            self.fail(f"{what}: {end - start} bytes is not a whole number of {size}-byte values")
        return self.view[start:end].view(kind).tolist()

    # ------------------------------------------------------------------ messages
    def model(self):
        ir_version, opsets, producer, graph = 0, {}, "", None
        for number, wire, value in self.fields(0, len(self.buf), "the model"):
            if number == 1:
                ir_version = self.number(wire, value, "ir_version")
            elif number == 2:
                producer = self.text(self.span(wire, value, "producer_name"), "producer_name")
            elif number == 7:
                if graph is not None:
                    self.fail("the model has two graphs")
                graph = self.graph(self.span(wire, value, "graph"), 0)
            elif number == 8:
                domain, version = "", 0
                for n, w, v in self.fields(*self.span(wire, value, "opset_import"), "an opset_import"):
                    if n == 1:
                        domain = self.text(self.span(w, v, "opset domain"), "an opset domain")
                    elif n == 2:
                        version = self.number(w, v, "opset version")
                opsets["" if domain == "ai.onnx" else domain] = version
        if graph is None:
            self.fail("no graph (not an ONNX model file?)")
        return Model(ir_version, opsets, producer, graph, self.external_used)

    def graph(self, span, depth):
        if depth > limits.ONNX_MAX_NESTING:
            self.fail(f"subgraphs nested more than {limits.ONNX_MAX_NESTING} deep")
        g = Graph()
        sparse = []
        for number, wire, value in self.fields(*span, "a graph"):
            if number == 1:
                g.nodes.append(self.node(self.span(wire, value, "node"), depth))
            elif number == 2:
                g.name = self.text(self.span(wire, value, "graph name"), "the graph name")
            elif number == 5:
                name, array = self.tensor(self.span(wire, value, "initializer"))
                g.initializers[name] = array
            elif number == 15:
                sparse.append(self.span(wire, value, "sparse_initializer"))
            elif number in (11, 12, 13):
                vi = self.value_info(self.span(wire, value, "value_info"))
                (g.inputs if number == 11 else g.outputs if number == 12 else g.value_info).append(vi)
        for s in sparse:
            name, array = self.sparse_tensor(s)
            g.initializers[name] = array
        return g

    def node(self, span, depth):
        op_type, domain, name, inputs, outputs, attrs = "", "", "", [], [], {}
        for number, wire, value in self.fields(*span, "a node"):
            if number == 1:
                inputs.append(self.text(self.span(wire, value, "node input"), "a node input name"))
            elif number == 2:
                outputs.append(self.text(self.span(wire, value, "node output"), "a node output name"))
            elif number == 3:
                name = self.text(self.span(wire, value, "node name"), "a node name")
            elif number == 4:
                op_type = self.text(self.span(wire, value, "op_type"), "an op_type")
            elif number == 7:
                domain = self.text(self.span(wire, value, "node domain"), "a node domain")
            elif number == 5:
                attr_span = self.span(wire, value, "attribute")
                key, val = self.attribute(attr_span, depth, op_type or "a node")
                attrs[key] = val
        return NodeProto(op_type, "" if domain == "ai.onnx" else domain, name, inputs, outputs, attrs)

    def attribute(self, span, depth, node):
        """(name, value) of an AttributeProto; strings come as str, tensors as arrays."""
        name, kind, found = "", 0, {}
        floats, ints, strings, tensors, graphs = [], [], [], [], []
        for number, wire, value in self.fields(*span, f"an attribute of {node}"):
            what = f"attribute {name or '?'} of {node}"
            if number == 1:
                name = self.text(self.span(wire, value, "attribute name"), "an attribute name")
            elif number == 20:
                kind = self.number(wire, value, what)
            elif number == 2:
                found[_FLOAT] = self.f32(wire, value, what)
            elif number == 3:
                found[_INT] = self.number(wire, value, what)
            elif number == 4:
                found[_STRING] = self.span(wire, value, what)
            elif number == 5:
                found[_TENSOR] = self.tensor(self.span(wire, value, what))[1]
            elif number == 6:
                found[_GRAPH] = self.graph(self.span(wire, value, what), depth + 1)
            elif number == 7:
                floats += self.repeated(wire, value, "<f4", what)
            elif number == 8:
                ints += self.repeated(wire, value, "varint", what)
            elif number == 9:
                strings.append(self.span(wire, value, what))
            elif number == 10:
                tensors.append(self.tensor(self.span(wire, value, what))[1])
            elif number == 11:
                graphs.append(self.graph(self.span(wire, value, what), depth + 1))
            elif number in (22, 23):
                found[_SPARSE_TENSOR] = None
        where = f"attribute {name!r} of {node}"
        found.update(
            {
                k: v
                for k, v in (
                    (_FLOATS, floats),
                    (_INTS, ints),
                    (_STRINGS, strings),
                    (_TENSORS, tensors),
                    (_GRAPHS, graphs),
                )
                if v
            }
        )
        if kind == 0 and len(found) == 1:  # old files may leave the type out
            kind = next(iter(found))
        if kind in (_SPARSE_TENSOR, _SPARSE_TENSORS):
            raise UnsupportedError(f"{self.where}: {where} is a sparse tensor, which is not supported")
        if kind in (_FLOATS, _INTS, _STRINGS, _TENSORS, _GRAPHS):
            value = found.get(kind, [])
        elif kind in found:
            value = found[kind]
        elif kind in (_FLOAT, _INT):
            value = 0.0 if kind == _FLOAT else 0
        elif kind == _STRING:
            value = (0, 0)
        else:
            self.fail(f"{where} has type {kind} and no value of it")
        if kind == _STRING:
            value = self.text(value, where)
        elif kind == _STRINGS:
            value = [self.text(s, where) for s in value]
        return name, value

    def value_info(self, span):
        name, elem_type, shape = "", 0, None
        for number, wire, value in self.fields(*span, "a value_info"):
            if number == 1:
                name = self.text(self.span(wire, value, "value name"), "a value name")
            elif number == 2:
                for n, w, v in self.fields(*self.span(wire, value, "type"), f"the type of {name!r}"):
                    if n == 1:  # tensor_type
                        elem_type, shape = self.tensor_type(self.span(w, v, "tensor_type"), name)
        return ValueInfo(name, elem_type, shape)

    def tensor_type(self, span, name):
        elem_type, shape = 0, None
        for number, wire, value in self.fields(*span, f"the type of {name!r}"):
            if number == 1:
                elem_type = self.number(wire, value, f"the element type of {name!r}")
            elif number == 2:
                shape = []
                for n, w, v in self.fields(*self.span(wire, value, "shape"), f"the shape of {name!r}"):
                    if n == 1:
                        shape.append(self.dimension(self.span(w, v, "dim"), name))
                if len(shape) > limits.ONNX_MAX_RANK:
                    self.fail(f"{name!r} has rank {len(shape)} (at most {limits.ONNX_MAX_RANK})")
        return elem_type, shape

    def dimension(self, span, name):
        dim = None
        for number, wire, value in self.fields(*span, f"a dimension of {name!r}"):
            if number == 1:
                dim = self.number(wire, value, f"a dimension of {name!r}")
            elif number == 2 and dim is None:
                dim = self.text(self.span(wire, value, "dim_param"), f"a dimension name of {name!r}") or None
        return dim

    # ------------------------------------------------------------------ tensors
    def tensor(self, span):
        """(name, ndarray) of a TensorProto."""
        name, dims, data_type, raw, location, external = "", [], 0, None, 0, {}
        typed: dict[int, list] = {}
        for number, wire, value in self.fields(*span, "a tensor"):
            if number == 1:
                dims += self.repeated(wire, value, "varint", "tensor dims")
            elif number == 2:
                data_type = self.number(wire, value, "tensor data_type")
            elif number == 8:
                name = self.text(self.span(wire, value, "tensor name"), "a tensor name")
            elif number == 9:
                raw = self.span(wire, value, "raw_data")
            elif number == 14:
                location = self.number(wire, value, "data_location")
            elif number == 13:
                key, val = "", ""
                for n, w, v in self.fields(*self.span(wire, value, "external_data"), "external_data"):
                    if n in (1, 2):
                        s = self.text(self.span(w, v, "external_data entry"), "an external_data entry")
                        key, val = (s, val) if n == 1 else (key, s)
                external[key] = val
            elif number in (4, 5, 7, 10, 11):
                kind = {4: "<f4", 10: "<f8", 11: "uvarint"}.get(number, "varint")
                typed.setdefault(number, []).append((wire, value, kind))
        what = f"tensor {name!r}"
        if data_type not in TENSOR_DTYPES:
            kind = _TYPE_NAMES.get(data_type, str(data_type))
            raise UnsupportedError(f"{self.where}: {what} has element type {kind}, which is not supported")
        dtype = np.dtype(TENSOR_DTYPES[data_type])
        if len(dims) > limits.ONNX_MAX_RANK or any(d < 0 or d > limits.ONNX_MAX_DIM for d in dims):
            self.fail(f"{what} has dimensions {dims[: limits.ONNX_MAX_RANK + 1]}")
        count, nonzero = 1, dtype.itemsize
        for d in dims:
            count *= d
            nonzero *= max(d, 1)
        if nonzero > 1 << 62:  # even an empty one: numpy cannot shape an array so large
            self.fail(f"{what} has dimensions {dims[: limits.ONNX_MAX_RANK + 1]}, beyond any array")
        if location == 1:
            return name, self.external(external, dims, dtype, count, what)
        if raw is not None:
            start, end = raw
            if end - start != count * dtype.itemsize:
                self.fail(
                    f"{what}: dimensions {tuple(dims)} need {count * dtype.itemsize} bytes of "
                    f"{dtype}, its raw_data has {end - start}"
                )
            return name, self.raw_array(start, end, dtype).reshape(dims)
        return name, self.typed_values(typed, data_type, dtype, dims, count, what)

    def raw_array(self, start, end, dtype):
        """The bytes ``buf[start:end]`` as a 1-D array of ``dtype``: a view of the buffer where
        it may be one (not ``own``; aligned to the element size, which the kernels read whole,
        and writeable), else a copy. With ``own`` on a mapped buffer, the pages wholly inside
        the span are handed back after the copy: a tensor's bytes are read once, and nothing
        else lies on those pages."""
        array = self.view[start:end]
        if self.own or (self.address + start) % dtype.itemsize or not array.flags.writeable:
            array = array.copy()
        if self.release is not None:
            first = -(-start // mmap.PAGESIZE) * mmap.PAGESIZE
            last = end // mmap.PAGESIZE * mmap.PAGESIZE
            if last > first:
                self.release.madvise(mmap.MADV_DONTNEED, first, last - first)
        return array.view(dtype)

    def typed_values(self, typed, data_type, dtype, dims, count, what):
        field = (
            4
            if data_type == 1
            else 10
            if data_type == 11
            else 7
            if data_type == 7
            else 11
            if data_type in _UINT64_FIELD_TYPES
            else 5
        )
        values = []
        for wire, value, kind in typed.get(field, []):
            values += self.repeated(wire, value, kind, what)
        if len(values) != count:
            self.fail(f"{what}: dimensions {tuple(dims)} need {count} values, it has {len(values)}")
        if data_type == 10:  # float16 travels as its bit pattern in int32_data
            return np.array(values, np.uint16).view(np.float16).reshape(dims)
        try:
            return np.array(values, dtype).reshape(dims)
        except OverflowError:
            self.fail(f"{what}: a value does not fit {dtype}")

    def external(self, entries, dims, dtype, count, what):
        """The values of a tensor stored in a file beside the model."""
        if self.directory is None:
            self.fail(f"{what} keeps its values in an external file; load the model from its path")
        self.external_used = True
        location = entries.get("location", "")
        target = (self.directory / location).resolve()
        if not location or Path(location).is_absolute() or self.directory.resolve() not in target.parents:
            self.fail(f"{what}: external data location {location!r} is not a file beside the model")
        try:
            offset = int(entries.get("offset", 0))
            length = int(entries["length"]) if "length" in entries else count * dtype.itemsize
        except ValueError:
            self.fail(f"{what}: external data offset or length is not a number")
        if offset < 0 or length != count * dtype.itemsize:
            self.fail(
                f"{what}: dimensions {tuple(dims)} need {count * dtype.itemsize} bytes, its "
                f"external data has {length} at offset {offset}"
            )
        try:
            with open(target, "rb") as f:
                if os.fstat(f.fileno()).st_size < offset + length:
                    self.fail(f"{what}: external file {location!r} ends before byte {offset + length}")
                f.seek(offset)
                array = np.empty(count, dtype)
                if f.readinto(memoryview(array).cast("B")) != length:
                    self.fail(f"{what}: external file {location!r} is shorter than it was")
        except OSError as e:
            if isinstance(e, ModelFileError):
                raise
            self.fail(f"{what}: cannot read external file {location!r} ({e})")
        return array.reshape(dims)

    def sparse_tensor(self, span):
        """(name, dense ndarray) of a SparseTensorProto: ``values`` at ``indices`` (linear
        [NNZ] or coordinates [NNZ, rank]) in zeros of ``dims``."""
        values = indices = None
        dims = []
        for number, wire, value in self.fields(*span, "a sparse tensor"):
            if number == 1:
                values = self.tensor(self.span(wire, value, "sparse values"))
            elif number == 2:
                indices = self.tensor(self.span(wire, value, "sparse indices"))[1]
            elif number == 3:
                dims += self.repeated(wire, value, "varint", "sparse dims")
        if values is None or indices is None:
            self.fail("a sparse initializer without values or indices")
        name, vals = values
        what = f"sparse initializer {name!r}"
        if len(dims) > limits.ONNX_MAX_RANK or any(d < 0 or d > limits.ONNX_MAX_DIM for d in dims):
            self.fail(f"{what} has dimensions {dims[: limits.ONNX_MAX_RANK + 1]}")
        count = 1
        for d in dims:
            count *= d
        if count * vals.itemsize > limits.ONNX_MAX_SPARSE_DENSE_BYTES:
            raise UnsupportedError(
                f"{self.where}: {what} would take {count * vals.itemsize} bytes dense "
                f"(at most {limits.ONNX_MAX_SPARSE_DENSE_BYTES})"
            )
        vals, indices = vals.reshape(-1), indices.astype(np.int64)
        if indices.ndim == 2 and indices.shape == (vals.size, len(dims)) and dims:
            strides = np.cumprod([1] + dims[:0:-1])[::-1]
            if indices.size and (indices.min() < 0 or (indices >= np.array(dims)).any()):
                self.fail(f"{what}: an index lies outside its dimensions {dims}")
            indices = indices @ strides
        if indices.shape != vals.shape or (indices.size and (indices.min() < 0 or indices.max() >= count)):
            self.fail(f"{what}: its indices do not match its {vals.size} values and dimensions {dims}")
        dense = np.zeros(count, vals.dtype)
        dense[indices] = vals
        return name, dense.reshape(dims)
