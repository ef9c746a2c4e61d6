"""CpuOps (the native core) against ReferenceOps (numpy), primitive by primitive, on every ISA
path this CPU runs."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fastlayers import native
from fastlayers.backends import get_ops
from fastlayers.backends.activations import ACTIVATIONS as ALL_ACTIVATIONS
from fastlayers.backends.reference import fold_batch_norm
from fastlayers.native import CODES

from ..conftest import assert_close

REF, CPU = get_ops("reference"), get_ops("cpu")
pytestmark = pytest.mark.usefixtures("isa")
#: The activations the native core implements (the others run the reference itself).
ACTIVATIONS = [name for name in ALL_ACTIVATIONS if name in CODES]
SHAPES_ND = [(1, 1), (1, 7), (3, 5), (2, 3, 17), (4, 64), (2, 1, 1000)]


def special_values(shape, rng, scale=4.0):
    x = (rng.standard_normal(shape) * scale).astype(np.float32)
    flat = x.reshape(-1)
    specials = np.array([0.0, -0.0, 1e-7, -1e-7, 30.0, -30.0, 100.0, -100.0, 89.0, -89.0], np.float32)
    flat[: min(flat.size, specials.size)] = specials[: flat.size]
    return x


@pytest.mark.parametrize("name", ACTIVATIONS)
@pytest.mark.parametrize("shape", SHAPES_ND)
def test_activation_matches_reference(name, shape, rng):
    x = special_values(shape, rng)
    alpha = 0.2 if name == "leaky_relu" else 1.0
    # onnx_silu on the portable path: its sigmoid's multiply-adds round twice (no FMA), up to
    # about 1e-7 apart, times |x| (100 here)
    atol = 2e-5 if name == "onnx_silu" and native.isa() == "generic" else 1e-6
    assert_close(CPU.activation(x, name, alpha), REF.activation(x, name, alpha), rtol=2e-5, atol=atol, what=name)


@pytest.mark.parametrize("name", ACTIVATIONS)
def test_activation_propagates_nan_and_inf(name):
    x = np.array([[np.nan, np.inf, -np.inf, 0.5]], np.float32)
    alpha = 0.2 if name == "leaky_relu" else 1.0
    ref, cpu = REF.activation(x, name, alpha), CPU.activation(x, name, alpha)
    np.testing.assert_array_equal(np.isnan(cpu), np.isnan(ref), err_msg=name)
    finite = ~np.isnan(ref)
    assert_close(cpu[finite], ref[finite], what=name)


@pytest.mark.parametrize("name", ["relu", "sigmoid", "softmax"])
def test_activation_empty_and_noncontiguous(name):
    assert CPU.activation(np.zeros((0, 4), np.float32), name).shape == (0, 4)
    x = np.arange(24, dtype=np.float32).reshape(4, 6)[:, ::2]
    assert_close(CPU.activation(x, name), REF.activation(x, name))


@pytest.mark.parametrize("name", ACTIVATIONS)
@pytest.mark.parametrize("perm", [(1, 0), (0, 2, 1), (2, 0, 1), (0, 2, 3, 1)])
def test_activation_on_permuted_memory_keeps_its_layout(name, perm, rng):
    """A transposed or channels-last view of dense memory: elementwise codes run on the memory
    as it lies and give an array of the same strides; softmax (over the last axis as viewed)
    reads a copy. Either way the reference's values."""
    shape = {2: (5, 37), 3: (2, 33, 7), 4: (1, 3, 4, 19)}[len(perm)]
    x = special_values(shape, rng).transpose(perm)
    alpha = 0.2 if name == "leaky_relu" else 1.0
    y = CPU.activation(x, name, alpha)
    atol = 2e-5 if name == "onnx_silu" and native.isa() == "generic" else 1e-6
    assert_close(y, REF.activation(np.ascontiguousarray(x), name, alpha), rtol=2e-5, atol=atol, what=name)
    if name not in ("softmax", "log_softmax"):
        assert y.strides == x.strides


