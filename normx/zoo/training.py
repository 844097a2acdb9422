"""Training and evaluating the offline task presets: a LoRA adapter plus the head, on a base from PyPI.

Reproducible from a seed: the same seed, data and package versions give the same adapter on the same machine.
"""

from __future__ import annotations

import json
import math
import platform
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch

from normx.data import glue
from normx.errors import InvalidInputError
from normx.zoo.recipes import Recipe, metric_name


def batches(examples: Sequence[glue.Example], size: int):
    for start in range(0, len(examples), size):
        yield examples[start:start + size]


def length_buckets(examples: Sequence, size: int, rng: random.Random, pool: int = 50,
                   length: Callable | None = None) -> list[list]:
    """One epoch of batches in random order, each drawn from a pool of similar-length examples, so little
    compute goes to padding (SST-2's phrases range from 1 to 50+ words). ``length``: an example's length (default:
    the characters of its text and pair)."""
    shuffled = list(examples)
    rng.shuffle(shuffled)
    batches_ = []
    for start in range(0, len(shuffled), size * pool):
        group = sorted(shuffled[start:start + size * pool],
                       key=length or (lambda e: len(e.text) + len(e.pair or "")))
        batches_.extend(group[i:i + size] for i in range(0, len(group), size))
    rng.shuffle(batches_)
    return batches_


def encode_batch(tokenizer, chunk: Sequence[glue.Example], max_length: int, device) -> dict[str, torch.Tensor]:
    texts = [e.text for e in chunk]
    pairs = [e.pair for e in chunk] if chunk[0].pair is not None else None
    enc = tokenizer(texts, pairs, padding=True, truncation=True, max_length=max_length, return_tensors="pt")
    return {k: v.to(device) for k, v in enc.items()}


@torch.no_grad()
def predict(model, tokenizer, examples: Sequence[glue.Example], batch_size: int = 64, max_length: int = 128,
            progress: bool = False) -> np.ndarray:
    """The model's outputs on ``examples``: class ids, or scores for regression."""
    model.eval()
    device = next(model.parameters()).device
    outputs = []
    for chunk in _progress(list(batches(examples, batch_size)), progress, "evaluating"):
        logits = model(**encode_batch(tokenizer, chunk, max_length, device)).logits.float()
        outputs.append(logits[:, 0] if logits.shape[-1] == 1 else logits.argmax(-1))
    return torch.cat(outputs).cpu().numpy()


def score(task: str, predictions: np.ndarray, examples: Sequence[glue.Example]) -> float:
    gold = np.array([e.label for e in examples], dtype=np.float64)
    if task == "stsb":
        return float(np.corrcoef(predictions.astype(np.float64), gold)[0, 1])
    return float((predictions == gold).mean())


def evaluate(model, tokenizer, task: str, data_path=None, limit: int | None = None, progress: bool = True) -> dict:
    """The preset's metric on the dev split (the held-out part for MNLI, QNLI and BLiMP)."""
    if task == "blimp":
        from normx.zoo import blimp_training as blimp_lm

        items = blimp_lm.items(tokenizer, "dev", data_path)[:limit]
        return {"metric": metric_name(task), "value": blimp_lm.accuracy(model, tokenizer, items),
                "examples": len(items), "paradigms": list(blimp_lm.PARADIGMS)}
    examples = glue.load(task, "dev", data_path)
    if limit is not None:
        examples = examples[:limit]
    predictions = predict(model, tokenizer, examples, progress=progress)
    return {"metric": metric_name(task), "value": score(task, predictions, examples), "examples": len(examples)}


def train(recipe: Recipe, build: Callable[[], tuple], out: str | Path, data_path=None, seed: int = 0,
          progress: bool = True, command: str | None = None) -> dict:
    """Train ``recipe`` on the model from ``build()`` (a fresh ``(model, tokenizer)`` with its new head).

    Saves the adapter (safetensors), the task config and ``metrics.json`` into ``out``; returns the metrics.
    """
    from peft import LoraConfig, get_peft_model

    _seed_everything(seed)
    model, tokenizer = build()
    lm = recipe.task == "blimp"
    config = LoraConfig(task_type=None if lm else "SEQ_CLS", r=recipe.rank, lora_alpha=recipe.alpha,
                        lora_dropout=recipe.dropout, target_modules=list(recipe.target_modules),
                        modules_to_save=list(recipe.modules_to_save))
    model = get_peft_model(model, config)
    if lm:
        from normx.zoo import blimp_training as blimp_lm

        examples = blimp_lm.items(tokenizer, "train", data_path)
    else:
        examples = glue.load(recipe.task, "train", data_path)
    rng = random.Random(seed)
    if recipe.train_limit is not None and recipe.train_limit < len(examples):
        examples = rng.sample(examples, recipe.train_limit)
    steps_per_epoch = math.ceil(len(examples) / recipe.batch_size)
    total = max(1, round(steps_per_epoch * recipe.epochs))
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=recipe.lr, weight_decay=0.01)
    warmup = max(1, int(total * recipe.warmup))
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: min((step + 1) / warmup, max(0.0, (total - step) / max(1, total - warmup))))
    device = next(model.parameters()).device
    start = time.time()
    model.train()
    order: list[list[glue.Example]] = []
    bar = _progress(range(total), progress, f"training {recipe.task}")
    for step in bar:
        if not order:
            order = length_buckets(examples, recipe.batch_size, rng,
                                   length=(lambda item: len(item.text)) if lm else None)
        chunk = order.pop()
        if lm:
            loss = blimp_lm.loss(model, tokenizer, chunk, recipe.max_length, device)
        else:
            batch = encode_batch(tokenizer, chunk, recipe.max_length, device)
            dtype = torch.float32 if recipe.task == "stsb" else torch.long
            labels = torch.tensor([e.label for e in chunk], dtype=dtype, device=device)
            loss = model(**batch, labels=labels).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        schedule.step()
        optimizer.zero_grad(set_to_none=True)
        if hasattr(bar, "set_postfix") and step % 20 == 0:
            bar.set_postfix(loss=f"{loss.item():.4f}")
    seconds = time.time() - start
    metrics = evaluate(model, tokenizer, recipe.task, data_path, progress=progress)
    metrics.update(seed=seed, train_examples=len(examples), steps=total, train_seconds=round(seconds, 1),
                   recipe=asdict(recipe), command=command, machine=platform.processor() or platform.machine(),
                   torch=torch.__version__)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    (out / "README.md").unlink(missing_ok=True)  # peft's empty model-card template
    model.get_base_model().config.save_pretrained(out)
    (out / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
    return metrics


def _seed_everything(seed: int) -> None:
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise InvalidInputError(f"seed must be an integer, got {seed!r}")
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def _progress(iterable, enabled: bool, desc: str):
    if not enabled:
        return iterable
    from tqdm.auto import tqdm

    return tqdm(iterable, desc=desc, dynamic_ncols=True)
