"""The structure and types of a Keras model config (``Functional``, ``Model``, ``Sequential``,
nested models included), checked before anything is built."""

from __future__ import annotations

from ... import limits
from ...errors import ModelFileError, UnsupportedError

#: The model classes a config may hold (nested models included).
MODEL_CLASSES = {"Functional", "Model", "Sequential"}


def expect(condition: bool, where: str, field: str, expected: str, found) -> None:
    if not condition:
        raise ModelFileError(f"{where}: {field}: expected {expected}, found {limits.describe(found)}")


def _is_history(ref) -> bool:
    """A Keras tensor reference: [layer name, node index, tensor index]."""
    return (
        isinstance(ref, list)
        and len(ref) >= 3
        and isinstance(ref[0], str)
        and all(type(v) is int and 0 <= v <= limits.MAX_CONFIG_INT for v in ref[1:3])
    )


def _check_node(node, where: str, field: str) -> None:
    if isinstance(node, dict):
        expect(isinstance(node.get("args", []), list), where, f"{field}.args", "a list", node.get("args"))
        expect(isinstance(node.get("kwargs", {}), dict), where, f"{field}.kwargs", "an object", node.get("kwargs"))
        stack = [(node.get("args", []), f"{field}.args"), (node.get("kwargs", {}), f"{field}.kwargs")]
        while stack:
            value, path = stack.pop()
            if isinstance(value, dict) and value.get("class_name") == "__keras_tensor__":
                config = value.get("config")
                history = config.get("keras_history") if isinstance(config, dict) else None
                expect(
                    _is_history(history),
                    where,
                    f"{path}.config.keras_history",
                    "[layer name, node index, tensor index]",
                    history,
                )
            elif isinstance(value, dict):
                stack.extend((v, f"{path}.{k}") for k, v in value.items())
            elif isinstance(value, list):
                stack.extend((v, f"{path}[{i}]") for i, v in enumerate(value))
        return
    expect(
        isinstance(node, list) and node,
        where,
        field,
        "a Keras 3 node object or a tf.keras list of [layer, node, tensor, kwargs]",
        node,
    )
    for i, entry in enumerate(node):
        expect(
            _is_history(entry) and (len(entry) == 3 or isinstance(entry[3], dict)),
            where,
            f"{field}[{i}]",
            "[layer name, node index, tensor index, kwargs]",
            entry,
        )


def _check_io_refs(spec, where: str, field: str) -> None:
    ok = _is_history(spec) or (isinstance(spec, list) and spec and all(_is_history(s) for s in spec))
    expect(ok, where, field, "[layer, node, tensor] or a list of them", spec)


def check_config(entry, where: str, count: list | None = None, path: str = "config") -> None:
    """The structure and types of a Keras model config (``Functional``/``Model``/``Sequential``,
    nested models included) before anything is built: ModelFileError naming ``where`` and the
    field otherwise; layer and node counts against ``max_layers`` (``settings.current()``)."""
    count = [0] if count is None else count
    expect(
        isinstance(entry, dict) and isinstance(entry.get("class_name"), str) and isinstance(entry.get("config"), dict),
        where,
        path,
        "an object with a string 'class_name' and an object 'config'",
        entry,
    )
    class_name, cfg = entry["class_name"], entry["config"]
    if class_name not in MODEL_CLASSES:
        raise UnsupportedError(f"{where}: model class {class_name!r} is not supported")
    layers = cfg.get("layers")
    expect(isinstance(layers, list), where, f"{path}.config.layers", "a list of layers", layers)
    expect(
        cfg.get("name") is None or isinstance(cfg.get("name"), str),
        where,
        f"{path}.config.name",
        "a string",
        cfg.get("name"),
    )
    for i, layer in enumerate(layers):
        field = f"{path}.config.layers[{i}]"
        expect(
            isinstance(layer, dict)
            and isinstance(layer.get("class_name"), str)
            and isinstance(layer.get("config"), dict),
            where,
            field,
            "an object with a string 'class_name' and an object 'config'",
            layer,
        )
        limits.count_layers(count, where)
        if layer["class_name"] in MODEL_CLASSES:
            check_config(layer, where, count, field)
        name = layer.get("name", layer["config"].get("name"))
        expect(
            isinstance(name, str) or (class_name == "Sequential" and name is None),
            where,
            f"{field}.name",
            "a string",
            name,
        )
        if class_name == "Sequential":
            continue
        nodes = layer.get("inbound_nodes", [])
        expect(isinstance(nodes, list), where, f"{field}.inbound_nodes", "a list", nodes)
        limits.count_layers(count, where, len(nodes))
        for j, node in enumerate(nodes):
            _check_node(node, where, f"{field}.inbound_nodes[{j}]")
    if class_name == "Sequential":
        shape = cfg.get("build_input_shape")
        expect(shape is None or is_shape(shape), where, f"{path}.config.build_input_shape", "a list of sizes", shape)
        return
    for key in ("input_layers", "output_layers"):
        _check_io_refs(cfg.get(key), where, f"{path}.config.{key}")


def is_shape(shape) -> bool:
    return (
        isinstance(shape, list)
        and 1 <= len(shape) <= 16
        and all(d is None or (type(d) is int and 0 <= d <= limits.MAX_CONFIG_INT) for d in shape)
    )
