"""Elementwise programs (``Ops.elementwise_plan``): the cpu backend's native pass
(``native/elementwise.c``) gives the reference's bits on every ISA path, for tensors in plain
and NHWC memory, channel vectors (one for all samples or one per sample), single values,
vector tails and channel counts above a block, values per position spread over the channels;
other layouts take the reference's numpy program."""

import numpy as np
import pytest

from fastlayers.backends import get_ops
from fastlayers.backends.cpu import programs
from fastlayers.backends.reference import ReferenceOps
from fastlayers.native import _core

#: Every operation: values 0 x, 1 y (x's shape), 2 a channel vector or value, 3 one value.
PROGRAM = (
    ("mul", 0, 2, None),  # 4
    ("add", 4, 1, None),  # 5
    ("act", 5, -1, ("onnx_sigmoid", 0.0)),  # 6
    ("sub", 6, 3, None),  # 7
    ("div", 7, 2, None),  # 8
    ("abs", 8, -1, None),  # 9
    ("sqrt", 9, -1, None),  # 10
    ("neg", 10, -1, None),  # 11
    ("clip", 11, -1, (-0.75, 0.5)),  # 12
    ("act", 12, -1, ("leaky_relu", 0.1)),  # 13
    ("mul", 13, 0, None),  # 14
    ("clip", 14, -1, (1.0, -1.0)),  # 15: lo above hi gives hi, as maximum then minimum
    ("add", 15, 14, None),  # 16
)


def _steps(program, operands):
    """The instructions one by one on the cpu backend (its activations), in numpy otherwise."""
    return ReferenceOps.elementwise_plan(get_ops(), program)(operands)


def _operands(rng, shape, nhwc, channel):
    def tensor():
        if nhwc:
            n, c, h, w = shape
            return rng.standard_normal((n, h, w, c)).astype(np.float32).transpose(0, 3, 1, 2)
        return rng.standard_normal(shape).astype(np.float32)

    x, y = tensor(), tensor()
    x[(0,) * x.ndim] = np.nan  # NaN kept
    if channel == "scalar":
        v = np.asarray(rng.standard_normal() + 3, np.float32)
    elif channel == "row":  # a vector along the last axis of (N, C) rows
        v = (rng.standard_normal(shape[1]) + 3).astype(np.float32)
    elif channel == "per-sample":
        v = (rng.standard_normal((shape[0], shape[1], 1, 1)) + 3).astype(np.float32)
    else:
        v = (rng.standard_normal((1, shape[1], 1, 1)) + 3).astype(np.float32)
    return [x, y, v, np.asarray([0.25], np.float32)]


@pytest.mark.parametrize(
    "shape, nhwc, channel",
    [
        ((2, 24, 9, 7), True, "channel"),
        ((3, 17, 5, 1), True, "per-sample"),
        ((1, 2100, 2, 3), True, "per-sample"),  # channels above one block
        ((1, 1, 1, 1), True, "channel"),
        ((1, 129, 4), False, "scalar"),
        ((5, 33), False, "scalar"),
        ((5, 33), False, "row"),
        ((1, 70), False, "row"),
        ((1,), False, "scalar"),
        ((2, 8, 3, 3), False, "scalar"),
    ],
)
def test_native_program_gives_the_bits_of_its_steps(isa, rng, shape, nhwc, channel):
    """The native pass against the same instructions one by one on the cpu backend (the bits
    of the unfused operators), and against the numpy reference within float32 rounding."""
    operands = _operands(rng, shape, nhwc, channel)
    if channel == "row":  # vectors along the rows of (N, C): the native pass's channels
        assert programs._layout_of(operands) is not None
    got = get_ops().elementwise_plan(PROGRAM)(operands)
    want = _steps(PROGRAM, operands)
    assert got.shape == want.shape == np.broadcast_shapes(*(o.shape for o in operands))
    np.testing.assert_array_equal(got, want)
    np.testing.assert_allclose(got, ReferenceOps().elementwise_plan(PROGRAM)(operands), rtol=1e-6, atol=1e-6)
    if nhwc and len(shape) == 4:  # NHWC memory in, NHWC memory out
        assert got.transpose(0, 2, 3, 1).flags.c_contiguous


