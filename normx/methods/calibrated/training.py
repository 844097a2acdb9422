"""The training data of a calibrated context method, for one (context, response) instance: the sources' features
from one unablated pass (:func:`~normx.methods.calibrated.readings.head_readings`, summed over the response's steps
and each source's tokens) and the response's log-probability under random source masks, a source removed by leaving
its tokens out of the ids, exactly as the ablation methods and the evaluation remove it
(:func:`normx.methods.ablation.forwards.outcomes`)."""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from normx.core.batch import Encoded
from normx.core.handle import model_handle
from normx.errors import InvalidInputError
from normx.methods.ablation.forwards import outcomes
from normx.methods.calibrated.fit import LAMBDAS, Choice, Instance, centred_ridge, choose
from normx.methods.calibrated.readings import FAMILIES, check_families, head_readings, shape
from normx.methods.calibrated.weights import make_record
from normx.methods.response import ResponseContext
from normx.models.identity import model_identity

METHOD = "calibrated_attention"  # the registered method the weights are for


def source_features(model, ids: Sequence[int], prompt_length: int, spans: Sequence[tuple[int, int]],
                    families: Sequence[str] = FAMILIES, method: str = "calibration") -> dict[str, np.ndarray]:
    """{family: [sources, blocks, heads]}: each source's readings summed over the response's steps and its tokens."""
    handle = model_handle(model)

    def over_steps(_layer, block):  # [F, H, Q, T] -> [F, H, T]
        return block.sum(2).double().cpu().numpy()

    per_block, _ = head_readings(handle, ids, prompt_length, families, over_steps, method)
    stacked = np.stack([per_block[layer] for layer in sorted(per_block)], axis=1)  # [F, L, H, T]
    by_source = np.stack([stacked[..., a:b].sum(-1) for a, b in spans], axis=0)  # [S, F, L, H]
    return {family: by_source[:, k] for k, family in enumerate(families)}


def masked_outcomes(model, tokenizer, ids: Sequence[int], prompt_length: int, spans: Sequence[tuple[int, int]],
                    masks: np.ndarray, batch_size: int = 8) -> np.ndarray:
    """The response's log-probability [M] under each mask (bool [M, sources]: True = kept)."""
    ids = [int(t) for t in ids]
    item = Encoded(text="", text_pair=None, ids=ids, tokens=[""] * len(ids), offsets=[(0, 0)] * len(ids),
                   segments=[0] * len(ids), special=[False] * len(ids))
    ctx = ResponseContext(model_handle(model), tokenizer, "", item, prompt_length, {}, batch_size)
    log_p, _, _ = outcomes(ctx, [list(range(a, b)) for a, b in spans], np.asarray(masks, bool), "calibration masks")
    return log_p.sum(1)


def training_masks(sources: int, count: int, seed: int, keep: float = 0.5) -> np.ndarray:
    """``count`` random masks (bool [count, sources]) from ``numpy.random.default_rng([seed, 46, sources])``: each
    source kept with probability ``keep``."""
    if sources < 1 or count < 2:
        raise InvalidInputError(f"calibration needs at least one source and two masks, got {sources} and {count}")
    return np.random.default_rng([seed, 46, sources]).random((count, sources)) < keep


def collect(model, tokenizer, ids: Sequence[int], prompt_length: int, spans: Sequence[tuple[int, int]], *,
            masks: int = 32, seed: int = 0, families: Sequence[str] = FAMILIES, batch_size: int = 8,
            id: str = "") -> Instance:
    """One training instance: features from one pass, outcomes under ``masks`` random masks."""
    drawn = training_masks(len(spans), masks, seed)
    features = source_features(model, ids, prompt_length, spans, families)
    y = masked_outcomes(model, tokenizer, ids, prompt_length, spans, drawn, batch_size)
    return Instance(features, drawn, y, id)


def _saved(folder: Path | None, id: str, key: str) -> Instance | None:
    """A training instance kept by an earlier run with the same settings (``key``); None if absent or other."""
    file = None if folder is None else folder / f"{hashlib.sha256(id.encode()).hexdigest()[:16]}.npz"
    if file is None or not file.is_file() or file.is_symlink():
        return None
    try:
        with np.load(file, allow_pickle=False) as data:
            if str(data["key"]) != key or str(data["id"]) != id:
                return None
            features = {f: data[f"f_{f}"] for f in FAMILIES if f"f_{f}" in data}
            return Instance(features, data["masks"].astype(bool), data["y"], id)
    except (OSError, ValueError, KeyError):
        return None  # a damaged file: computed again


