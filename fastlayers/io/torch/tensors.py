"""Tensors of a torch pickle as numpy arrays: storage types and dtypes, storages, and the
tensor rebuild functions the unpickler admits (``torch._utils._rebuild_tensor_v2`` ...), which
check a view against its storage before they make it.
"""

from __future__ import annotations

import contextvars

import numpy as np

from ... import limits
from ...errors import ModelFileError
from .records import COPY_SLACK_BYTES, StorageType, brepr

#: The bytes the strided tensors of the file being read may still copy (a one-element list the
#: unpickler sets for the length of its ``load``; None: no budget).
COPY_BUDGET: contextvars.ContextVar = contextvars.ContextVar("torch_copy_budget", default=None)

#: torch storage class name -> (numpy dtype of the stored elements, torch dtype name).
#: bfloat16 is stored as uint16 and widened to float32 after slicing (numpy has no bfloat16).
STORAGE_TYPES: dict[str, tuple[np.dtype, str]] = {
    "FloatStorage": (np.dtype(np.float32), "float32"),
    "DoubleStorage": (np.dtype(np.float64), "float64"),
    "HalfStorage": (np.dtype(np.float16), "float16"),
    "BFloat16Storage": (np.dtype(np.uint16), "bfloat16"),
    "LongStorage": (np.dtype(np.int64), "int64"),
    "IntStorage": (np.dtype(np.int32), "int32"),
    "ShortStorage": (np.dtype(np.int16), "int16"),
    "CharStorage": (np.dtype(np.int8), "int8"),
    "ByteStorage": (np.dtype(np.uint8), "uint8"),
    "BoolStorage": (np.dtype(np.bool_), "bool"),
    "ComplexFloatStorage": (np.dtype(np.complex64), "complex64"),
    "ComplexDoubleStorage": (np.dtype(np.complex128), "complex128"),
    "UntypedStorage": (np.dtype(np.uint8), "uint8"),
}

#: torch dtype attribute name -> (numpy storage dtype, canonical torch dtype name).
TORCH_DTYPES: dict[str, tuple[np.dtype, str]] = {}


def _float8_table(exp_bits: int, bias: int, ieee: bool) -> np.ndarray:
    """float32 value of each of the 256 float8 codes (1 sign bit, ``exp_bits``, the rest
    mantissa). ``ieee``: all-ones exponent is inf/NaN (e5m2); otherwise only S.1111.111 is NaN
    (e4m3fn, no infinities)."""
    man_bits = 7 - exp_bits
    out = np.empty(256, np.float32)
    for code in range(256):
        sign = -1.0 if code >> 7 else 1.0
        e = (code >> man_bits) & ((1 << exp_bits) - 1)
        m = code & ((1 << man_bits) - 1)
        if ieee and e == (1 << exp_bits) - 1:
            value = sign * np.inf if m == 0 else np.nan
        elif not ieee and e == (1 << exp_bits) - 1 and m == (1 << man_bits) - 1:
            value = np.nan
        elif e == 0:
            value = sign * m / (1 << man_bits) * 2.0 ** (1 - bias)
        else:
            value = sign * (1 + m / (1 << man_bits)) * 2.0 ** (e - bias)
        out[code] = value
    return out


#: float8 dtypes (stored as uint8 codes, widened to float32 through a 256-entry table).
FLOAT8_TABLES = {"float8_e4m3fn": _float8_table(4, 7, ieee=False), "float8_e5m2": _float8_table(5, 15, ieee=True)}

for _names, _np, _canon in [
    (("float32", "float"), np.float32, "float32"),
    (("float64", "double"), np.float64, "float64"),
    (("float16", "half"), np.float16, "float16"),
    (("bfloat16",), np.uint16, "bfloat16"),
    (("int64", "long"), np.int64, "int64"),
    (("int32", "int"), np.int32, "int32"),
    (("int16", "short"), np.int16, "int16"),
    (("int8",), np.int8, "int8"),
    (("uint8",), np.uint8, "uint8"),
    (("uint16",), np.uint16, "uint16"),
    (("uint32",), np.uint32, "uint32"),
    (("uint64",), np.uint64, "uint64"),
    (("bool",), np.bool_, "bool"),
    (("complex64", "cfloat"), np.complex64, "complex64"),
    (("complex128", "cdouble"), np.complex128, "complex128"),
    (("float8_e4m3fn",), np.uint8, "float8_e4m3fn"),
    (("float8_e5m2",), np.uint8, "float8_e5m2"),
]:
    for _n in _names:
        TORCH_DTYPES[_n] = (np.dtype(_np), _canon)


class Storage:
    """A storage's elements as a 1-D numpy array (``array``), with the torch dtype name."""

    __slots__ = ("key", "array", "torch_dtype")

    def __init__(self, key: str, array: np.ndarray, torch_dtype: str):
        for name, value in (("key", key), ("array", array), ("torch_dtype", torch_dtype)):
            object.__setattr__(self, name, value)

    def __setattr__(self, name, value):  # a pickle's BUILD cannot swap the array under a view
        raise AttributeError("storages are read-only")


