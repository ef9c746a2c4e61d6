"""Keras model configs -> fastlayers models: ``build_model`` replays the recorded layer calls
(Keras 3 and tf.keras 2 node formats) in dependency order; ``build_operation`` rebuilds Keras 3
operation nodes (arithmetic on symbolic tensors)."""

from __future__ import annotations

from collections import defaultdict, deque

import numpy as np

from ... import limits
from ...errors import ModelFileError, UnsupportedError
from .config import MODEL_CLASSES, check_config, expect, is_shape
from .creators import build_error, build_layer

#: Keras 3 operation nodes (``module`` keras.src.ops.*: ``x + 3.0``, ``a + b`` on symbolic
#: tensors) that fastlayers rebuilds, as ``layers.BinaryOp`` ops.
_OPERATIONS = {"Add": "add", "Subtract": "subtract", "Multiply": "multiply", "Divide": "divide", "TrueDivide": "divide"}


def _is_operation(entry) -> bool:
    """A Keras 3 operation node: its module (``.keras``), or in a legacy ``.h5`` (no modules)
    an operation's class name with a config of only its name (layers also record trainable
    and dtype)."""
    module = entry.get("module")
    if module is None:
        return entry["class_name"] in _OPERATIONS and set(entry["config"]) <= {"name"}
    return isinstance(module, str) and module.startswith("keras.src.ops.")


def _is_tensor(arg) -> bool:
    return isinstance(arg, dict) and arg.get("class_name") == "__keras_tensor__"


def build_operation(entry: dict, where: str):
    """A Keras 3 operation node (one call of ``op(a, b)``, each operand a tensor or a number) as
    a ``layers.BinaryOp``; UnsupportedError for other operations or operands."""
    from ...layers import BinaryOp

    class_name = entry["class_name"]
    name = entry.get("name") or entry["config"].get("name")
    here = f"{where}: operation {name!r} ({entry.get('module')}.{class_name})"
    op = _OPERATIONS.get(class_name)
    if op is None:
        raise UnsupportedError(
            f"{here}: this Keras operation is not supported (supported: "
            f"{', '.join(sorted(_OPERATIONS))} between tensors and numbers)"
        )
    nodes = entry.get("inbound_nodes", [])
    if len(nodes) != 1 or not isinstance(nodes[0], dict):
        raise ModelFileError(f"{here}: expected one Keras 3 call node, found {limits.describe(nodes)}")
    args, kwargs = nodes[0].get("args", []), nodes[0].get("kwargs", {})
    if len(args) != 2 or kwargs:
        raise UnsupportedError(
            f"{here}: expected two operands and no keyword arguments, found {len(args)} operand(s) and {sorted(kwargs)}"
        )
    constants = []
    for arg in args:
        if _is_tensor(arg):
            constants.append(None)
        elif (type(arg) is float and np.isfinite(arg)) or (type(arg) is int and abs(arg) <= limits.MAX_CONFIG_INT):
            constants.append(float(arg))
        else:
            raise UnsupportedError(f"{here}: operand {limits.describe(arg)} is neither a tensor nor a finite number")
    if None not in constants:
        raise ModelFileError(f"{here}: no tensor operand")
    return BinaryOp(op, constants, name=name)


# ----------------------------------------------------------------------------- config -> model
def _inbound_refs(node) -> tuple:
    """Keras 3 node {"args": [...], "kwargs": {...}} or tf.keras 2 [[name, node, tensor, kw], ...]
    as (structure of (layer name, node index, tensor index), extra args, kwargs)."""
    if isinstance(node, dict):

        def conv(obj):
            if isinstance(obj, dict) and obj.get("class_name") == "__keras_tensor__":
                return tuple(obj["config"]["keras_history"][:3])
            if isinstance(obj, (list, tuple)):
                return [conv(o) for o in obj]
            return obj

        args = [conv(a) for a in node.get("args", [])]
        kwargs = {k: conv(v) for k, v in node.get("kwargs", {}).items() if v is not None}
        first = args[0] if args else None
        return first, args[1:], kwargs
    refs = [tuple(entry[:3]) for entry in node]
    kwargs = node[0][3] if node and len(node[0]) > 3 and node[0][3] else {}
    return (refs[0] if len(refs) == 1 else refs), [], dict(kwargs)


def _refs_in(obj, out: set) -> set:
    """The (layer, node, tensor) references anywhere in ``obj``."""
    stack = [obj]
    while stack:
        value = stack.pop()
        if isinstance(value, tuple):
            out.add(value)
        elif isinstance(value, list):
            stack.extend(value)
        elif isinstance(value, dict):
            stack.extend(value.values())
    return out