#: Values 0 x, 1 y (x's shape), 2 one value per position (x's shape but 1 along the innermost
#: axis of its memory), 3 a channel vector or one value, 4 one value.
PROGRAM_POSITIONS = (
    ("sub", 0, 2, None),  # 5
    ("mul", 5, 3, None),  # 6
    ("add", 6, 1, None),  # 7
    ("div", 7, 2, None),  # 8
    ("sqrt", 2, -1, None),  # 9: a unary operation of the position values alone
    ("add", 8, 9, None),  # 10
    ("act", 10, -1, ("relu", 0.0)),  # 11
    ("mul", 11, 4, None),  # 12
)


def _nhwc(rng, n, c, h, w):
    return rng.standard_normal((n, h, w, c)).astype(np.float32).transpose(0, 3, 1, 2)


@pytest.mark.parametrize(
    "case",
    [
        "nhwc",
        "nhwc-per-sample",
        "nhwc-wide",
        "nhwc-one-position",
        "rows",
        "rows-scalar",
        "ncw",
        "ncw-rows",
        "slices",
        "tail",
    ],
)
def test_position_operands_give_the_bits_of_their_steps(isa, rng, case):
    """One value per position spread over the channels (a mean or variance over the channels of
    NHWC memory, a statistic per row of (N, L) rows): the native pass, with channel vectors
    beside it, against the instructions one by one and the numpy reference."""
    if case.startswith("nhwc"):
        n, c, h, w = {
            "nhwc": (2, 24, 9, 7),
            "nhwc-per-sample": (3, 17, 5, 2),
            "nhwc-wide": (1, 2100, 2, 3),
            "nhwc-one-position": (2, 33, 1, 1),
        }[case]
        x, y = _nhwc(rng, n, c, h, w), _nhwc(rng, n, c, h, w)
        pos = rng.standard_normal((n, 1, h, w)) + 3
        per = n if case == "nhwc-per-sample" else 1
        vec = rng.standard_normal((per, c, 1, 1)) + 3
    elif case.startswith("rows"):  # (N, L) rows, a value per row
        x, y = rng.standard_normal((5, 33)).astype(np.float32), rng.standard_normal((5, 33)).astype(np.float32)
        pos = rng.standard_normal((5, 1)) + 3
        vec = rng.standard_normal((1, 33)) + 3 if case == "rows" else np.asarray(1.5)
    elif case == "ncw":  # (1, 512, 256) held as (1, 256, 512): a statistic over axis 1 per position
        x = rng.standard_normal((1, 256, 512)).astype(np.float32).transpose(0, 2, 1)
        y = rng.standard_normal((1, 256, 512)).astype(np.float32).transpose(0, 2, 1)
        pos, vec = rng.standard_normal((1, 1, 256)) + 3, rng.standard_normal((1, 512, 1)) + 3
    elif case == "ncw-rows":  # the same values C-contiguous: the vector along the last axis
        x, y = (
            rng.standard_normal((2, 512, 256)).astype(np.float32),
            rng.standard_normal((2, 512, 256)).astype(np.float32),
        )
        pos, vec = rng.standard_normal((2, 512, 1)) + 3, rng.standard_normal((1, 1, 256)) + 3
    elif case == "slices":  # samples of runs at a stride (slices of wider rows): a value per run
        x = rng.standard_normal((4, 6, 12)).astype(np.float32)[:, :, :10]
        y = rng.standard_normal((4, 6, 12)).astype(np.float32)[:, :, 1:11]
        pos, vec = rng.standard_normal((4, 6, 1)) + 3, np.asarray(0.5)
    else:  # channels that leave a vector tail, many positions
        x, y = _nhwc(rng, 1, 19, 11, 13), _nhwc(rng, 1, 19, 11, 13)
        pos, vec = rng.standard_normal((1, 11, 13)) + 3, rng.standard_normal((19, 1, 1)) + 3
    operands = [x, y, np.abs(pos).astype(np.float32), vec.astype(np.float32), np.asarray([0.25], np.float32)]
    assert programs._layout_of(operands) is not None
    assert programs.POSITION in programs._layout_of(operands)[2]
    got = get_ops().elementwise_plan(PROGRAM_POSITIONS)(operands)
    want = _steps(PROGRAM_POSITIONS, operands)
    assert got.shape == want.shape == x.shape
    np.testing.assert_array_equal(got, want)
    np.testing.assert_allclose(got, ReferenceOps().elementwise_plan(PROGRAM_POSITIONS)(operands), rtol=1e-6, atol=1e-6)


