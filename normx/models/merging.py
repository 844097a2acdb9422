"""A PEFT model's adapters merged into its base weights, for serving: the same function with fewer operations per
forward pass (LoRA adds two small matrix products and a sum to every adapted layer; merged, the layer is one product
again). peft does the merge; it is kept only where the merged model reproduces the adapter model's own outputs on a
probe text, as every other model support in normx is verified.
"""

from __future__ import annotations

import logging

from normx._torch import torch
from normx.errors import ModelLoadError
from normx.models.modules import unwrap_model

log = logging.getLogger(__name__)
PROBE = "A probe sentence, to check that the merged model gives the logits the adapter model gives."
RTOL = 1e-4  # of the logits' largest magnitude: float32 merging moves them by ~1e-7 of it


def mergeable(model) -> bool:
    """Whether ``model`` is a PEFT model whose adapters peft can merge (LoRA and its kin; not prompt learning)."""
    if unwrap_model(model) is model or not callable(getattr(model, "merge_adapter", None)):
        return False  # not a PEFT wrapper, or one whose tuner cannot merge
    config = getattr(model, "active_peft_config", None)
    return not getattr(config, "is_prompt_learning", False)


def merge_adapters(model, tokenizer, *, rtol: float = RTOL):
    """``(model, merged)``. A mergeable PEFT model (:func:`mergeable`, in eval mode, float32 or float64 weights)
    comes back as the plain transformers model with the adapters' weights merged in (``merged`` True) when its
    logits on a probe text equal the adapter model's within ``rtol`` of their largest magnitude; otherwise peft
    unmerges (the weights are back up to float rounding) and the adapter model comes back, with a warning
    (``merged`` False). Half-precision weights are not merged (the sum would round in them), nor is anything else.
    The merge happens in place: use the returned model, not the argument."""
    if not mergeable(model):
        return model, False
    if model.training:
        raise ModelLoadError("merge_adapters needs the model in eval mode (dropout would make the check fail); "
                             "call model.eval() first")
    dtypes = {parameter.dtype for parameter in model.parameters()}
    if not dtypes <= {torch.float32, torch.float64}:
        log.info("adapters not merged: %s weights would round the merge; serving the adapter model",
                 ", ".join(sorted(str(d).removeprefix("torch.") for d in dtypes)))
        return model, False
    probe = tokenizer(PROBE, return_tensors="pt").to(next(model.parameters()).device)
    before = _logits(model, probe)
    try:
        model.merge_adapter()
    except (ValueError, NotImplementedError, TypeError) as exc:  # peft refuses some configurations
        log.warning("adapters not merged (peft: %s): serving the adapter model", exc)
        return model, False
    gap = _gap(_logits(model, probe), before)
    if gap > rtol:
        model.unmerge_adapter()
        log.warning("adapters not merged: the merged model's logits moved by %.2g of their scale (allowed %.2g); "
                    "serving the adapter model", gap, rtol)
        return model, False
    merged = model.unload()  # the base layers, whose weights now hold the merge
    gap = _gap(_logits(merged, probe), before)
    if gap > rtol:
        raise ModelLoadError(f"the model peft unloaded after merging gives other logits than the adapter model "
                             f"({gap:.2g} of their scale): load it again without merging")
    return merged, True


def _logits(model, probe):
    with torch.no_grad():
        return model(**probe).logits.float()


def _gap(after, before) -> float:
    return float((after - before).abs().max() / before.abs().max().clamp_min(1e-12))
