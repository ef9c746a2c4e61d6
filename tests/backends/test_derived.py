"""``derived_view``: arrays derived from weight views, cached per view object and per viewed
region."""

import gc

import numpy as np

from fastlayers.backends import derived


def test_a_view_asked_again_returns_its_entry_without_making_it_again():
    buffer = np.arange(40, dtype=np.float32)
    view = buffer[8:24].reshape(4, 4)
    made = []

    def make(v):
        made.append(1)
        return v * 2

    first = derived.derived_view(view, "test-double", make)
    assert derived.derived_view(view, "test-double", make) is first
    # a new view of the same region (a slice made per call) finds the same entry
    again = buffer[8:24].reshape(4, 4)
    assert derived.derived_view(again, "test-double", make) is first
    assert len(made) == 1
    np.testing.assert_array_equal(first, view * 2)
    # another region, or another kind, is another entry
    other = derived.derived_view(buffer[0:16].reshape(4, 4), "test-double", make)
    assert other is not first and len(made) == 2
    assert derived.derived_view(view, "test-triple", lambda v: v * 3) is not first


def test_a_views_entry_goes_with_the_view():
    buffer = np.arange(16, dtype=np.float32)
    view = buffer[4:12]
    derived.derived_view(view, "test-gone", lambda v: v + 1)
    key = (id(view), "test-gone")
    assert key in derived._cache
    del view
    gc.collect()
    assert key not in derived._cache


def test_clear_derived_forgets_view_entries():
    buffer = np.arange(16, dtype=np.float32)
    view = buffer[2:10]
    first = derived.derived_view(view, "test-clear", lambda v: v.copy())
    derived.clear_derived()
    assert derived.derived_view(view, "test-clear", lambda v: v.copy()) is not first


def test_views_apart_in_strides_or_type_are_entries_apart():
    """The key of a viewed region holds its offset, shape, strides and type: a transpose made
    anew per call (``weight.T``) finds its entry, a view of other strides or type does not."""
    w = np.arange(24, dtype=np.float32).reshape(4, 6)
    first = derived.derived_view(w.T, "test-regions", lambda v: v.copy())
    assert derived.derived_view(w.T, "test-regions", lambda v: v.copy()) is first
    strided = derived.derived_view(w[:, ::2].T, "test-regions", lambda v: v.copy())
    typed = derived.derived_view(w.view(np.int32).T, "test-regions", lambda v: v.copy())
    assert strided is not first and typed is not first and typed.dtype == np.int32
    np.testing.assert_array_equal(first, w.T)
    np.testing.assert_array_equal(strided, w[:, ::2].T)
