"""onnxruntime's QOperator contrib operator QGemm against onnxruntime on one thread, bit for
bit on each backend: integer and float outputs equal. The u8 x s8 products take 7-bit B values:
onnxruntime's AVX2 u8 x s8 kernel (vpmaddubsw, on CPUs without VNNI) saturates int16 pair sums
where fastlayers sums exactly."""

import numpy as np
import pytest

from ..conftest import oracle

MS = "com.microsoft"
TYPES = {"u8": np.uint8, "s8": np.int8}


def _elem(dtype):
    from onnx import TensorProto

    return {np.dtype(np.uint8): TensorProto.UINT8, np.dtype(np.int8): TensorProto.INT8,
            np.dtype(np.float32): TensorProto.FLOAT, np.dtype(np.int32): TensorProto.INT32,
            np.dtype(np.float16): TensorProto.FLOAT16}[np.dtype(dtype)]


def _one_node(op, inputs, out_dtype, constants=(), **attrs):
    """(the bytes of a model of one com.microsoft ``op`` node named "n_<op>", its feed): the
    node reads ``inputs`` in order (None: omitted), graph inputs but for the positions in
    ``constants`` (initializers)."""
    from onnx import helper, numpy_helper

    names, infos, inits, feed = [], [], [], {}
    for i, value in enumerate(inputs):
        if value is None:
            names.append("")
            continue
        name, value = f"in{i}", np.asarray(value)
        names.append(name)
        if i in constants:
            inits.append(numpy_helper.from_array(value, name))
        else:
            infos.append(helper.make_tensor_value_info(name, _elem(value.dtype), list(value.shape)))
            feed[name] = value
    node = helper.make_node(op, names, ["y"], name=f"n_{op}", domain=MS, **attrs)
    graph = helper.make_graph([node], "g", infos, [helper.make_tensor_value_info("y", _elem(out_dtype), None)],
                              inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(MS, 1)])
    return model.SerializeToString(), feed


def _session(data):
    ort = oracle("onnxruntime")
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    return ort.InferenceSession(data, options, providers=["CPUExecutionProvider"])


def _assert_equal(got, want):
    assert got.dtype == want.dtype and got.shape == want.shape, (got.dtype, got.shape, want.dtype, want.shape)
    np.testing.assert_array_equal(got, want)


def _matches(data, feed):
    """fastlayers' output of model ``data`` on ``feed`` is onnxruntime's, bit for bit; returns it."""
    import fastlayers

    want = _session(data).run(None, feed)[0]
    got = fastlayers.load(data).run(None, feed)[0]
    _assert_equal(got, want)
    return got


def _values(rng, dtype, shape, seven_bit=False):
    lo, hi = (-64, 64) if seven_bit else (np.iinfo(dtype).min, np.iinfo(dtype).max + 1)
    return rng.integers(lo, hi, shape).astype(dtype)


# ------------------------------------------------------------------------------------ QGemm
C_SHAPES = {"scalar": lambda m, n: (), "1": lambda m, n: (1,), "11": lambda m, n: (1, 1),
            "n": lambda m, n: (n,), "1n": lambda m, n: (1, n), "m1": lambda m, n: (m, 1),
            "mn": lambda m, n: (m, n)}
QGEMM_CASES = [
    # A, B, transA, transB, alpha, C, output, B scale / zero point, (M, K, N)
    ("u8", "s8", 0, 0, 1.0, None, "quantized", "tensor", (7, 33, 1)),
    ("u8", "s8", 1, 1, 0.5, "n", "quantized", "column", (33, 257, 7)),
    ("u8", "s8", 0, 1, 2.0, "1", "scaled", "column", (7, 257, 33)),
    ("u8", "s8", 1, 0, 1.0, "mn", "float", "one", (1, 7, 257)),
    ("u8", "u8", 0, 1, 1.7, "mn", "float", "column", (1, 7, 33)),
    ("u8", "u8", 1, 0, 1.0, "m1", "quantized", "tensor", (257, 7, 33)),
    ("u8", "u8", 0, 0, 0.25, "11", "quantized", "column", (33, 1, 7)),
    ("s8", "s8", 0, 1, 0.3, "1n", "quantized", "column", (33, 33, 257)),
    ("s8", "s8", 1, 0, 1.0, "scalar", "float", "tensor", (7, 1, 7)),
    ("s8", "s8", 1, 1, -1.5, None, "scaled", "one", (1, 1, 1)),
    ("u8", "s8", 1, 0, 3.0, "n", "zero point", "column", (7, 33, 7)),
    ("s8", "s8", 0, 1, 1.0, None, "zero point", "tensor", (33, 7, 1)),
]


