"""State dicts: the tensors of a PyTorch file (``torch.save`` archive or legacy pickle, a
sharded checkpoint's index, or a ``.safetensors`` file through ``fastlayers.io.safetensors``) as
numpy arrays, without torch (``load_state_dict``).

A sharded checkpoint's index (``*.index.json``) may take at most ``torch_max_index_bytes`` and
name at most ``torch_max_shards`` shards (``settings.current()``); its shards are torch or
safetensors files, never other indexes.
"""

from __future__ import annotations

from collections import OrderedDict
from pathlib import Path

import numpy as np

from ... import settings
from ...errors import FastlayersError, InputError, ModelFileError, UnsupportedError
from .archive import read_torch_pickle
from .records import UnknownGlobal, brepr, is_module_like


def _as_state_dict(obj, where: str) -> OrderedDict[str, np.ndarray]:
    if is_module_like(obj):
        if isinstance(obj, UnknownGlobal):
            raise UnsupportedError(f"{where}: holds an instance of {obj.global_name}")
        try:
            obj = obj.state_dict()
        except ModelFileError as e:
            raise ModelFileError(f"{where}: {e}") from None
    if not isinstance(obj, dict):
        raise ModelFileError(f"{where}: holds a {type(obj).__name__}, not a state dict")
    out: OrderedDict = OrderedDict()
    bad = []
    for k, v in obj.items():
        if isinstance(k, str) and isinstance(v, np.ndarray):
            out[k] = v
        else:
            bad.append(k)
    if bad:
        nested = [
            k for k in bad if isinstance(obj[k], dict) and any(isinstance(v, np.ndarray) for v in obj[k].values())
        ]
        hint = f"; the tensors are under the key(s) {brepr(nested)}: pass key={brepr(nested[0])}" if nested else ""
        raise ModelFileError(f"{where}: not a state dict: entries {brepr(bad[:5])} are not tensors{hint}")
    return out


def load_state_dict(
    path, key: str | None = None, options: settings.LoadOptions | None = None
) -> OrderedDict[str, np.ndarray]:
    """Read the tensors of a PyTorch or safetensors file as numpy arrays, without torch.

    Parameters
    ----------
    path : str or os.PathLike
        A ``torch.save`` file (zip archive or legacy pickle, e.g. ``model.pt``,
        ``pytorch_model.bin``) holding a state dict or a whole ``torch.nn`` module, a
        ``.safetensors`` file (needs the ``safetensors`` package: ``fastlayers[safetensors]``), or
        a sharded checkpoint's ``*.index.json`` (its shards are read from the same folder).
    key : str, optional
        For checkpoints that nest the state dict, e.g. ``{"model": state_dict, "epoch": 3}``:
        the entry to return.
    options : fastlayers.LoadOptions, optional
        The limits the file is read within (its ``max_*`` and ``torch_*`` fields); by default
        the process's (``fastlayers.settings``).

    Returns
    -------
    OrderedDict[str, numpy.ndarray]
        Keys as torch names them. dtypes are kept (float32, float16, float64, int64, bool, ...),
        except bfloat16, widened exactly to float32. A whole pickled module gives its
        ``state_dict()``. Contiguous views of one storage share memory, as in torch.

    Raises
    ------
    ModelFileError
        Missing, truncated or corrupt file; a pickle that references any global outside the
        admitted table (docs/formats.md), which is refused before anything runs.
    UnsupportedError
        TorchScript archives; safetensors without the package.

    Shape
    -----
    Each array has the tensor's shape (size), C-contiguous.
    """
    with settings.applied(options):
        return _load_state_dict(path, key)


def _load_state_dict(path, key):
    p = Path(path)
    where = str(path)
    if not p.is_file():
        raise ModelFileError(f"{where}: no such file")
    from ..safetensors import is_safetensors, load_safetensors

    if p.name.lower().endswith(".index.json"):
        if key is not None:
            raise InputError(f"{where}: a sharded checkpoint index is flat; key={key!r} does not apply")
        return _load_sharded(p, where)
    if p.suffix.lower() == ".safetensors" or is_safetensors(p):
        sd = load_safetensors(p)
        if key is not None:
            raise InputError(f"{where}: a safetensors file is flat; key={key!r} does not apply")
        return sd
    obj = read_torch_pickle(p)
    if key is not None:
        if not isinstance(obj, dict) or key not in obj:
            raise ModelFileError(
                f"{where}: has no entry {brepr(key)}"
                + (f" (entries: {brepr(list(obj)[:10])})" if isinstance(obj, dict) else "")
            )
        obj = obj[key]
    return _as_state_dict(obj, where)


def _load_sharded(p: Path, where: str) -> OrderedDict[str, np.ndarray]:
    """A Hugging Face sharded checkpoint: ``{"weight_map": {tensor name: shard file}}`` beside
    its shards (``pytorch_model.bin.index.json``, ``model.safetensors.index.json``)."""
    import json

    try:
        size, limit = p.stat().st_size, settings.current().torch_max_index_bytes
        if size > limit:
            raise ValueError(f"{size} bytes, over the limit of {limit} (FASTLAYERS_TORCH_MAX_INDEX_BYTES)")
        index = json.loads(p.read_text(encoding="utf-8"))
        if not isinstance(index, dict):
            raise TypeError(f"the index is a JSON {type(index).__name__}, not an object")
        weight_map = index["weight_map"]
        if not isinstance(weight_map, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in weight_map.items()
        ):
            raise TypeError("weight_map must map tensor names to shard file names")
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError, RecursionError, MemoryError) as e:
        raise ModelFileError(f"{where}: not a sharded checkpoint index ({type(e).__name__}: {str(e)[:200]})") from None
    names = list(dict.fromkeys(weight_map.values()))
    limit = settings.current().torch_max_shards
    if len(names) > limit:
        raise ModelFileError(
            f"{where}: names {len(names)} shards, over the limit of {limit} (FASTLAYERS_TORCH_MAX_SHARDS)"
        )
    for shard in names:
        if Path(shard).name != shard or shard.startswith("."):
            raise ModelFileError(f"{where}: shard {brepr(shard)} must be a file name beside the index")
        if shard.lower().endswith(".json"):
            raise ModelFileError(
                f"{where}: shard {brepr(shard)} is an index (a .json file): shards are "
                "torch or safetensors files, and an index never names another"
            )
    shards: dict[str, OrderedDict] = {}
    for shard in names:
        try:
            shards[shard] = load_state_dict(p.parent / shard)
        except FastlayersError as e:
            raise type(e)(f"{where}: shard {brepr(shard)}: {e}") from None
    out: OrderedDict = OrderedDict()
    for name, shard in weight_map.items():
        if name not in shards[shard]:
            raise ModelFileError(f"{where}: tensor {brepr(name)} is not in its shard {brepr(shard)}")
        out[name] = shards[shard][name]
    return out
