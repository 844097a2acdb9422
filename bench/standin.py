"""The CPU stand-in's models and inputs (issue #55): seeded tiny models whose forward on one thread takes
milliseconds, as a card's does. Read by bench/test_host_overhead.py and by ``studies.timing.standin_parts``."""

from __future__ import annotations

import copy

import torch
import transformers

from tests import tiny

STEPS = 32  # the generated tokens explained
CLASSIFICATION_TOKENS = 40


def byte_tokenizer(longest: int):
    """The tests' byte-level BPE tokenizer, a copy (the shared one is not to be changed) that takes ``longest``."""
    made = copy.deepcopy(tiny.bpe_tokenizer("llama"))
    made.model_max_length = longest + 64
    return made


def llama(tokenizer, longest: int):
    """A tiny Llama: 2 blocks of width 32, 4 heads, seeded."""
    config = transformers.LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=4, max_position_embeddings=longest + 64, bos_token_id=0, eos_token_id=2, pad_token_id=1)
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config).eval()


def sequence(tokenizer, length: int, steps: int) -> tuple[str, list[int], list[int]]:
    """(prompt, its ids, a continuation of ``steps`` ids), ``length`` tokens together."""
    ids = tokenizer(" ".join(tiny.CORPUS * (length // 40 + 8)), add_special_tokens=False)["input_ids"]
    for cut in range(length - steps - 1, 0, -1):  # decoding and encoding again may merge differently: fit it
        prompt = tokenizer.decode(ids[:cut])
        prompt_ids = tokenizer(prompt)["input_ids"]
        if len(prompt_ids) <= length - steps:
            break
    return prompt, prompt_ids, ids[len(ids) - steps:]


def classifier() -> tuple:
    """(the tests' tiny BERT classifier, its tokenizer, a text of :data:`CLASSIFICATION_TOKENS` tokens with its
    special tokens)."""
    model, made = tiny.build("BertForSequenceClassification")
    ids = made(" ".join(tiny.CORPUS), add_special_tokens=False)["input_ids"][:CLASSIFICATION_TOKENS - 2]
    return model, made, made.decode(ids)