@pytest.mark.parametrize("case", QGEMM_CASES, ids=lambda c: "-".join(map(str, c[:8])))
def test_qgemm_matches_onnxruntime(rng, backend, case):
    """transA / transB, alpha, C of each shape onnxruntime broadcasts, quantized (u8, s8), float,
    y_scale-only (float, divided by y_scale) and y_zero_point-only (quantized, y_scale 1)
    outputs, B's scale and zero point per tensor, as
    one value or per column, u8 A with s8 and u8 B, s8 with s8; B a graph input and a constant
    (packed once, run on two inputs)."""
    a_t, b_t, trans_a, trans_b, alpha, c_kind, output, per, (m, k, n) = case
    a_t, b_t = TYPES[a_t], TYPES[b_t]
    b = _values(rng, b_t, (n, k) if trans_b else (k, n), seven_bit=b_t == np.int8)
    b_shape = {"tensor": (), "one": (1,), "column": (n,)}[per]
    b_scale = rng.uniform(0.002, 0.05, b_shape).astype(np.float32)
    b_zp = _values(rng, b_t, b_shape, seven_bit=True)
    c = None if c_kind is None else rng.integers(-20000, 20000, C_SHAPES[c_kind](m, n)).astype(np.int32)
    y_scale = None if output in ("float", "zero point") else np.float32(rng.uniform(0.05, 0.5))
    y_zp = _values(rng, a_t, ()) if output in ("quantized", "zero point") else None
    out = np.float32 if y_zp is None else a_t
    for constants in ((), (3, 4, 5, 6)):
        a = [_values(rng, a_t, (k, m) if trans_a else (m, k)) for _ in range(2)]
        inputs = [a[0], np.float32(0.02), _values(rng, a_t, ()), b, b_scale, b_zp, c, y_scale, y_zp]
        while inputs[-1] is None:
            inputs.pop()
        data, feed = _one_node("QGemm", inputs, out, constants, alpha=alpha, transA=trans_a, transB=trans_b)
        _matches(data, feed)
        _matches(data, dict(feed, in0=a[1]))


def test_qgemm_rounds_saturates_and_wraps_as_onnxruntime(rng, backend):
    """Requantization ties (acc * 0.5 on odd sums: half to even), saturation at both ends, an
    infinite or NaN multiplier (NaN to the type's low end, as MLAS's clamp), a C that makes the
    int32 sum wrap."""
    a = rng.integers(0, 256, (9, 5)).astype(np.uint8)
    b = rng.integers(-64, 64, (5, 7)).astype(np.int8)
    one, half = np.float32(1), np.float32(0.5)
    for a_scale, y_scale, alpha in ((one, np.float32(2), 1.0), (one, np.float32(2), -1.0), (one, np.float32(1e-3), 1.0),
                                    (np.float32(np.inf), one, 1.0), (np.float32(np.nan), one, 1.0)):
        for a_t, y_zp in ((np.uint8, np.uint8(3)), (np.int8, np.int8(-7))):
            inputs = [a.astype(a_t), a_scale, a_t(0), b, one, np.int8(0), None, y_scale, y_zp]
            if a_t == np.int8:
                inputs[0] = (a // 2).astype(np.int8)
            data, feed = _one_node("QGemm", inputs, a_t, alpha=alpha)
            _matches(data, feed)
    c = np.full(7, 2 ** 31 - 50, np.int32)
    data, feed = _one_node("QGemm", [a, one, np.uint8(0), b, half, np.int8(0), c], np.float32)
    got = _matches(data, feed)
    assert (got < 0).any()          # the int32 sum wrapped, as onnxruntime's