def _ints(value, what: str) -> tuple[int, ...]:
    if not isinstance(value, (tuple, list)) or not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        raise ModelFileError(f"tensor {what} must be a tuple of ints, got {brepr(value)}")
    return tuple(value)


def _view(storage, offset, size, stride, dtype: np.dtype | None = None, torch_dtype: str | None = None):
    """The tensor ``storage[offset + sum(i_k * stride_k)]`` of shape ``size`` as a numpy array.

    Bounds are checked before any view is made (a hostile file cannot read outside the storage).
    A C-contiguous view shares the storage's memory, as torch tensors do; other views are copied.
    """
    if not isinstance(storage, Storage):
        raise ModelFileError(f"tensor storage must come from the file's storages, got {type(storage).__name__}")
    size, stride = _ints(size, "size"), _ints(stride, "stride")
    if len(size) > limits.TORCH_MAX_TENSOR_RANK:
        raise ModelFileError(f"tensor of rank {len(size)} (at most {limits.TORCH_MAX_TENSOR_RANK})")
    if not isinstance(offset, int) or offset < 0:
        raise ModelFileError(f"tensor storage offset must be a non-negative int, got {brepr(offset)}")
    if len(size) != len(stride) or any(s < 0 for s in size) or any(s < 0 for s in stride):
        raise ModelFileError(f"invalid tensor size {size} / stride {stride}")
    data = storage.array
    torch_dtype = torch_dtype or storage.torch_dtype
    if dtype is not None and dtype != data.dtype:  # _rebuild_tensor_v3: typed view of raw bytes
        nbytes = data.size * data.itemsize
        if nbytes % dtype.itemsize:
            raise ModelFileError(f"storage {storage.key} of {nbytes} bytes does not hold whole {torch_dtype} elements")
        if data.flags.c_contiguous:
            data = data.view(np.uint8).view(dtype)
        else:  # the zero-stride stand-in of a legacy file's first pass
            data = np.lib.stride_tricks.as_strided(
                np.zeros(1, dtype), shape=(nbytes // dtype.itemsize,), strides=(0,), writeable=False
            )
    n = int(np.prod(size, dtype=np.int64)) if size else 1
    if n:
        last = offset + sum((s - 1) * st for s, st in zip(size, stride))
        if last >= data.size:
            raise ModelFileError(
                f"tensor (offset {offset}, size {size}, stride {stride}) reaches "
                f"element {last} of storage {storage.key} holding {data.size}"
            )
    contiguous = [1] * len(size)
    for i in range(len(size) - 2, -1, -1):
        contiguous[i] = contiguous[i + 1] * size[i + 1]
    if n == 0:
        out = np.zeros(size, data.dtype)
    elif all(st == c for s, st, c in zip(size, stride, contiguous) if s != 1):
        out = data[offset : offset + n].reshape(size)
    else:
        item = data.itemsize
        budget = COPY_BUDGET.get()
        if budget is not None:
            budget[0] -= n * item
            if budget[0] < 0:
                raise ModelFileError(
                    f"tensor (size {size}, stride {stride}) copies {n * item} bytes out of storage "
                    f"{storage.key} of {data.size * item}: the strided tensors of a file may copy "
                    f"at most twice its storages' bytes + {COPY_SLACK_BYTES}"
                )
        out = np.lib.stride_tricks.as_strided(
            data[offset:], shape=size, strides=[st * item for st in stride], writeable=False
        )
        out = np.array(out, order="C")  # a copy; 0-d stays 0-d
    if torch_dtype == "bfloat16":  # bits of the upper half of a float32
        out = (out.astype(np.uint32) << np.uint32(16)).view(np.float32)
    elif torch_dtype in FLOAT8_TABLES:
        out = FLOAT8_TABLES[torch_dtype][out]
    return out


def rebuild_tensor_v2(storage, storage_offset, size, stride, requires_grad=False, backward_hooks=None, metadata=None):
    """``torch._utils._rebuild_tensor_v2``: the tensor as a checked view of its storage."""
    return _view(storage, storage_offset, size, stride)


def rebuild_tensor(storage, storage_offset, size, stride):
    """``torch._utils._rebuild_tensor``: the tensor as a checked view of its storage."""
    return _view(storage, storage_offset, size, stride)


def rebuild_tensor_v3(storage, storage_offset, size, stride, requires_grad, backward_hooks, dtype, metadata=None):
    """``torch._utils._rebuild_tensor_v3``: the tensor as a checked view of its storage's bytes
    read as ``dtype``."""
    if not (isinstance(dtype, type) and issubclass(dtype, StorageType)):
        raise ModelFileError(f"_rebuild_tensor_v3: dtype must be a torch dtype, got {brepr(dtype)}")
    return _view(storage, storage_offset, size, stride, dtype.np_dtype, dtype.torch_dtype)


def rebuild_parameter(data, requires_grad=True, backward_hooks=None, state=None):
    """``torch._utils._rebuild_parameter``: the parameter's tensor itself."""
    if not isinstance(data, np.ndarray):
        raise ModelFileError(f"parameter data must be a tensor, got {type(data).__name__}")
    return data
