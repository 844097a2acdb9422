"""Fine-tuning a masked LM on BLiMP minimal pairs, as the NormXLogit paper prepares its Experiment 2 models.

The paper fine-tunes BERT / RoBERTa for one epoch on BLiMP with the target word masked and a two-way
cross-entropy over the logits of the good and the bad word at the mask (their "BLIMP Training" notebook), then
measures evidence alignment on held-out pairs. Here the pairs are the ones the evidence rules cover
(:mod:`normx.data.blimp`) in the paper's five paradigms, cut per paradigm into a seeded 70 % ``"train"``
part and the disjoint ``"dev"`` rest (:func:`normx.data.blimp_items.split_pairs`); the items (masked sentence,
target and foil token) are those :func:`normx.data.blimp_items.prepare` builds for the alignment experiment, so the
model is trained on exactly the inputs it is later explained on.

Used by :func:`normx.zoo.training.train` for recipes whose task is ``"blimp"`` (the ``minilm-blimp`` preset).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from normx.data import blimp, blimp_items
from normx.models import HeadKind

TASK = "blimp"
PARADIGMS = blimp.DEFAULT_PARADIGMS


def items(tokenizer, split: str, data_path=None) -> list[blimp_items.Item]:
    """The masked-LM items of ``split`` ("train" / "dev") of every paradigm, paradigm by paradigm."""
    out: list[blimp_items.Item] = []
    for key in PARADIGMS:
        paradigm = blimp.get_paradigm(key)
        pairs = blimp_items.split_pairs(blimp.extract(blimp.load_rows(paradigm, data_path), paradigm).pairs, split)
        out.extend(blimp_items.prepare(pairs, tokenizer, HeadKind.MASKED_LM)[0])
    return out


def contrast_logits(model, tokenizer, chunk: Sequence[blimp_items.Item], max_length: int, device) -> torch.Tensor:
    """[batch, 2]: the logits of the target (column 0) and the foil (column 1) at each item's mask token."""
    enc = tokenizer([item.text for item in chunk], padding=True, truncation=True, max_length=max_length,
                    return_tensors="pt").to(device)
    rows, cols = (enc["input_ids"] == tokenizer.mask_token_id).nonzero(as_tuple=True)
    if not torch.equal(rows, torch.arange(len(chunk), device=rows.device)):
        raise ValueError("every BLiMP item must hold exactly one mask token inside max_length")
    logits = model(**enc).logits[rows, cols]  # [batch, vocab]
    ids = torch.tensor([[item.target_id, item.foil_id] for item in chunk], device=logits.device)
    return logits.gather(1, ids)


def loss(model, tokenizer, chunk: Sequence[blimp_items.Item], max_length: int, device) -> torch.Tensor:
    """The paper's loss: cross-entropy of the (target, foil) logit pair with the target as the label."""
    pair = contrast_logits(model, tokenizer, chunk, max_length, device).float()
    return torch.nn.functional.cross_entropy(pair, torch.zeros(len(chunk), dtype=torch.long, device=pair.device))


@torch.no_grad()
def accuracy(model, tokenizer, data: Sequence[blimp_items.Item], batch_size: int = 64, max_length: int = 128) -> float:
    """The share of ``data``'s items whose target logit beats the foil's at the mask."""
    model.eval()
    device = next(model.parameters()).device
    right = []
    for start in range(0, len(data), batch_size):
        pair = contrast_logits(model, tokenizer, data[start:start + batch_size], max_length, device)
        right.append((pair[:, 0] > pair[:, 1]).cpu().numpy())
    return float(np.concatenate(right).mean()) if right else float("nan")
