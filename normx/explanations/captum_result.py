"""normx's results as Captum's ``LLMAttributionResult`` (``captum.attr``), for Captum's plots and code that reads
its results: :meth:`Generation.to_captum` and :meth:`Explanation.to_captum`. Captum is imported only here, on the
first call (``pip install 'normx[captum]'``).

A generation reads as Captum's ``LLMAttribution`` / ``LLMGradientAttribution`` results do: the input features are
the prompt's tokens (``input_tokens`` in the tokenizer's own spelling, as Captum's ``TextTokenInput`` gives them,
BOS included unless skipped), the outputs are the generated tokens (``output_tokens``: the text each stands for,
newlines as ``\\n``, stripped of spaces, as Captum's own pretty tokens), ``token_attr[t]`` is generated token t's
scores over the prompt's tokens (its scores for earlier generated tokens are left out, as Captum leaves them out),
``seq_attr`` their sum over the generated tokens (as ``LLMGradientAttribution`` sums its token attributions into the
sequence's) and ``output_probs`` each generated token's probability.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from normx._torch import torch
from normx.errors import InvalidInputError

if TYPE_CHECKING:
    from captum.attr import LLMAttributionResult

CAPTUM_PIP = "pip install 'normx[captum]' (or pip install captum)"


def _result_class():
    try:
        from captum.attr import LLMAttributionResult
    except ModuleNotFoundError as exc:
        raise ImportError(f"to_captum needs captum ({exc.name} is missing): {CAPTUM_PIP}") from exc
    return LLMAttributionResult


def generation_result(generation, layer: int | None = None,
                      skip_tokens: Sequence[int | str] | None = None) -> LLMAttributionResult:
    """A :class:`~normx.explanations.generation_result.Generation` at ``layer`` (default: its last) as Captum's
    ``LLMAttributionResult``: see the module's docstring. ``skip_tokens``: prompt tokens to leave out of the input
    features, by id or by token (as Captum's ``TextTokenInput(skip_tokens=...)``, e.g. ``["<s>"]``)."""
    if generation.steps == 0:
        raise InvalidInputError("this generation has no generated tokens; Captum's result needs one or more")
    j = generation.layer_index(layer)
    skip = _skipped(skip_tokens)
    keep = [i for i in range(generation.prompt_length)
            if generation.token_ids[i] not in skip and generation.vocabulary_tokens[i] not in skip]
    token_attr = torch.from_numpy(np.ascontiguousarray(generation.scores[j][:, keep], dtype=np.float32))
    return _result_class()(
        input_tokens=[generation.vocabulary_tokens[i] for i in keep],
        output_tokens=[text.replace("\n", "\\n").strip() for text in generation.tokens[generation.prompt_length:]],
        seq_attr=token_attr.sum(0), token_attr=token_attr,
        output_probs=torch.from_numpy(np.asarray(generation.probabilities, dtype=np.float32)))


def explanation_result(explanation, layer: int | None = None) -> LLMAttributionResult:
    """An :class:`~normx.explanations.result.Explanation` at ``layer`` (default: its last) as Captum's
    ``LLMAttributionResult``: the input features are its units (tokens, or words after :meth:`Explanation.words`),
    the outputs its explained labels (with a foil, ``"label - foil"``), ``token_attr`` one row per label,
    ``seq_attr`` the first label's row (the target's: for one label, Captum's sum over the outputs) and
    ``output_probs`` the labels' probabilities (left out for a regression head)."""
    j = explanation.layer_index(layer)
    token_attr = torch.from_numpy(np.ascontiguousarray(explanation.scores[:, j, :], dtype=np.float32))
    foil = explanation.settings.get("foil")
    labels = [str(label) for label in explanation.labels]
    probabilities = [explanation.probabilities.get(label) for label in labels]
    probs = None if explanation.regression or any(p is None for p in probabilities) else \
        torch.tensor(probabilities, dtype=torch.float32)
    return _result_class()(
        input_tokens=list(explanation.tokens),
        output_tokens=labels if foil is None else [f"{label} - {foil}" for label in labels],
        seq_attr=token_attr[0].clone(), token_attr=token_attr, output_probs=probs)


def _skipped(skip_tokens: Sequence[int | str] | None) -> set:
    if skip_tokens is None:
        return set()
    if isinstance(skip_tokens, (str, int)) or not all(isinstance(t, (str, int)) and not isinstance(t, bool)
                                                      for t in skip_tokens):
        raise InvalidInputError(f"skip_tokens must be a list of token ids or tokens, got {skip_tokens!r}")
    return set(skip_tokens)
