"""The native transpose and row concatenation (``native/layout.c``) and the transpose's helpers
(``fastlayers.native.layout``) against numpy on every ISA path and 1-3 threads: odd sizes around
the transpose's tiles (16,384 floats, at most 128 columns) and its register blocks (FL_VW x FL_VW
floats: 16, 8 or 4), one row or column, strided views, source rows a multiple of 1 KiB apart; concatenations of any dtype, widths
around the vector copies, empty parts; and the errors of wrong shapes, strides and alignment."""

from __future__ import annotations

import numpy as np
import pytest

from fastlayers.native import _core
from fastlayers.native.layout import channels_first, channels_last, oihw_to_hwio

pytestmark = pytest.mark.usefixtures("isa")


@pytest.mark.parametrize("threads", [1, 2, 3], indirect=True)
@pytest.mark.parametrize(
    "b, r, c",
    [
        (1, 1, 1),
        (1, 1, 40),
        (1, 33, 1),
        (2, 5, 70),
        (3, 64, 31),
        (1, 100, 97),
        (4, 32, 32),
        (1, 1000, 3),
        (1, 3, 129),
        (2, 40, 300),
        (1, 70, 1029),
        (1, 1, 4097),
        (2, 33, 257),
        (1, 16, 16),
        (1, 17, 15),
        (2, 8, 24),
        (1, 129, 130),
        (1, 300, 64),
        (1, 64, 300),
        (3, 47, 33),
        # destination rows a multiple of 4 KiB apart: half blocks of them at a time
        (1, 1024, 40),
        (2, 2048, 21),
        (1, 1024, 3),
        (1, 3072, 16),
        # source rows a multiple of 1 KiB apart: blocks along the rows
        (1, 49, 2048),
        (2, 35, 1024),
        (1, 7, 256),
        (3, 100, 512),
    ],
)
def test_transpose_matches_numpy(rng, threads, b, r, c):
    src = rng.standard_normal((b, r, c)).astype(np.float32)
    dst = np.full((b, c, r), np.nan, np.float32)
    assert _core.transpose(src, dst) is dst
    np.testing.assert_array_equal(dst, src.transpose(0, 2, 1))


def _at_offset(shape, floats):
    """An (uninitialized: NaN) float32 array of ``shape`` starting ``floats`` floats after a
    64-byte boundary."""
    raw = np.full(int(np.prod(shape)) + 32, np.nan, np.float32)
    start = (-raw.ctypes.data % 64) // 4 + floats
    return raw[start : start + int(np.prod(shape))].reshape(shape)


@pytest.mark.parametrize("threads", [1, 2], indirect=True)
@pytest.mark.parametrize("offset", [0, 1, 4, 7, 8, 12, 15])
@pytest.mark.parametrize(
    "b, r, c", [(1, 12544, 64), (2, 48, 33), (1, 17, 5), (3, 32, 130), (1, 1024, 24), (1, 49, 1024), (2, 40, 256)]
)
def test_transpose_into_a_destination_off_a_vector(rng, threads, offset, b, r, c):
    """A destination whose rows start a few floats past a vector's boundary (numpy allocates
    on 16 bytes): the rows before the first aligned one as a partial block, tiles shifted so
    that the others store whole aligned vectors."""
    src = rng.standard_normal((b, r, c)).astype(np.float32)
    dst = _at_offset((b, c, r), offset)
    assert dst.ctypes.data % 64 == 4 * offset
    _core.transpose(src, dst)
    np.testing.assert_array_equal(dst, src.transpose(0, 2, 1))


def test_transpose_of_strided_views(rng):
    """Batches and rows at any whole-float strides: the OIHW -> HWIO pattern."""
    w = rng.standard_normal((6, 5, 9)).astype(np.float32)  # (O, I, K)
    out = np.full((9, 5, 6), np.nan, np.float32)  # (K, I, O)
    _core.transpose(w.transpose(1, 0, 2), out.transpose(1, 0, 2))
    np.testing.assert_array_equal(out, w.transpose(2, 1, 0))
    wide = rng.standard_normal((3, 10, 20)).astype(np.float32)[:, ::2, :7]
    dst = np.empty((3, 7, 5), np.float32)
    _core.transpose(wide, dst)
    np.testing.assert_array_equal(dst, wide.transpose(0, 2, 1))
    aliased = rng.standard_normal((2, 37, 512)).astype(np.float32)[:, :, 3:103]  # rows 2 KiB apart
    dst = np.empty((2, 100, 37), np.float32)
    _core.transpose(aliased, dst)
    np.testing.assert_array_equal(dst, aliased.transpose(0, 2, 1))
    far = rng.standard_normal((2, 40, 700)).astype(np.float32)[:, ::3, 5:300]  # rows 2,100 floats apart
    dst = np.empty((2, 295, 14), np.float32)
    _core.transpose(far, dst)
    np.testing.assert_array_equal(dst, far.transpose(0, 2, 1))


