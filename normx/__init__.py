"""normx: NormXLogit token attributions for Hugging Face transformers.

``explain`` is thread-safe: one loaded model can serve many threads at once (see :mod:`normx.core.concurrency`).

>>> model, tokenizer = normx.load_model("path/or/hub-id")
>>> explanation = normx.explain(model, tokenizer, "a gripping, beautifully acted film")

``import normx`` is instant: the names below (and the subpackages) load on first use, so that commands such as
``normx --help`` or ``normx models`` never import torch.

The package's layers, each a folder whose docstring says what it owns and may import (``tests/test_structure.py``
holds the allowed edges): ``models`` (what normx knows of models) < ``core`` (hooks, concurrency, inputs, labels,
the forward pass) < ``methods`` (the registry and every method) < ``explanations`` (``explain`` and its result)
< ``context`` (``explain_context``: which part of a context a response came from);
``data`` (data sets) and ``zoo`` (offline presets, training) beside them; ``bulk``, ``evaluation`` and ``serving``
above; ``cli`` and ``integrations`` (other libraries' APIs: inseq) on top.
"""

from __future__ import annotations

import importlib

from normx._version import __version__  # noqa: F401 (normx.__version__)
from normx.errors import (
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

# public name -> the module that defines it (imported on first access)
_LAZY = {
    "Adapter": "models", "get_adapter": "models", "register_adapter": "models", "supported_models": "models",
    "capture": "core.hooks", "Method": "methods", "Option": "methods", "describe_methods": "methods",
    "list_methods": "methods", "register_method": "methods", "explain": "explanations.explain",
    "list_presets": "zoo.presets", "Explanation": "explanations.result",
    "explain_generation": "explanations.generation", "Generation": "explanations.generation_result",
    "explain_context": "context.explain", "ContextAttribution": "context.result",
    "load_attributions": "bulk.read", "corpus_summary": "bulk.read",
}
# the public submodules that live in a layer's folder
_MODULES = {"decompx": "methods.decompx", "mixing": "methods.mixing"}


def __getattr__(name: str):
    if name in _LAZY:
        value = getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    else:
        module = _MODULES.get(name, name)
        try:  # a subpackage: normx.methods, normx.mixing, ...
            value = importlib.import_module(f".{module}", __name__)
        except ModuleNotFoundError as exc:
            if exc.name != f"{__name__}.{module}":
                raise
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


def attribute_dataset(model, tokenizer, source, out, **kwargs):
    """Explain every row of a corpus into Parquet shards (streamed, resumable, torchrun-aware); see
    :func:`normx.bulk.attribute.attribute_dataset`."""
    from normx.bulk.attribute import attribute_dataset as _attribute

    return _attribute(model, tokenizer, source, out, **kwargs)


def load_model(name_or_path: str = "minilm-sst2", **kwargs):
    """Load ``(model, tokenizer)`` from a local folder, a hub id (online) or a PEFT adapter folder."""
    from normx.zoo.loading import load_model as _load

    return _load(name_or_path, **kwargs)


__all__ = [
    "Adapter", "ContextAttribution", "EmptyTextError", "Explanation", "Generation", "HookNotFiredError",
    "InputTooLongError",
    "InvalidInputError", "LayerOutOfRangeError", "Method", "ModelLoadError", "NormxError", "Option",
    "PairNotSupportedError", "PairRequiredError", "UnknownMethodError", "UnknownTargetError", "UnsupportedModelError",
    "WorkBudgetError", "attribute_dataset", "capture", "corpus_summary", "describe_methods", "explain",
    "explain_context", "explain_generation", "get_adapter", "list_methods", "list_presets", "load_attributions",
    "load_model",
    "register_adapter", "register_method", "supported_models",
]
