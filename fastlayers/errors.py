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


class StateDictError(FastlayersError, RuntimeError):
    """A state dict whose keys do not match a module's (missing or unexpected keys), as torch's
    ``load_state_dict`` reports them."""
