"""Exceptions raised by fastlayers.

Every error names the layer, model file or operator it concerns, what was expected and what was
found, so a service can log it and a user can act on it without a traceback dive.
"""


class FastlayersError(Exception):
    """Base class of every error fastlayers raises on purpose."""


class InputError(FastlayersError, ValueError):
    """An input value is invalid for a layer (for example an embedding index out of range)."""


class ShapeError(InputError):
    """An input or weight has the wrong shape, rank or dtype."""


class UnsupportedError(FastlayersError, NotImplementedError):
    """A layer, option, operator or backend that fastlayers does not implement."""


class ModelFileError(FastlayersError, OSError):
    """A model or weight file that is missing, corrupt, truncated or refused as unsafe."""


class SettingError(FastlayersError, ValueError):
    """A setting fastlayers cannot use: an environment variable's value, or a field of
    ``LoadOptions``; the message names the variable or field."""


class StateDictError(FastlayersError, RuntimeError):
    """A state dict whose keys do not match a module's (missing or unexpected keys), as torch's
    ``load_state_dict`` reports them."""


class MismatchError(FastlayersError, AssertionError):
    """Two engines' outputs on the same inputs differ beyond the tolerance (``fastlayers bench
    --against onnxruntime`` and the pytest plugin refuse to time them)."""


def native_core_missing(package_dir: str) -> str:
    """The message of the ImportError raised where fastlayers' compiled core was never built."""
    return (
        f"fastlayers' compiled core (fastlayers.native._core) is not built in {package_dir}: "
        "install the package with `pip install .` (or `pip install -e .` for a source "
        "tree), which compiles it; Python started in a source checkout imports that "
        "checkout, not the installed copy"
    )
