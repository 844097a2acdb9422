"""Tiny models wrapped with PEFT (LoRA layers, saved copies of heads and norms), shared by the tests of every
method, and the helpers that read through the wrappers independently of normx."""

from __future__ import annotations

import tiny
import torch
from tiny import build


def live(module):
    """The module that really runs: PEFT's ModulesToSaveWrapper -> the active adapter's trainable copy."""
    from peft.utils import ModulesToSaveWrapper

    if isinstance(module, ModulesToSaveWrapper):
        return module.modules_to_save[module.active_adapters[0]]
    return module


def base_of(model):
    return model.get_base_model() if hasattr(model, "peft_config") else model


def _perturb_saved_copies(peft_model, seed: int):
    """modules_to_save copies start equal to the originals; make them differ so using the wrong one fails."""
    from peft.utils import ModulesToSaveWrapper

    generator = torch.Generator().manual_seed(seed)
    wrapped = [m for m in peft_model.modules() if isinstance(m, ModulesToSaveWrapper)]
    with torch.no_grad():
        for module in wrapped:
            for param in live(module).parameters():
                param.add_(0.3 * torch.randn(param.shape, generator=generator))
    return wrapped


PEFT_CASES = {
    # modules_to_save given explicitly; LoRA also on the pooler's dense (part of BERT's head)
    "bert-seqcls-save": ("BertForSequenceClassification", dict(
        task_type="SEQ_CLS", target_modules=["query", "value", "dense", "word_embeddings"],
        modules_to_save=["classifier"])),
    # no modules_to_save given: PEFT adds the classifier itself
    "roberta-seqcls": ("RobertaForSequenceClassification", dict(task_type="SEQ_CLS",
                                                               target_modules=["query", "value"])),
    "distilbert-seqcls-save": ("DistilBertForSequenceClassification", dict(
        task_type="SEQ_CLS", target_modules=["q_lin", "v_lin"], modules_to_save=["pre_classifier"])),
    "gpt2-seqcls": ("GPT2ForSequenceClassification", dict(task_type="SEQ_CLS", target_modules=["c_attn"],
                                                          fan_in_fan_out=True)),
    # no task type, no modules_to_save: the score head itself is a LoRA layer
    "llama-seqcls-lora-head": ("LlamaForSequenceClassification", dict(target_modules=["q_proj", "v_proj", "score"])),
    # causal LM with LoRA on the LM head (a wrapped head: every vocabulary column path) and on the embeddings (x^0)
    "llama-causal": ("LlamaForCausalLM", dict(task_type="CAUSAL_LM", target_modules=[
        "q_proj", "v_proj", "o_proj", "lm_head", "embed_tokens"])),
    # causal LM with a saved copy of the head and of the final norm
    "mistral-causal-save": ("MistralForCausalLM", dict(task_type="CAUSAL_LM", target_modules=["q_proj", "v_proj"],
                                                       modules_to_save=["lm_head", "model.norm"])),
    "roberta-mlm-save": ("RobertaForMaskedLM", dict(target_modules=["query", "value"], modules_to_save=["lm_head"])),
}

_PEFT_MODELS: dict = {}


def peft_model(name: str):
    """The case's model, built once and shared by the tests (which must not change it)."""
    if name not in _PEFT_MODELS:
        _PEFT_MODELS[name] = fresh_peft_model(name)
    return _PEFT_MODELS[name]


def fresh_peft_model(name: str):
    """``(peft model, tokenizer, case, saved wrappers)``, built anew (for tests that change the model), the same
    weights every time."""
    from peft import LoraConfig, get_peft_model

    case_id, kwargs = PEFT_CASES[name]
    model, tokenizer = build(case_id, fresh=True)
    config = LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, init_lora_weights=False, **kwargs)
    torch.manual_seed(sum(map(ord, name)))
    wrapped = get_peft_model(model, config)
    saved = _perturb_saved_copies(wrapped, sum(map(ord, name)))
    wrapped.eval()
    return wrapped, tokenizer, tiny.CASE_BY_ID[case_id], saved
