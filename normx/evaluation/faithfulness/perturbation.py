"""Ranking tokens by attribution and building perturbed inputs from token ids, as the NormXLogit authors did.

Protocol (the authors' MNLI/BERT notebook, which reproduces the paper's Table 1):

- The ranking covers every non-padding token except the pooled one ([CLS] of encoders, the last token of decoder
  classifiers), in descending score order (signed: higher = more important). [SEP] and other special tokens are
  rankable (``special_tokens="include"``); ``"exclude"`` keeps every special token out of the ranking, so they are
  never perturbed.
- At ratio K, ``int(n * K)`` tokens are perturbed, where n counts all non-padding tokens, the pooled token included
  (``"exclude"``: n = the number of rankable tokens); the count is capped at the length of the ranking.
  Comprehensiveness perturbs the top of the ranking, sufficiency everything but the top.
- Models whose tokenizer has a mask token get the perturbed tokens replaced by it, with the attention mask kept;
  models without one (causal LMs) get them deleted, their token-type ids and positions going with them.

Perturbed inputs are token-id sequences (never decoded to text and re-tokenised), run through the model's own
forward in length-sorted batches.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from normx.core.concurrency import using
from normx.core.inputs import collate
from normx.errors import InvalidInputError

K_VALUES = tuple(i / 10 for i in range(11))  # 0.0, 0.1, ..., 1.0: the same floats as the authors' literals
MODES = ("comprehensiveness", "sufficiency")
SPECIAL_TOKENS = ("include", "exclude")
STRATEGIES = ("auto", "mask", "delete")


@dataclass(frozen=True)
class Item:
    """One input as token ids (no padding), with the position of its pooled token."""

    ids: tuple[int, ...]
    special: tuple[bool, ...] = ()
    pooled: int = 0
    extra: dict[str, tuple[int, ...]] = field(default_factory=dict)  # e.g. token_type_ids

    def key(self) -> bytes:
        """A compact identity of the model input (ids and the extra inputs), for de-duplicating forward passes."""
        parts = [np.asarray(self.ids, dtype=np.int64)] + [np.asarray(self.extra[k], dtype=np.int64)
                                                          for k in sorted(self.extra)]
        return b"|".join(p.tobytes() for p in parts)


def check_choice(name: str, value, allowed: Sequence[str]) -> str:
    if not isinstance(value, str) or value not in allowed:
        raise InvalidInputError(f"{name}={value!r} is not allowed; use one of {tuple(allowed)}")
    return value


def resolve_strategy(strategy: str, mask_token_id: int | None) -> str:
    """``"auto"`` -> ``"mask"`` when the tokenizer has a mask token, else ``"delete"``."""
    check_choice("perturbation", strategy, STRATEGIES)
    if strategy == "auto":
        return "mask" if mask_token_id is not None else "delete"
    if strategy == "mask" and mask_token_id is None:
        raise InvalidInputError("perturbation='mask' needs a mask token, and this tokenizer has none; use "
                                "perturbation='delete' (or 'auto')")
    return strategy


def ranking(scores: np.ndarray, item: Item, special_tokens: str = "include") -> np.ndarray:
    """Positions of ``item`` ordered from the most to the least important (descending score; ties keep text
    order; NaN scores rank last), without the pooled token (and without special tokens for ``"exclude"``)."""
    check_choice("special_tokens", special_tokens, SPECIAL_TOKENS)
    scores = np.asarray(scores, dtype=np.float64)
    if scores.shape != (len(item.ids),):
        raise InvalidInputError(f"got {scores.shape[0] if scores.ndim == 1 else scores.shape} scores for an input "
                                f"of {len(item.ids)} tokens; give one score per token")
    key = np.where(np.isnan(scores), -np.inf, scores)
    order = np.argsort(-key, kind="stable")
    keep = order != item.pooled
    if special_tokens == "exclude" and item.special:
        keep &= ~np.asarray(item.special, dtype=bool)[order]
    return order[keep]


def perturb_count(item: Item, order: np.ndarray, k: float, special_tokens: str = "include") -> int:
    """How many tokens ratio ``k`` perturbs: ``int(n * k)`` (the authors' rounding), capped at the ranking."""
    n = len(item.ids) if special_tokens == "include" else len(order)
    return min(int(n * k), len(order))


def perturb(item: Item, order: np.ndarray, k: float, mode: str, strategy: str, mask_token_id: int | None = None,
            special_tokens: str = "include") -> Item:
    """``item`` with the top ``k`` of ``order`` perturbed (comprehensiveness) or all but the top ``k``
    (sufficiency), by replacing with ``mask_token_id`` (``"mask"``) or deleting (``"delete"``)."""
    check_choice("mode", mode, MODES)
    count = perturb_count(item, order, k, special_tokens)
    chosen = order[:count] if mode == "comprehensiveness" else order[count:]
    if strategy == "mask":
        ids = np.asarray(item.ids, dtype=np.int64)
        ids[chosen] = mask_token_id
        return Item(tuple(int(i) for i in ids), item.special, item.pooled, item.extra)
    if strategy != "delete":
        raise InvalidInputError(f"strategy={strategy!r} is not allowed; use 'mask' or 'delete'")
    keep = np.ones(len(item.ids), dtype=bool)
    keep[chosen] = False
    kept = np.flatnonzero(keep).tolist()

    def select(values):
        return tuple(values[i] for i in kept)

    pooled = item.pooled - int((~keep[:item.pooled]).sum())
    return Item(select(item.ids), select(item.special) if item.special else (), pooled,
                {name: select(values) for name, values in item.extra.items()})


# ---- running the model ---------------------------------------------------------------------------------------------

def model_device(model: torch.nn.Module) -> torch.device:
    for param in model.parameters():
        return param.device
    return torch.device("cpu")


def forward_logits(model, items: Sequence[Item], *, batch_size: int = 64, progress: bool = False,
                   desc: str = "forward") -> np.ndarray:
    """The model's own logits [len(items), C] (float32) for ``items``: ``model(**batch).logits`` on batches of
    items of the same length, so that no row is padded and each is exactly the model's plain call on its tokens
    (``input_ids``, ``attention_mask`` and the items' extra inputs, nothing else): the judge of faithfulness is the
    model as its user runs it, whatever its classifier makes of a pad token."""
    if not items:
        return np.zeros((0, 0), dtype=np.float32)
    device = model_device(model)
    out: np.ndarray | None = None
    for chunk in _progress(same_length_chunks([len(item.ids) for item in items], batch_size), progress, desc):
        batch = collate([items[i] for i in chunk], None, device)
        with torch.no_grad():
            logits = model(**batch).logits.float().cpu().numpy()
        if out is None:
            out = np.zeros((len(items), logits.shape[-1]), dtype=np.float32)
        out[chunk] = logits
    return out


def same_length_chunks(lengths: Sequence[int], batch_size: int) -> list[list[int]]:
    """Indices grouped into batches of at most ``batch_size`` inputs of one length each, shortest first."""
    order = sorted(range(len(lengths)), key=lambda i: (lengths[i], i))
    chunks: list[list[int]] = []
    for i in order:
        if chunks and len(chunks[-1]) < batch_size and lengths[chunks[-1][0]] == lengths[i]:
            chunks[-1].append(i)
        else:
            chunks.append([i])
    return chunks


@dataclass
class Perturber:
    """Runs a model on inputs and on their perturbations, remembering every input it has run.

    ``strategy`` is ``"mask"`` (needs ``mask_token_id``) or ``"delete"``; inputs are run unpadded
    (:func:`forward_logits`).
    """

    model: torch.nn.Module
    strategy: str = "mask"
    mask_token_id: int | None = None
    ks: tuple[float, ...] = K_VALUES
    special_tokens: str = "include"
    batch_size: int = 64
    progress: bool = False
    cache: dict[bytes, np.ndarray] = field(default_factory=dict)

    def __post_init__(self):
        self.strategy = resolve_strategy(self.strategy, self.mask_token_id)
        check_choice("special_tokens", self.special_tokens, SPECIAL_TOKENS)

    def logits(self, items: Sequence[Item], desc: str = "forward") -> np.ndarray:
        """Logits [len(items), C] of ``items``; inputs already run come from the cache."""
        todo: dict[bytes, Item] = {}
        keys = []
        for item in items:
            key = item.key()
            keys.append(key)
            if key not in self.cache and key not in todo:
                todo[key] = item
        if todo:
            with using(self.model):
                new = forward_logits(self.model, list(todo.values()), batch_size=self.batch_size,
                                     progress=self.progress, desc=desc)
            self.cache.update(zip(todo, new))
        return np.stack([self.cache[key] for key in keys])

    def perturbed_logits(self, items: Sequence[Item], scores: Sequence[np.ndarray], desc: str = "perturbed inputs"
                         ) -> dict[str, np.ndarray]:
        """``{mode: logits [len(items), len(ks), C]}``: every item perturbed at every K, ranked by its scores."""
        if len(scores) != len(items):
            raise InvalidInputError(f"got scores for {len(scores)} inputs but {len(items)} inputs")
        changed = []
        for item, values in zip(items, scores):
            order = ranking(values, item, self.special_tokens)
            changed += [perturb(item, order, k, mode, self.strategy, self.mask_token_id, self.special_tokens)
                        for mode in MODES for k in self.ks]
        logits = self.logits(changed, desc)
        logits = logits.reshape(len(items), len(MODES), len(self.ks), -1)
        return {mode: logits[:, m] for m, mode in enumerate(MODES)}


def _progress(iterable, enabled: bool, desc: str):
    if not enabled:
        return iterable
    from tqdm.auto import tqdm

    return tqdm(iterable, desc=desc, dynamic_ncols=True, leave=False)
