"""The primitives of the cuda backend that read ids (``IndexingOps``, a base class of
CudaOps): their checks, embeddings and the hierarchical softmax's paths.

Ids on the device are checked on the device: a float that is not a whole number, or an id out
of range, sets a one-element flag. ``indices`` reads that flag once per call
(``Transfers.flag_reads``) and, where it is set, re-runs the reference check on host copies,
which raises the layer's error; ``embedding`` and ``hsoftmax_class_log_probs`` give zeros for
such ids and set the flag their caller passes as ``bad``. ``check_rois`` reads device RoIs
back for the reference check of their batch indices.
"""

from __future__ import annotations

import math

import numpy as np

from ...errors import InputError
from . import strided_kernels as S
from .device import TRANSFERS, DeviceOps, serialized_in_simulator
from .runtime import is_device, to_device, to_host
from .views import flat, grid1, grid2


class IndexingOps(DeviceOps):
    """CudaOps' primitives over ids (a base class of ``CudaOps``)."""

    def _indices(self, ids, bad):
        """``ids`` as a flat int64 device array; device floats are checked to be whole numbers
        (else index -1 and bad[0] = 1); host ids were checked by the layer."""
        n = math.prod(ids.shape)
        if not is_device(ids):
            return to_device(np.asarray(ids).astype(np.int64).reshape(n), np.int64)
        if ids.dtype == np.int64:
            return flat(ids) if n else ids.reshape(0)
        out = self._empty((n,), np.int64)
        if n:
            g, t = grid1(n, self.sim)
            S.whole_floats_to_int64[g, t](flat(ids), out, bad)
        return out

    @serialized_in_simulator
    def indices(self, ids, size, where, what="indices"):
        """As ReferenceOps.indices; device ids are checked on the device (whole numbers, in
        range) into a flag read once here, and come back as int64 device ids."""
        if not is_device(ids):
            return super().indices(ids, size, where, what)
        flag = self.zeros((1,))
        shape = tuple(ids.shape)
        di = self._indices(ids, flag)
        if di.shape[0]:
            g, t = grid1(di.shape[0], self.sim)
            S.check_range[g, t](di, np.int64(size), flag)
        TRANSFERS.flag_reads += 1
        if to_host(flag)[0]:
            super().indices(to_host(ids), size, where, what)  # raises the layer's error
            raise InputError(f"{where}: {what} outside [0, {size}) or not whole numbers")
        return di.reshape(shape)

    def check_rois(self, rois, batch, where):
        """As ReferenceOps.check_rois; device rois (K, 5) are read back for the check."""
        if not is_device(rois):
            return super().check_rois(rois, batch, where)
        TRANSFERS.flag_reads += 1
        super().check_rois(to_host(rois), batch, where)
        return rois

    @serialized_in_simulator
    def embedding(self, ids, table, bad=None):
        """y[..., :] = table[ids[...], :]. On the device an id that is not a whole number in
        [0, V) gives a zero row and, given a one-element device array ``bad``, sets bad[0] = 1
        (the Embedding layer checks host ids itself)."""
        dev = is_device(ids)
        flag = self.zeros((1,)) if bad is None else bad
        shape = tuple(ids.shape)
        di = self._indices(ids, flag)
        out = self._empty((di.shape[0], table.shape[1]))
        if di.shape[0] and table.shape[1]:
            blocks, threads = grid2(table.shape[1], di.shape[0], self.sim)
            S.gather_rows[blocks, threads](di, self._weight(table), out, flag)
        return self._back(out.reshape(shape + (table.shape[1],)), dev)

    @serialized_in_simulator
    def hsoftmax_log_probs(self, x, w_in, b_n, path_nodes, path_signs):
        dev = is_device(x)
        if x.shape[0] == 0:
            return self._host_path(
                is_device(x), super().hsoftmax_log_probs(to_host(x), w_in, b_n, path_nodes, path_signs)
            )
        z = self.dense(to_device(x), w_in, b_n)
        out = self._empty((z.shape[0], path_nodes.shape[0]))
        blocks, threads = grid2(path_nodes.shape[0], z.shape[0], self.sim)
        S.hsoftmax_rows[blocks, threads](z, self._weight(path_nodes), self._weight(path_signs), out)
        return self._back(out, dev)

    @serialized_in_simulator
    def hsoftmax_class_log_probs(self, x, w_in, b_n, path_nodes, path_signs, classes, bad=None):
        """As ReferenceOps; on the device a class that is not a whole number in [0, C) gives 0 and,
        given a one-element device array ``bad``, sets bad[0] = 1."""
        dev = is_device(x)
        if x.shape[0] == 0:
            return self._host_path(
                is_device(x),
                super().hsoftmax_class_log_probs(to_host(x), w_in, b_n, path_nodes, path_signs, to_host(classes)),
            )
        flag = self.zeros((1,)) if bad is None else bad
        z = self.dense(to_device(x), w_in, b_n)
        dc = self._indices(classes, flag)
        out = self._empty((z.shape[0],))
        g, t = grid1(z.shape[0], self.sim)
        S.hsoftmax_class_rows[g, t](z, self._weight(path_nodes), self._weight(path_signs), dc, out, flag)
        return self._back(out, dev)
