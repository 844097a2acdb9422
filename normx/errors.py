"""Exception types raised by normx.

Every error a user can cause derives from :class:`NormxError`; input errors are also :class:`ValueError`
so generic callers can catch them the usual way. Messages say what was given and what is allowed.
"""

from __future__ import annotations


class NormxError(Exception):
    """Base class of every normx error."""


class InvalidInputError(NormxError, ValueError):
    """A text, pair, option or argument value that normx cannot use."""


class EmptyTextError(InvalidInputError):
    """An empty or whitespace-only text."""


class InputTooLongError(InvalidInputError):
    """A text longer than the model accepts, with ``truncation="error"``."""


class UnknownTargetError(InvalidInputError):
    """A target or foil label that the model does not have."""


class LayerOutOfRangeError(InvalidInputError):
    """A layer index outside ``0..num_layers`` (or its negative counterpart)."""


class PairNotSupportedError(InvalidInputError):
    """A text pair given to a model that takes single texts."""


class PairRequiredError(InvalidInputError):
    """A single text given to a model trained on sentence pairs."""


class UnknownMethodError(NormxError, KeyError):
    """A method name that is not registered."""

    def __str__(self) -> str:  # KeyError quotes its message; keep it readable
        return str(self.args[0]) if self.args else ""


class UnsupportedModelError(NormxError, TypeError):
    """A model class that has no registered head-on-top adapter."""


class HookNotFiredError(NormxError, RuntimeError):
    """A capture hook was registered but its module never ran during the forward pass."""


class ModelLoadError(NormxError, OSError):
    """A model name or path that cannot be loaded (missing folder, missing package, offline hub id)."""


class WorkBudgetError(InvalidInputError):
    """A request whose estimated work is over the budget a server allows (:class:`normx.serving.lanes.WorkGate`)."""


class InputWarning(UserWarning):
    """Something normx did to an input that changes what is explained, said where Python users look (besides the
    result's ``warnings``): a text truncated to the model's limit, characters the tokenizer does not know."""


class CacheWarning(UserWarning):
    """Something wrong found in normx's cache and repaired: a damaged cache entry converted again from its file."""
