"""normx: NormXLogit token attributions for Hugging Face transformers.

``explain`` is thread-safe: one loaded model can serve many threads at once (see :mod:`normx.sharing`).

>>> model, tokenizer = normx.load_model("path/or/hub-id")
>>> explanation = normx.explain(model, tokenizer, "a gripping, beautifully acted film")
"""

from . import decompx, gradients, logat, mixing  # noqa: F401  (the built-in methods register themselves)
from .adapters import Adapter, get_adapter, register_adapter, supported_models
from .errors import (
    EmptyTextError,
    HookNotFiredError,
    InputTooLongError,
    InvalidInputError,
    LayerOutOfRangeError,
    ModelLoadError,
    NormxError,
    PairNotSupportedError,
    PairRequiredError,
    UnknownMethodError,
    UnknownTargetError,
    UnsupportedModelError,
    WorkBudgetError,
)
from .hooks import capture
from .methods import Method, Option, describe_methods, list_methods, register_method
from .pipeline import explain
from .presets import list_presets
from .result import Explanation

__version__ = "0.1.0"


def attribute_dataset(model, tokenizer, source, out, **kwargs):
    """Explain every row of a corpus into Parquet shards (streamed, resumable, torchrun-aware); see
    :func:`normx.bulk.attribute_dataset`."""
    from .bulk import attribute_dataset as _attribute

    return _attribute(model, tokenizer, source, out, **kwargs)


def load_model(name_or_path: str = "minilm-sst2", **kwargs):
    """Load ``(model, tokenizer)`` from a local folder, a hub id (online) or a PEFT adapter folder."""
    from .loading import load_model as _load

    return _load(name_or_path, **kwargs)


__all__ = [
    "Adapter",
    "EmptyTextError",
    "Explanation",
    "HookNotFiredError",
    "InputTooLongError",
    "InvalidInputError",
    "LayerOutOfRangeError",
    "Method",
    "ModelLoadError",
    "NormxError",
    "Option",
    "PairNotSupportedError",
    "PairRequiredError",
    "UnknownMethodError",
    "UnknownTargetError",
    "UnsupportedModelError",
    "WorkBudgetError",
    "capture",
    "describe_methods",
    "explain",
    "get_adapter",
    "list_methods",
    "list_presets",
    "load_model",
    "register_adapter",
    "register_method",
    "supported_models",
]