@pytest.mark.parametrize("activation", ACTIVATIONS)
@pytest.mark.parametrize("use_bias", [True, False])
def test_dense_matches_reference(activation, use_bias, rng):
    x = rng.standard_normal((3, 5, 7)).astype(np.float32)
    w = rng.standard_normal((7, 9)).astype(np.float32)
    b = rng.standard_normal(9).astype(np.float32) if use_bias else None
    alpha = 0.2 if activation == "leaky_relu" else 1.0
    assert_close(
        CPU.dense(x, w, b, activation, alpha),
        REF.dense(x, w, b, activation, alpha),
        rtol=2e-5,
        atol=2e-6,
        what=activation,
    )


@pytest.mark.parametrize("axis", [-1, 0, 1, (1, 2)])
@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
def test_softmax_matches_reference(op, axis, rng):
    x = special_values((3, 4, 33), rng, scale=10.0)
    assert_close(getattr(CPU, op)(x, axis), getattr(REF, op)(x, axis), rtol=1e-5, atol=2e-6)


@pytest.mark.parametrize("n", [1, 15, 16, 17, 63, 64, 65, 130, 1001])
@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
def test_softmax_rows_on_every_path(isa, op, n, rng):
    """The native row softmax on every ISA path: rows shorter than one vector, vector tails,
    the four running maxima and two running sums, rows with a NaN, an inf, all -inf and one
    finite value among -inf; into a new array, and as the dense epilogue (its bias added
    first)."""
    x = special_values((6, n), rng, scale=10.0)
    x[1, n // 2] = np.nan
    x[2, -1] = np.inf
    x[3] = -np.inf
    x[4] = -np.inf
    x[4, n // 3] = 1.5
    with np.errstate(invalid="ignore", divide="ignore"):
        want = getattr(REF, op)(x, -1)
    got = getattr(CPU, op)(x, -1)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    ok = ~np.isnan(want)
    assert_close(got[ok], want[ok], rtol=1e-5, atol=2e-6)
    w = rng.standard_normal((7, n)).astype(np.float32)
    b = rng.standard_normal(n).astype(np.float32)
    h = rng.standard_normal((5, 7)).astype(np.float32)
    assert_close(CPU.dense(h, w, b, op), getattr(REF, op)(h @ w + b, -1), rtol=2e-5, atol=2e-6)


def test_softmax_rows_sum_to_one_and_handle_masked_rows(rng):
    x = (rng.standard_normal((5, 1001)) * 50).astype(np.float32)
    x[1] = -np.inf
    x[1, 3] = 0.0  # one live element among -inf
    y = CPU.softmax(x)
    assert_close(y.sum(axis=-1), np.ones(5), rtol=1e-5)
    assert y[1, 3] == 1.0 and np.all(np.delete(y[1], 3) == 0)


@pytest.mark.parametrize(
    "shape,axes", [((4, 16), (-1,)), ((2, 3, 5), (-1,)), ((2, 3, 5), (1, 2)), ((1, 1), (-1,)), ((3, 257), (-1,))]
)
@pytest.mark.parametrize("rms", [False, True])
@pytest.mark.parametrize("affine", [True, False])
def test_layer_norm_matches_reference(shape, axes, rms, affine, rng):
    x = (rng.standard_normal(shape) * 3 + 5).astype(np.float32)
    norm_shape = tuple(shape[a] for a in axes)
    gamma = rng.standard_normal(norm_shape).astype(np.float32) if affine else None
    beta = rng.standard_normal(norm_shape).astype(np.float32) if affine else None
    assert_close(
        CPU.layer_norm(x, gamma, beta, 1e-3, axes, rms),
        REF.layer_norm(x, gamma, beta, 1e-3, axes, rms),
        rtol=1e-5,
        atol=2e-6,
    )


@pytest.mark.parametrize("rms", [False, True])
@pytest.mark.parametrize("affine", ["both", "gamma", "beta", "none"])
def test_layer_norm_rows_in_place_equals_out_of_place(rms, affine, rng):
    """The row kernel writing over its input (the encoder layer's post-norm) gives the rows it
    writes elsewhere."""
    from fastlayers.native import _core

    x_rd = (rng.standard_normal((37, 259)) * 3 + 5).astype(np.float32)
    gamma = rng.standard_normal(259).astype(np.float32) if affine in ("both", "gamma") else None
    beta = rng.standard_normal(259).astype(np.float32) if affine in ("both", "beta") else None
    out = np.empty_like(x_rd)
    _core.layer_norm(x_rd, gamma, beta, 1e-3, rms, out)
    same = x_rd.copy()
    _core.layer_norm(same, gamma, beta, 1e-3, rms, same)
    np.testing.assert_array_equal(same, out)
    assert_close(out, REF.layer_norm(x_rd, gamma, beta, 1e-3, (-1,), rms), rtol=1e-5, atol=2e-6)


@pytest.mark.parametrize(
    "shape,axis",
    [
        ((5, 8), -1),
        ((2, 3, 3, 4), -1),
        ((2, 4, 3, 3), 1),
        ((1, 24, 33, 35), 1),
        ((3, 5, 7), 1),
        ((6, 2, 1, 1), 1),
        ((4, 3, 2, 17), 2),
    ],
)
def test_batch_norm_matches_reference(shape, axis, rng):
    x = rng.standard_normal(shape).astype(np.float32)
    c = shape[axis]
    mean, gamma, beta = (rng.standard_normal(c).astype(np.float32) for _ in range(3))
    var = rng.uniform(0.1, 2, c).astype(np.float32)
    for g, b in [(gamma, beta), (None, None)]:
        scale, shift = fold_batch_norm(mean, var, g, b, 1e-3)
        expected = (x - mean.reshape(-1, *[1] * (x.ndim - 1 - axis % x.ndim))) / np.sqrt(
            var.reshape(-1, *[1] * (x.ndim - 1 - axis % x.ndim)) + 1e-3
        )
        if g is not None:
            expected = expected * g.reshape(-1, *[1] * (x.ndim - 1 - axis % x.ndim)) + b.reshape(
                -1, *[1] * (x.ndim - 1 - axis % x.ndim)
            )
        assert_close(REF.batch_norm(x, scale, shift, axis), expected, rtol=1e-5, atol=1e-5)
        assert_close(CPU.batch_norm(x, scale, shift, axis), REF.batch_norm(x, scale, shift, axis), rtol=1e-5, atol=1e-6)
        a = axis % x.ndim  # the same values held with the channel axis innermost (an NHWC view)
        held = np.ascontiguousarray(np.moveaxis(x, a, -1))
        view = np.moveaxis(held, -1, a)
        got = CPU.batch_norm(view, scale, shift, axis)
        assert got.shape == x.shape
        assert_close(got, REF.batch_norm(x, scale, shift, axis), rtol=1e-5, atol=1e-6)
        for ops in (REF, CPU):  # into ``out``, x itself or another array
            want = REF.batch_norm(x, scale, shift, axis)
            other = np.full_like(x, 7.0)
            assert ops.batch_norm(x, scale, shift, axis, out=other) is other
            assert_close(other, want, rtol=1e-5, atol=1e-6)
            inplace = x.copy()
            assert ops.batch_norm(inplace, scale, shift, axis, out=inplace) is inplace
            assert_close(inplace, want, rtol=1e-5, atol=1e-6)


@settings(max_examples=40, deadline=None)
@given(
    rows=st.integers(1, 9),
    cols=st.integers(1, 70),
    scale=st.sampled_from([0.1, 1.0, 30.0]),
    name=st.sampled_from(
        [
            "relu",
            "gelu",
            "gelu_tanh",
            "silu",
            "sigmoid",
            "softmax",
            "log_softmax",
            "exponential",
            "hard_sigmoid",
            "softsign",
        ]
    ),
)
def test_activation_property_any_shape(rows, cols, scale, name):
    x = (np.random.default_rng(rows * 100 + cols).standard_normal((rows, cols)) * scale).astype(np.float32)
    assert_close(CPU.activation(x, name), REF.activation(x, name), rtol=2e-5, atol=1e-6, what=name)


@settings(max_examples=30, deadline=None)
@given(batch=st.integers(1, 5), d_in=st.integers(1, 40), d_out=st.integers(1, 40))
def test_dense_property_any_shape(batch, d_in, d_out):
    rng = np.random.default_rng(batch * 10000 + d_in * 100 + d_out)
    x = rng.standard_normal((batch, d_in)).astype(np.float32)
    w = rng.standard_normal((d_in, d_out)).astype(np.float32)
    b = rng.standard_normal(d_out).astype(np.float32)
    assert_close(CPU.dense(x, w, b, "relu"), REF.dense(x, w, b, "relu"), rtol=1e-5, atol=1e-5)


def test_exp_kernel_accuracy_over_float32_range():
    x = np.linspace(-87.0, 88.0, 200001, dtype=np.float32)
    exact = np.exp(x.astype(np.float64))
    got = CPU.activation(x[None, :], "exponential")[0]
    np.testing.assert_allclose(got, exact, rtol=5e-7)
    assert CPU.activation(np.array([[-200.0, 200.0]], np.float32), "exponential").tolist() == [[0.0, np.inf]]


def test_exp_kernel_underflows_to_zero_not_to_denormals():
    """Where exp(x) leaves the normal range (x below ln FLT_MIN) the kernel gives 0: a denormal
    there costs a microcode assist per lane on x86, about 100x a normal lane's time."""
    edge = np.float32(np.log(np.float64(np.finfo(np.float32).tiny)))
    steps = np.arange(-20, 21, dtype=np.int64)
    near = np.array([np.nextafter(edge, np.float32(0), dtype=np.float32)], np.float32)
    for k in steps:  # floats within 20 ulps of the edge, both sides
        near = np.append(near, np.float32(edge) + np.float32(k) * np.spacing(edge))
    x = np.concatenate([np.linspace(-120.0, -80.0, 4001, dtype=np.float32), near.astype(np.float32)])
    got = CPU.activation(x[None, :], "exponential")[0]
    assert not ((got != 0) & (got < np.finfo(np.float32).tiny)).any()
    exact = np.exp(x.astype(np.float64))
    normal = exact >= 1.0001 * np.finfo(np.float32).tiny
    np.testing.assert_allclose(got[normal], exact[normal], rtol=5e-7)
    assert (got[exact < np.finfo(np.float32).tiny] == 0).all()


@pytest.mark.parametrize("name", ["gelu_tanh", "sigmoid", "silu", "softmax"])
def test_activations_over_wide_values(name, rng):
    """Arguments whose exp leaves the float range (a tanh GELU of +-12, a sigmoid of +-100):
    the values of the reference (the kernel's exp underflows to 0, ``exp`` above). (The
    reference's tanh GELU, x (1 + tanh u) / 2, cancels where tanh u is near -1: absolute 1e-6.)"""
    x = (rng.standard_normal((7, 515)) * (12.0 if name == "gelu_tanh" else 100.0)).astype(np.float32)
    assert_close(CPU.activation(x, name), REF.activation(x, name), rtol=2e-5, atol=1e-6, what=name)


def test_gelu_reference_erf_accuracy():
    import math

    x = np.linspace(-8, 8, 2001)
    exact = np.array([0.5 * v * math.erfc(-v / math.sqrt(2)) for v in x])
    got = REF.activation(x.astype(np.float32), "gelu")
    np.testing.assert_allclose(got, exact, rtol=2e-6, atol=1e-30)


@pytest.mark.parametrize("offset", [0, 1, 4, 63, 1000])
@pytest.mark.parametrize("name", ["sigmoid", "gelu", "linear", "softmax"])
def test_bias_act_at_every_offset_between_input_and_output(offset, name, rng):
    """Rows whose output lies just after the input modulo 4 KiB run from their end (4K
    aliasing): the results equal the reference for any offset, row length and tail."""
    from fastlayers.native import CODES, _core

    x = (rng.standard_normal((5, 1037)) * 3).astype(np.float32)
    bias = rng.standard_normal(1037).astype(np.float32)
    buf = np.empty(5 * 1037 + 2048, np.float32)
    start = ((x.ctypes.data - buf.ctypes.data) // 4 + offset) % 1024
    out = buf[start : start + 5 * 1037].reshape(5, 1037)
    _core.bias_act(x, bias, CODES[name], 0.0, out)
    assert_close(out, REF.activation(x + bias, name), rtol=2e-5, atol=2e-6, what=name)


@pytest.mark.parametrize("n", [1, 3, 24, 40, 100, 255, 256])
@pytest.mark.parametrize("offset", [0, 1, 17, 1000])
@pytest.mark.parametrize("name", ["linear", "relu", "onnx_silu", "gelu", "sigmoid"])
def test_bias_act_on_short_contiguous_rows_equals_row_by_row(n, offset, name, rng):
    """Contiguous rows shorter than a vector multiple run as one flat pass, the bias repeating
    along it: the same bits as the same rows run one by one (strided rows), for any row
    length, row count (odd: a tail), bias or none and output offset (4K aliasing: from the
    end)."""
    from fastlayers.native import CODES, _core

    for rows in (2, 7, 37):
        x = (rng.standard_normal((rows, n)) * 3).astype(np.float32)
        bias = rng.standard_normal(n).astype(np.float32)
        padded = np.zeros((rows, n + 5), np.float32)
        padded[:, :n] = x
        for b in (bias, None):
            want = np.zeros((rows, n + 5), np.float32)
            _core.bias_act(padded[:, :n], b, CODES[name], 0.0, want[:, :n])
            buf = np.empty(rows * n + 2048, np.float32)
            start = ((x.ctypes.data - buf.ctypes.data) // 4 + offset) % 1024
            out = buf[start : start + rows * n].reshape(rows, n)
            _core.bias_act(x, b, CODES[name], 0.0, out)
            assert np.array_equal(out, want[:, :n], equal_nan=True), (rows, b is None)
            inplace = x.copy()
            _core.bias_act(inplace, b, CODES[name], 0.0, inplace)
            assert np.array_equal(inplace, want[:, :n], equal_nan=True)
    assert_close(out, REF.activation(x, name), rtol=2e-5, atol=2e-6, what=name)


@pytest.mark.parametrize(
    "a_shape, b_shape",
    [
        ((1, 1), (1, 1)),
        ((3, 17), (3, 17)),
        ((2, 5, 9), (9,)),
        ((4, 1, 33), (4, 1, 33)),
        ((2, 3), (1, 3)),
        ((2, 3, 4), (3, 1)),
    ],
)
def test_merge_add_matches_reference(a_shape, b_shape, rng):
    """Same shapes and a per-channel row run natively, other broadcasts by numpy."""
    a = special_values(a_shape, rng)
    b = special_values(b_shape, rng)
    y = CPU.merge(a, b, "add")
    assert y.shape == np.broadcast_shapes(a_shape, b_shape) and y.dtype == np.float32
    np.testing.assert_array_equal(y, REF.merge(a, b, "add"))
    np.testing.assert_array_equal(
        CPU.merge(a[..., ::-1], b[..., ::-1], "add"), REF.merge(a[..., ::-1], b[..., ::-1], "add")
    )  # strided


def test_merge_add_of_infinities_gives_nan_without_warning():
    import warnings

    a = np.array([[np.inf, -np.inf, np.nan, 1.0]], np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        y = CPU.merge(a, -a, "add")
    np.testing.assert_array_equal(np.isnan(y), [[True, True, True, False]])


@pytest.mark.parametrize(
    "shape, axes",
    [((2, 7, 5), (1,)), ((1, 1, 3), (-2,)), ((2, 3, 4, 6), (1, 2)), ((2, 2, 3, 4, 5), (1, 2, 3)), ((3, 4, 5), (2,))],
)
@pytest.mark.parametrize("kind", ["max", "avg"])
@pytest.mark.parametrize("keepdims", [False, True])
def test_global_pool_matches_reference(shape, axes, kind, keepdims, rng):
    """Every axis between batch and channels pools natively; other axes fall back."""
    x = special_values(shape, rng)
    y = CPU.global_pool(x, kind, axes, keepdims)
    assert_close(y, REF.global_pool(x, kind, axes, keepdims), rtol=1e-5, atol=1e-6, what=kind)
    assert y.dtype == np.float32


@pytest.mark.parametrize("shape", [(1, 1), (3, 17), (2, 4, 33)])
@pytest.mark.parametrize("axes", [(-1,), (None,)])
def test_layer_norm_last_axis_matches_reference(shape, axes, rng):
    x = special_values(shape, rng, scale=1.0)
    axes = (x.ndim - 1,) if axes == (None,) else axes
    gamma, beta = rng.standard_normal(shape[-1]).astype(np.float32), rng.standard_normal(shape[-1]).astype(np.float32)
    for g, b in ((gamma, beta), (None, None), (gamma[::-1], beta)):
        assert_close(
            CPU.layer_norm(x, g, b, 1e-3, axes),
            REF.layer_norm(x, g, b, 1e-3, axes),
            rtol=1e-5,
            atol=1e-5,
            what=str(shape),
        )


@pytest.mark.parametrize("name", ACTIVATIONS)
@pytest.mark.parametrize("shape", [(1, 128, 1), (3, 5, 1), (2, 4097), (2, 3000, 3), (7,)])
def test_activation_is_the_same_whatever_the_last_axis(name, shape, rng):
    # elementwise codes run over the memory in rows of their own width: each value's result
    # is that of the same value in a row of the last axis' width
    x = special_values(shape, rng)
    rows = x.reshape(-1, shape[-1])
    want = np.empty_like(rows)
    native._core.bias_act(rows, None, CODES[name], 0.2, want)
    got = CPU.activation(x, name, 0.2)
    assert got.shape == x.shape and np.array_equal(got.reshape(rows.shape), want, equal_nan=True)


@pytest.mark.parametrize(
    "shapes, axis",
    [
        ([(2, 3, 4), (2, 5, 4)], 1),
        ([(2, 3, 4), (2, 3, 1)], -1),
        ([(1, 2), (3, 2), (0, 2)], 0),
        ([(4,), (5,)], 0),
        ([(2, 0, 3), (2, 2, 3)], 1),
    ],
)
@pytest.mark.parametrize("dtype", ["float32", "int64", "bool"])
def test_concatenate_matches_numpy(rng, shapes, axis, dtype):
    xs = [(rng.standard_normal(s) * 10).astype(dtype) for s in shapes]
    got = CPU.concatenate(xs, axis)
    np.testing.assert_array_equal(got, np.concatenate(xs, axis=axis))
    assert got.dtype == np.dtype(dtype) and got.flags.c_contiguous


def test_concatenate_falls_back_for_views_and_mixed_dtypes(rng):
    a = rng.standard_normal((4, 6)).astype(np.float32)
    np.testing.assert_array_equal(
        CPU.concatenate([a[:, ::2], a[:, 1::2]], 1), np.concatenate([a[:, ::2], a[:, 1::2]], 1)
    )
    np.testing.assert_array_equal(
        CPU.concatenate([a, a.astype(np.float64)], 0), np.concatenate([a, a.astype(np.float64)], 0)
    )
    with pytest.raises(ValueError):
        CPU.concatenate([a, a[:3, :5]], 0)