def _save(folder: Path, inst: Instance, key: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    file = folder / f"{hashlib.sha256(inst.id.encode()).hexdigest()[:16]}.npz"
    handle, temp = tempfile.mkstemp(prefix=".instance.", suffix=".npz", dir=folder)
    try:
        with os.fdopen(handle, "wb") as out:
            np.savez(out, key=key, id=inst.id, masks=inst.masks, y=inst.y,
                     **{f"f_{f}": v for f, v in inst.features.items()})
        os.replace(temp, file)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise


def training_hash(instances: Sequence[Instance]) -> str:
    """SHA-256 over every instance's id, masks, outcomes and features (what the fit saw)."""
    digest = hashlib.sha256()
    for inst in instances:
        digest.update(inst.id.encode() + b"\0")
        for array in (inst.masks.astype(np.uint8), np.asarray(inst.y, np.float64),
                      *(np.asarray(inst.features[f], np.float64) for f in sorted(inst.features))):
            digest.update(np.ascontiguousarray(array).tobytes())
    return digest.hexdigest()


def _key(masks: int, seed: int, families: Sequence[str]) -> str:
    return json.dumps({"masks": masks, "seed": seed, "families": list(families)}, sort_keys=True)


def kept_instances(keep: Path, ids: Sequence[str], *, masks: int = 32, seed: int = 0,
                   families: Sequence[str] = FAMILIES) -> list[Instance]:
    """The instances an earlier :func:`instances_for` kept in ``keep`` for the contexts ``ids`` with the same
    settings, in order, skipping the ones it has not finished (no model needed)."""
    key = _key(masks, seed, families)
    return [inst for inst in (_saved(keep, id, key) for id in ids) if inst is not None]


def instances_for(model, tokenizer, contexts: Sequence[dict], *, masks: int = 32, seed: int = 0,
                  families: Sequence[str] = FAMILIES, batch_size: int = 8, keep: Path | None = None,
                  progress: bool = True) -> list[Instance]:
    """One instance per context (``{"id", "ids", "prompt_length", "spans"}``), each kept in ``keep`` (a folder:
    one .npz per context, written whole) and reused by a later run with the same settings."""
    from tqdm.auto import tqdm

    key = _key(masks, seed, families)
    found = []
    for index, context in enumerate(tqdm(contexts, desc="calibration contexts", disable=not progress)):
        inst = _saved(keep, context["id"], key)
        if inst is None:
            inst = collect(model, tokenizer, context["ids"], context["prompt_length"], context["spans"],
                           masks=masks, seed=seed + index, families=families, batch_size=batch_size,
                           id=context["id"])
            if keep is not None:
                _save(keep, inst, key)
        found.append(inst)
    return found


def fitted_record(model, instances: Sequence[Instance], candidates: Sequence[str] = FAMILIES, *,
                  lambdas: Sequence[float] = LAMBDAS, folds: int = 5, training: dict | None = None
                  ) -> tuple[dict, Choice]:
    """The weights record for ``model``: the families, lambda and scaling chosen by cross-validation on
    ``instances`` (:func:`~normx.methods.calibrated.fit.choose`), theta fitted on all of them."""
    from normx.models import get_adapter

    candidates = check_families(candidates)
    choice = choose(instances, candidates, lambdas, folds=folds)
    theta = centred_ridge(instances, choice.families, choice.lam, choice.scaling)
    blocks, heads = shape(model, get_adapter(model))
    size = blocks * heads
    tables = {f: theta[k * size:(k + 1) * size].reshape(blocks, heads) for k, f in enumerate(choice.families)}
    described = {**dict(training or {}), "contexts": len(instances), "masks": len(instances[0].y),
                 "sha256": training_hash(instances), "candidates": list(candidates), "folds": folds}
    record = make_record(METHOD, model_identity(model), choice.families, tables, (blocks, heads), choice.lam,
                         choice.scaling, choice.cv_lds, described)
    return record, choice