def build_model(entry: dict, where: str, weight_elements: int | None = None, _checked=False):
    """Rebuild a Keras ``Functional``/``Sequential`` config as a fastlayers model (the config is
    checked first: ``check_config``)."""
    from ...layers import BinaryOp
    from ...model.graph import Input, InputLayer, Model, Sequential

    if not _checked:
        limits.check_depth(entry, where, "the model config")
        check_config(entry, where)
    class_name, cfg = entry["class_name"], entry["config"]
    model_name = cfg.get("name")

    def build(e):
        if e["class_name"] in MODEL_CLASSES:
            return build_model(e, where, weight_elements, True)
        if _is_operation(e):
            return build_operation(e, where)
        return build_layer(e["class_name"], e["config"], where, weight_elements)

    if class_name == "Sequential":
        layers = [build(e) for e in cfg["layers"]]
        try:
            if not isinstance(layers[0] if layers else None, InputLayer):
                shape = cfg.get("build_input_shape") or (layers[0]._batch_input_shape if layers else None)
                first_cfg = cfg["layers"][0]["config"] if cfg["layers"] else {}
                shape = shape or first_cfg.get("batch_input_shape") or first_cfg.get("batch_shape")
                if shape is None:
                    raise ModelFileError(f"{where}: Sequential {model_name!r} has no input shape")
                expect(is_shape(list(shape)), where, f"Sequential {model_name!r} input shape", "a list of sizes", shape)
                layers.insert(0, Input(batch_shape=shape).node.layer)
            return Sequential(layers, name=model_name)
        except Exception as e:  # a config from a file: any failure is the file's
            raise build_error(f"{where}: Sequential {model_name!r}", e) from e
    layers, entries = {}, {}
    for e in cfg["layers"]:
        if e["class_name"] == "NotEqual":
            # Keras 3 records Embedding(mask_zero=True)'s mask as a NotEqual op feeding `mask=`
            # kwargs (dropped below); recurrent layers recompute that mask (PaddingMask). A
            # NotEqual used as an ordinary input leaves its consumers unresolved: a clear error.
            # A mask the caller gave (`layer(x, mask=m)`, m an input or a layer's output) is kept.
            continue
        lname = e.get("name") or e["config"]["name"]
        if lname in layers:
            raise ModelFileError(f"{where}: model {model_name!r} has two layers named {lname!r}")
        layers[lname] = build(e)
        entries[lname] = e
    outputs: dict[tuple, object] = {}  # (layer, node index, tensor index) -> symbolic tensor

    def resolve(ref):
        if isinstance(ref, list):
            return [resolve(r) for r in ref]
        if isinstance(ref, tuple):
            return outputs[ref]
        return ref

    # replay the calls in dependency order (Kahn): each waits for the calls producing its inputs
    items, waiting, missing = [], defaultdict(list), []
    done = {(lname, 0) for lname, layer in layers.items() if isinstance(layer, InputLayer)}
    for lname in done:
        outputs[(lname[0], 0, 0)] = layers[lname[0]].output
    ready = deque()
    for lname, e in entries.items():
        for index, node in enumerate(e.get("inbound_nodes", [])):
            first, extra, kwargs = _inbound_refs(node)
            mask = kwargs.pop("mask", None)
            mask_refs = _refs_in([mask], set())
            if mask_refs and all(r[0] in layers for r in mask_refs):  # the caller's, not a NotEqual
                kwargs["mask"] = mask
            kwargs.pop("training", None)
            producers = {r[:2] for r in _refs_in([first, extra, kwargs], set())} - done
            item = len(items)
            items.append((lname, index, first, extra, kwargs))
            missing.append(len(producers))
            for p in producers:
                waiting[p].append(item)
            if not producers:
                ready.append(item)
    replayed = 0
    while ready:
        item = ready.popleft()
        lname, index, first, extra, kwargs = items[item]
        here = f"{where}: layer {lname!r} ({type(layers[lname]).__name__}) call {index}"
        try:
            args, extra_args = resolve(first), [resolve(a) for a in extra]
            kwargs = {k: resolve(v) for k, v in kwargs.items()}
        except KeyError as e:
            raise ModelFileError(f"{here}: input {e.args[0]} is not an output of that layer call") from None
        if isinstance(layers[lname], BinaryOp):  # its tensor operands, as a list
            args, extra_args = [a for a in (args, *extra_args) if type(a) not in (int, float)], []
        try:
            out = layers[lname](args, *extra_args, **kwargs)
        except Exception as e:  # a graph from a file: any failure is the file's
            raise build_error(here, e) from e
        for t, tensor in enumerate(out if isinstance(out, list) else [out]):
            outputs[(lname, index, t)] = tensor
        replayed += 1
        for waiter in waiting.pop((lname, index), ()):
            missing[waiter] -= 1
            if missing[waiter] == 0:
                ready.append(waiter)
    if replayed != len(items):
        stuck = [items[i][0] for i in range(len(items)) if missing[i] > 0]
        raise ModelFileError(
            f"{where}: the graph of {model_name!r} cannot be rebuilt (unresolved inputs for {stuck[:5]})"
        )

    def refs(spec, key):
        """A single [name, node, tensor] (or a one-element list of them, which Keras unwraps)
        gives one tensor; several give a list."""
        specs = [spec] if isinstance(spec[0], str) else spec
        tensors = []
        for s in specs:
            if tuple(s[:3]) not in outputs:
                raise ModelFileError(f"{where}: {key} of {model_name!r}: {s[:3]} is not a layer output")
            tensors.append(outputs[tuple(s[:3])])
        return tensors[0] if len(tensors) == 1 else tensors

    inputs, outs = refs(cfg["input_layers"], "input_layers"), refs(cfg["output_layers"], "output_layers")
    try:
        return Model(inputs, outs, name=model_name)
    except Exception as e:
        raise build_error(f"{where}: model {model_name!r}", e) from e