def test_gate_on_small_values_runs_before_the_pass(rng):
    """A squeeze-and-excite gate: instructions on the (N, C, 1, 1) vector alone run on it once,
    the rest over the tensor; the same bits as the reference."""
    n, c, h, w = 2, 40, 6, 5
    x = rng.standard_normal((n, h, w, c)).astype(np.float32).transpose(0, 3, 1, 2)
    pooled = rng.standard_normal((n, c, 1, 1)).astype(np.float32)
    alpha, beta = np.asarray(0.2, np.float32), np.asarray(0.5, np.float32)
    program = (
        ("mul", 1, 2, None),
        ("add", 4, 3, None),
        ("clip", 5, -1, (0.0, 1.0)),
        ("mul", 0, 6, None),
        ("add", 7, 0, None),
    )
    operands = [x, pooled, alpha, beta]
    np.testing.assert_array_equal(get_ops().elementwise_plan(program)(operands), _steps(program, operands))


def test_other_layouts_and_types_take_the_numpy_program(rng):
    program = (("mul", 0, 1, None), ("act", 2, -1, ("relu", 0.0)))
    ops = get_ops()
    x = rng.standard_normal((4, 6)).astype(np.float32)
    for operands in (
        # a value per row of rows held column by column: not along the innermost axis of memory
        [np.asfortranarray(x), rng.standard_normal((4, 1)).astype(np.float32)],
        [x.T, rng.standard_normal((6, 4)).astype(np.float32)],  # memory orders that differ
        [x.astype(np.float64), x],  # another type
        [np.zeros((0, 6), np.float32), np.zeros((0, 6), np.float32)],  # empty
    ):
        np.testing.assert_array_equal(ops.elementwise_plan(program)(operands), _steps(program, operands))
    # an activation outside the native codes runs the numpy program too
    program = (("act", 0, -1, ("elu", 1.0)),)
    np.testing.assert_array_equal(ops.elementwise_plan(program)([x]), _steps(program, [x]))


def test_native_program_checks_its_arguments():
    with pytest.raises(ValueError, match="out of range"):
        _core.ElementwiseProgram([("add", 0, 0, 5, 0, 0.0, 0.0, 0.0)], 1, 1)
    with pytest.raises(ValueError, match="no instructions"):
        _core.ElementwiseProgram([], 1, 1)
    program = _core.ElementwiseProgram([("add", 0, 0, 0, 0, 0.0, 0.0, 0.0)], 1, 1)
    x = np.ones(6, np.float32)
    with pytest.raises(ValueError, match="needs 8"):
        program(1, 8, 1, [(0, x, 0)], np.empty(8, np.float32))
    with pytest.raises(ValueError, match="0 operands for 1"):
        program(1, 6, 1, [], np.empty(6, np.float32))
    assert np.array_equal(program(1, 6, 1, [(0, x, 0)], np.empty(6, np.float32)), 2 * x)
    # a position operand: inner / c values per sample, the samples `stride` apart
    program = _core.ElementwiseProgram([("add", 0, 0, 1, 0, 0.0, 0.0, 0.0)], 1, 2)
    rows = np.arange(6, dtype=np.float32)
    with pytest.raises(ValueError, match="needs 4"):
        program(2, 6, 3, [(0, np.zeros(12, np.float32), 0), (_core.EW_POSITION, rows[:3], 2)], np.empty(12, np.float32))
    with pytest.raises(ValueError, match="kind 7"):
        program(2, 6, 3, [(0, np.zeros(12, np.float32), 0), (7, rows, 2)], np.empty(12, np.float32))
    got = program(2, 6, 3, [(0, np.zeros(12, np.float32), 0), (_core.EW_POSITION, rows, 3)], np.empty(12, np.float32))
    np.testing.assert_array_equal(got, np.repeat(rows[[0, 1, 3, 4]], 3))
