"""One small adapter per model family: where its embeddings, blocks and head-on-top are.

Classification heads that pool the first token internally are run on every token by giving them each token as
a length-1 sequence (``h[:, None, :]``), so the model's own head modules run unchanged (PEFT wrappers included).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from normx.models.adapter import Adapter, HeadKind
from normx.models.encoder import (
    BERT_BLOCK,
    bert_classifier_steps,
    bert_mlm_steps,
    electra_classifier_steps,
    electra_mlm_steps,
    roberta_classifier_steps,
    roberta_mlm_steps,
)
from normx.models.modules import active_module, linear_columns

if TYPE_CHECKING:
    import torch
    from torch import nn


def _first_token(h: torch.Tensor) -> torch.Tensor:
    return h.unsqueeze(1)


# ---- sequence classification ----------------------------------------------------------------------------------

def _bert_cls(model, h, columns=None):
    return model.classifier(model.bert.pooler(_first_token(h)))


def _classification_head(model, h, columns=None):  # RoBERTa, XLM-R, ELECTRA: a head that pools features[:, 0]
    return model.classifier(_first_token(h))


def _deberta_cls(model, h, columns=None):
    return model.classifier(model.pooler(_first_token(h)))


def _distilbert_cls(model, h, columns=None):
    import torch

    return model.classifier(torch.relu(model.pre_classifier(h)))


def _score_head(model, h, columns=None):  # decoders: score on every position, pooled at the last token
    return model.score(h)


# ---- masked LM ---------------------------------------------------------------------------------------------------

def _bert_mlm(model, h, columns=None):
    predictions = active_module(model.cls).predictions
    return linear_columns(predictions.decoder, predictions.transform(h), columns)


def _roberta_mlm(model, h, columns=None):
    import torch.nn.functional as F

    head = active_module(model.lm_head)
    x = head.layer_norm(F.gelu(head.dense(h)))
    return linear_columns(head.decoder, x, columns)


def _distilbert_mlm(model, h, columns=None):
    x = model.vocab_layer_norm(model.activation(model.vocab_transform(h)))
    return linear_columns(model.vocab_projector, x, columns)


def _deberta_mlm(model, h, columns=None):
    if model.legacy:
        predictions = active_module(model.cls).predictions
        return linear_columns(predictions.decoder, predictions.transform(h), columns)
    head = active_module(model.lm_predictions).lm_head
    x = head.LayerNorm(head.transform_act_fn(head.dense(h)))
    weight = model.deberta.embeddings.word_embeddings.weight
    bias = head.bias
    if columns is not None:
        weight, bias = weight[columns], bias[columns]
    return x @ weight.t() + bias


def _electra_mlm(model, h, columns=None):
    x = model.generator_predictions(h)
    return linear_columns(model.generator_lm_head, x, columns)


# ---- causal LM -----------------------------------------------------------------------------------------------------

def _lm_head(model, h, columns=None):
    return linear_columns(model.lm_head, h, columns)


# ---- module references -------------------------------------------------------------------------------------------

def _electra_embeddings(model: nn.Module) -> nn.Module:
    # hidden_states[0] of ELECTRA is after the optional embedding-to-hidden projection.
    electra = model.electra
    return electra.embeddings_project if hasattr(electra, "embeddings_project") else electra.embeddings


def _deberta_blocks(model: nn.Module) -> list[nn.Module]:
    # DeBERTa-v2 models with a convolution (conv_kernel_size > 0) replace layer 0's output by the conv's output.
    encoder = model.deberta.encoder
    blocks = list(encoder.layer)
    if getattr(encoder, "conv", None) is not None:
        blocks[0] = encoder.conv
    return blocks


def _padding_idx_rows(config) -> int:
    """RoBERTa-style position tables number positions from padding_idx + 1."""
    return (getattr(config, "pad_token_id", 1) or 0) + 1


def _decoder(family: str, kind, head, prefix: str, embeddings: str, blocks: str, norm: str) -> Adapter:
    return Adapter(family=family, kind=kind, embeddings=f"{prefix}.{embeddings}", blocks=f"{prefix}.{blocks}",
                   final_norm=f"{prefix}.{norm}", head=head, pooling="last")


def builtin_adapters() -> dict[str, Adapter]:
    """The adapters normx ships, keyed by Hugging Face model class name."""
    cls, mlm, clm = HeadKind.SEQUENCE_CLASSIFICATION, HeadKind.MASKED_LM, HeadKind.CAUSAL_LM
    bert_like = dict(embeddings="bert.embeddings", blocks="bert.encoder.layer", encoder_block=BERT_BLOCK)
    roberta_like = dict(embeddings="roberta.embeddings", blocks="roberta.encoder.layer", encoder_block=BERT_BLOCK,
                        reserved_positions=_padding_idx_rows)
    distil = dict(embeddings="distilbert.embeddings", blocks="distilbert.transformer.layer")
    deberta = dict(embeddings="deberta.embeddings", blocks=_deberta_blocks)
    electra = dict(embeddings=_electra_embeddings, blocks="electra.encoder.layer",
                   word_embeddings="electra.embeddings.word_embeddings", encoder_block=BERT_BLOCK)
    adapters = {
        "BertForSequenceClassification": Adapter("bert", cls, head=_bert_cls, pooling="first",
                                                 head_steps=bert_classifier_steps, **bert_like),
        "RobertaForSequenceClassification": Adapter("roberta", cls, head=_classification_head, pooling="first",
                                                    head_steps=roberta_classifier_steps, **roberta_like),
        "DistilBertForSequenceClassification": Adapter("distilbert", cls, head=_distilbert_cls, pooling="first",
                                                       **distil),
        "DebertaV2ForSequenceClassification": Adapter("deberta-v2", cls, head=_deberta_cls, pooling="first",
                                                      **deberta),
        "ElectraForSequenceClassification": Adapter("electra", cls, head=_classification_head, pooling="first",
                                                    head_steps=electra_classifier_steps, **electra),
        "BertForMaskedLM": Adapter("bert", mlm, head=_bert_mlm, pooling="mask", head_steps=bert_mlm_steps,
                                   **bert_like),
        "RobertaForMaskedLM": Adapter("roberta", mlm, head=_roberta_mlm, pooling="mask",
                                      head_steps=roberta_mlm_steps, **roberta_like),
        "DistilBertForMaskedLM": Adapter("distilbert", mlm, head=_distilbert_mlm, pooling="mask", **distil),
        "DebertaV2ForMaskedLM": Adapter("deberta-v2", mlm, head=_deberta_mlm, pooling="mask", **deberta),
        "ElectraForMaskedLM": Adapter("electra", mlm, head=_electra_mlm, pooling="mask", head_steps=electra_mlm_steps,
                                      **electra),
        "GPT2ForSequenceClassification": _decoder("gpt2", cls, _score_head, "transformer", "drop", "h", "ln_f"),
        "GPT2LMHeadModel": _decoder("gpt2", clm, _lm_head, "transformer", "drop", "h", "ln_f"),
    }
    adapters["XLMRobertaForSequenceClassification"] = Adapter(
        "xlm-roberta", cls, head=_classification_head, pooling="first", head_steps=roberta_classifier_steps,
        **roberta_like)
    adapters["XLMRobertaForMaskedLM"] = Adapter("xlm-roberta", mlm, head=_roberta_mlm, pooling="mask",
                                                head_steps=roberta_mlm_steps, **roberta_like)
    for name in ("Llama", "Mistral", "Qwen2", "Qwen3"):
        family = name.lower()
        adapters[f"{name}ForSequenceClassification"] = _decoder(
            family, cls, _score_head, "model", "embed_tokens", "layers", "norm")
        adapters[f"{name}ForCausalLM"] = _decoder(family, clm, _lm_head, "model", "embed_tokens", "layers", "norm")
    return adapters