def test_transpose_errors():
    a = np.zeros((2, 3, 4), np.float32)
    with pytest.raises(ValueError, match="expected src"):
        _core.transpose(a, np.zeros((2, 3, 4), np.float32))
    with pytest.raises(TypeError, match="float32"):
        _core.transpose(a.astype(np.float64), np.zeros((2, 4, 3), np.float64))
    with pytest.raises(ValueError, match="contiguous"):
        _core.transpose(np.zeros((2, 3, 8), np.float32)[:, :, ::2], np.zeros((2, 4, 3), np.float32))
    raw = np.zeros(2 * 3 * 4 * 4 + 1, np.uint8)[1:].view(np.float32).reshape(2, 3, 4)
    with pytest.raises(ValueError, match="aligned"):
        _core.transpose(raw, np.zeros((2, 4, 3), np.float32))


@pytest.mark.parametrize("shape", [(1, 1, 1), (2, 3, 5), (2, 7, 6, 5), (1, 33, 1, 1), (3, 2, 4, 4, 2)])
def test_channels_last(rng, shape):
    x = rng.standard_normal(shape).astype(np.float32)
    y = channels_last(x)
    assert y.flags.c_contiguous
    np.testing.assert_array_equal(y, np.moveaxis(x, 1, -1))
    np.testing.assert_array_equal(channels_last(x.astype(np.float64)), np.moveaxis(x, 1, -1))


@pytest.mark.parametrize("shape", [(1, 1, 1), (2, 5, 3), (2, 6, 5, 7), (1, 1, 1, 33), (3, 2, 4, 2, 4)])
def test_channels_first(rng, shape):
    x = rng.standard_normal(shape).astype(np.float32)
    y = channels_first(x)
    assert y.flags.c_contiguous
    np.testing.assert_array_equal(y, np.moveaxis(x, -1, 1))
    np.testing.assert_array_equal(channels_first(x.astype(np.float64)), np.moveaxis(x, -1, 1))
    np.testing.assert_array_equal(channels_first(channels_last(np.moveaxis(x, -1, 1))), np.moveaxis(x, -1, 1))


@pytest.mark.parametrize("shape", [(8, 3, 3, 3), (1, 1, 1, 1), (5, 7, 1, 4), (16, 4, 5)])
def test_oihw_to_hwio(rng, shape):
    w = rng.standard_normal(shape).astype(np.float32)
    want = np.moveaxis(w, (0, 1), (-1, -2))
    got = oihw_to_hwio(w)
    assert got.flags.c_contiguous
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(oihw_to_hwio(w.astype(np.float64)), want)


@pytest.mark.parametrize("threads", [1, 2, 3], indirect=True)
@pytest.mark.parametrize(
    "rows, widths",
    [
        (1, (1, 1)),
        (5, (16, 16)),
        (33, (3, 17, 64)),
        (1000, (16, 16)),
        (7, (0, 5, 0)),
        (2, (129, 1, 70)),
        (40000, (8, 24)),
    ],
)
@pytest.mark.parametrize("dtype", ["float32", "int64", "uint8", "bool"])
def test_concat_rows_matches_numpy(rng, threads, rows, widths, dtype):
    parts = [(rng.standard_normal((rows, w)) * 100).astype(dtype) for w in widths]
    out = np.zeros((rows, sum(widths)), dtype)
    assert _core.concat_rows(parts, out) is out
    np.testing.assert_array_equal(out, np.concatenate(parts, axis=1))


def test_concat_rows_errors():
    a = np.zeros((3, 4), np.float32)
    with pytest.raises(ValueError, match="parts"):
        _core.concat_rows([], np.zeros((3, 0), np.float32))
    with pytest.raises(ValueError, match="part 1"):
        _core.concat_rows([a, a.astype(np.float64)], np.zeros((3, 8), np.float32))
    with pytest.raises(ValueError, match="part 1"):
        _core.concat_rows([a, np.zeros((2, 4), np.float32)], np.zeros((3, 8), np.float32))
    with pytest.raises(ValueError, match="part 0"):
        _core.concat_rows([np.zeros((3, 8), np.float32)[:, ::2]], np.zeros((3, 4), np.float32))
    with pytest.raises(ValueError, match="values per row"):
        _core.concat_rows([a, a], np.zeros((3, 9), np.float32))
    with pytest.raises(ValueError, match="C-contiguous 2-D"):
        _core.concat_rows([a], np.zeros((3, 4, 1), np.float32))


@pytest.mark.parametrize(
    "r, c, room_r", [(37, 21, 48), (5, 3, 16), (19, 40, 30), (16, 8, 27), (1000, 37, 1024), (1013, 9, 2048)]
)
def test_transpose_edges_write_inside_their_rows(rng, r, c, room_r):
    """The partial blocks at a tile's ragged edge (masked loads and stores) read and write only
    their own floats: the rest of the rows around a strided source and destination is untouched
    (destination rows ``room_r`` floats apart, 1024 and 2048 among them: half blocks)."""
    big = rng.standard_normal((r, c + 9)).astype(np.float32)
    src = big[:, 4 : 4 + c]
    room = np.full((c, room_r), -7.0, np.float32)
    dst = room[:, 5 : 5 + r]
    _core.transpose(src[None], dst[None])
    np.testing.assert_array_equal(dst, src.T)
    assert (room[:, :5] == -7.0).all() and (room[:, 5 + r :] == -7.0).all()
