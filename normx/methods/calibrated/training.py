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
from normx.methods.calibrated.fit import LAMBDAS, Choice, Instance, centred_ridge, choose, expand, in_nats
from normx.methods.calibrated.readings import (
    FAMILIES,
    SCALAR,
    by_source,
    check_families,
    head_readings,
    shape,
    source_readings,
)
from normx.methods.calibrated.weights import make_record
from normx.methods.response import ResponseContext
from normx.models.identity import model_identity

METHOD = "calibrated_attention"  # the registered method the weights are for


def source_features(model, ids: Sequence[int], prompt_length: int, spans: Sequence[tuple[int, int]],
                    families: Sequence[str] = FAMILIES, method: str = "calibration") -> dict[str, np.ndarray]:
    """{family: [sources, blocks, heads]} (per-source families: [sources, 1, 1]): each source's readings summed
    over the response's steps and its tokens."""
    handle = model_handle(model)
    families = check_families(families)
    found: dict[str, np.ndarray] = {}
    heads = [f for f in families if f not in SCALAR]
    if heads:
        def over_steps(_layer, block):  # [F, H, Q, T] -> [F, H, T]
            return block.sum(2).double().cpu().numpy()

        per_block, _ = head_readings(handle, ids, prompt_length, heads, over_steps, method)
        stacked = np.stack([per_block[layer] for layer in sorted(per_block)], axis=1)  # [F, L, H, T]
        summed = np.stack([stacked[..., a:b].sum(-1) for a, b in spans], axis=0)  # [S, F, L, H]
        found.update({family: summed[:, k] for k, family in enumerate(heads)})
    scalar = [f for f in families if f in SCALAR]
    if scalar:
        sources = [list(range(a, b)) for a, b in spans]
        values, _ = source_readings(handle, ids, prompt_length, sources, scalar, method)
        found.update({family: by_source(values[family], sources).sum(1)[:, None, None] for family in scalar})
    return {family: found[family] for family in families}


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


def _saved(folder: Path | None, id: str, masks: int, seed: int) -> Instance | None:
    """A training instance kept by an earlier run for context ``id`` with ``masks`` masks drawn from ``seed``, with
    whatever feature families it computed; None if absent, other or damaged (computed again)."""
    file = None if folder is None else folder / f"{hashlib.sha256(id.encode()).hexdigest()[:16]}.npz"
    if file is None or not file.is_file() or file.is_symlink():
        return None
    try:
        with np.load(file, allow_pickle=False) as data:
            key = json.loads(str(data["key"]))
            if (not isinstance(key, dict) or key.get("masks") != masks or key.get("seed") != seed
                    or str(data["id"]) != id):
                return None
            features = {f: data[f"f_{f}"] for f in FAMILIES if f"f_{f}" in data}
            inst = Instance(features, data["masks"].astype(bool), data["y"], id)
    except (OSError, ValueError, KeyError, json.JSONDecodeError):
        return None
    if len(inst.masks) != masks or inst.y.shape != (masks,):
        return None
    return inst


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


def _key(masks: int, seed: int) -> str:
    """What a kept instance's outcomes depend on (its features are stored per family beside them)."""
    return json.dumps({"masks": masks, "seed": seed}, sort_keys=True)


def _with(inst: Instance | None, families: Sequence[str]) -> Instance | None:
    """``inst`` restricted to ``families`` (None unless it has all of them)."""
    if inst is None or any(f not in inst.features for f in families):
        return None
    return Instance({f: inst.features[f] for f in families}, inst.masks, inst.y, inst.id)


def kept_instances(keep: Path, ids: Sequence[str], *, masks: int = 32, seed: int = 0,
                   families: Sequence[str] = FAMILIES) -> list[Instance]:
    """The instances an earlier :func:`instances_for` kept in ``keep`` for the contexts ``ids`` (the i-th with masks
    from ``seed + i``) holding every family in ``families``, in order, skipping the others (no model needed)."""
    found = (_with(_saved(keep, id, masks, seed + i), families) for i, id in enumerate(ids))
    return [inst for inst in found if inst is not None]


def instances_for(model, tokenizer, contexts: Sequence[dict], *, masks: int = 32, seed: int = 0,
                  families: Sequence[str] = FAMILIES, batch_size: int = 8, keep: Path | None = None,
                  progress: bool = True, indices: Sequence[int] | None = None) -> list[Instance]:
    """One instance per context (``{"id", "ids", "prompt_length", "spans"}``; the i-th with masks drawn from
    ``seed + i``, i its index in ``indices`` where given: the contexts' places in a whole run shared by processes),
    each kept in ``keep`` (a folder: one .npz per context, written whole) and reused by a later run with the same
    masks: a run asking for families the kept file lacks computes only those (one pass, no masks)."""
    from tqdm.auto import tqdm

    families = check_families(families)
    indices = range(len(contexts)) if indices is None else list(indices)
    if len(indices) != len(contexts):
        raise ValueError(f"{len(indices)} indices for {len(contexts)} contexts")
    found = []
    for index, context in zip(indices, tqdm(contexts, desc="calibration contexts", disable=not progress)):
        inst = _saved(keep, context["id"], masks, seed + index)
        if inst is None:
            inst = collect(model, tokenizer, context["ids"], context["prompt_length"], context["spans"],
                           masks=masks, seed=seed + index, families=families, batch_size=batch_size,
                           id=context["id"])
        else:
            missing = [f for f in families if f not in inst.features]
            if not missing:
                found.append(_with(inst, families))
                continue
            inst.features.update(source_features(model, context["ids"], context["prompt_length"],
                                                 context["spans"], missing))
        if keep is not None:
            _save(keep, inst, _key(masks, seed + index))
        found.append(_with(inst, families))
    return found


def fitted_record(model, instances: Sequence[Instance], candidates: Sequence[str] = FAMILIES, *,
                  lambdas: Sequence[float] = LAMBDAS, folds: int = 5, training: dict | None = None
                  ) -> tuple[dict, Choice]:
    """The weights record for ``model``: the families, lambda and scaling chosen by cross-validation on
    ``instances`` (:func:`~normx.methods.calibrated.fit.choose`), theta fitted on all of them."""
    from normx.models import get_adapter
    from normx.models.modules import unwrap_model

    candidates = check_families(candidates)
    choice = choose(instances, candidates, lambdas, folds=folds)
    theta = centred_ridge(instances, choice.families, choice.lam, choice.scaling, choice.tying)
    theta, factor = in_nats(instances, choice.families, theta, choice.tying)
    base = unwrap_model(model)  # (a PEFT model: the transformers model inside, which the method reads)
    blocks, heads = shape(base, get_adapter(base))
    tables = expand(theta, choice.families, choice.tying, (blocks, heads), SCALAR)
    described = {**dict(training or {}), "contexts": len(instances), "masks": len(instances[0].y),
                 "sha256": training_hash(instances), "candidates": list(candidates), "folds": folds,
                 "tying": choice.tying, "nats_factor": factor}
    record = make_record(METHOD, model_identity(base), choice.families, tables, (blocks, heads), choice.lam,
                         choice.scaling, choice.cv_lds, described)
    return record, choice
