"""Tiny random models of every architecture transformers lists as a causal LM, a masked LM or a sequence classifier,
built from the architecture's own default config, shrunk (2 layers, hidden size 64, a 512-token vocabulary).

transformers itself fails on some shrunk configs (a per-layer list the shrink breaks, a special token id outside
the vocabulary...); :func:`build` raises :class:`TransformersFailed` for those, and the coverage test lists them
apart from normx's verdicts.
"""

from __future__ import annotations

import contextlib
import signal
import warnings

import torch
import transformers
from transformers import CONFIG_MAPPING

from normx.models.coverage import FAILS, REFUSED, VERIFIED, WRONG, failure_detail, listed_architectures

SHRINK = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, intermediate_size=128,
              head_dim=16, moe_intermediate_size=32, num_experts=4, num_local_experts=4, n_routed_experts=4,
              num_experts_per_tok=2, shared_expert_intermediate_size=32, vocab_size=512)
SPECIAL_IDS = ("pad_token_id", "bos_token_id", "eos_token_id", "sep_token_id", "cls_token_id", "mask_token_id",
               "decoder_start_token_id")
SECONDS = 30  # building and running one tiny model
transformers.utils.logging.set_verbosity_error()


class TransformersFailed(Exception):
    """transformers cannot build or run the architecture from its shrunk default config."""


def architectures(kind: str | None = None) -> list[tuple[str, str, str]]:
    """(head kind, model type, class name) of every architecture in the mappings (of one kind) that transformers
    exports."""
    return [(head, model_type, name) for head, model_type, name in listed_architectures()
            if kind in (None, head) and hasattr(transformers, name)]


def config(model_type: str, kind: str):
    default = CONFIG_MAPPING[model_type]()
    kwargs = {key: value for key, value in SHRINK.items() if isinstance(getattr(default, key, None), int)}
    made = CONFIG_MAPPING[model_type](**kwargs)
    for name in SPECIAL_IDS:  # ids the shrunk vocabulary no longer has
        value = getattr(made, name, None)
        if isinstance(value, int) and value >= SHRINK["vocab_size"]:
            setattr(made, name, 0 if name == "pad_token_id" else 1)
    if kind == "causal_lm":  # as a real checkpoint of the class is: a model that can be both is a decoder here
        for name in ("is_decoder", "causal"):  # (RoBERTa-family *ForCausalLM, XLM's XLMWithLMHeadModel)
            if getattr(default, name, None) is False:
                setattr(made, name, True)
    if kind == "sequence_classification":
        made.num_labels = 3
        if getattr(made, "pad_token_id", None) is None:
            made.pad_token_id = 0
    return made


@contextlib.contextmanager
def _time_limit(seconds: int):
    def expire(*_):
        raise TransformersFailed(f"over {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def build(model_type: str, name: str, kind: str, seed: int = 0):
    """The tiny model (eval mode), after one forward pass of transformers' own proves it runs;
    :class:`TransformersFailed` otherwise."""
    with warnings.catch_warnings(), _time_limit(SECONDS):
        warnings.simplefilter("ignore")
        try:
            made = config(model_type, kind)
            torch.manual_seed(seed)
            model = getattr(transformers, name)(made).eval()
            ids = torch.arange(200, 214).reshape(2, 7) % SHRINK["vocab_size"]
            with torch.no_grad():
                model(input_ids=ids, attention_mask=torch.ones_like(ids))
        except TransformersFailed:
            raise
        except Exception as exc:  # transformers' own failure on the shrunk config
            raise TransformersFailed(failure_detail(exc)) from None
    return model


# ---- verdicts ---------------------------------------------------------------------------------------------------

TOLERANCE = 1e-4  # float32: NormXLogit against the reference, as a fraction of its scale


MASK_ID = 7  # a masked LM's tiny tokenizer's mask token (a masked LM's prediction is read there)


def word_tokenizer(model, kind: str):
    """A fast word-level tokenizer for a tiny model: the word ``w{i}`` is token id ``i`` (no special tokens added),
    padding with the config's pad token (else ``w0``), with the mask token ``w7`` for masked LMs."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    table = model.get_input_embeddings()
    vocab = getattr(table, "num_embeddings", None) or table.weight.shape[0]
    words = Tokenizer(models.WordLevel({f"w{i}": i for i in range(vocab)}, unk_token="w0"))
    words.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    pad = getattr(model.config, "pad_token_id", None)
    pad = pad if isinstance(pad, int) and 0 <= pad < vocab else 0
    special = {"mask_token": f"w{MASK_ID}"} if kind == "masked_lm" else {}
    return PreTrainedTokenizerFast(tokenizer_object=words, pad_token=f"w{pad}",
                                   model_input_names=["input_ids", "attention_mask"], **special)


def reference_texts(model, kind: str) -> list[str]:
    """Two texts of different lengths (so that normx pads one), of ordinary ids; a masked LM's with a mask token."""
    from normx.core.verify import probe_rows

    ids = probe_rows(model)[0]
    rows = [list(ids), list(ids[::-1][:5])]
    if kind == "masked_lm":
        for row in rows:
            row[3] = MASK_ID
    return [" ".join(f"w{i}" for i in row) for row in rows]


def reference_check(model, kind: str) -> float:
    """NormXLogit at the last layer, as a user gets it from ``normx.explain(model, tokenizer, texts)`` (two texts of
    different lengths in one padded batch), against a reference read from the model as its user runs it: the plain
    ``model(**tokenizer(text), output_hidden_states=True)`` of each text alone, ``||hidden_states[0]||`` times its
    logits (at every position for LM heads, at the pooled one for classifiers). With ``"late"`` pooling (the
    prediction is the mean of the head on every token) LogAt = NormXLogit / norm, averaged over the tokens, must be
    the model's logit. Returns the largest difference as a fraction of the reference's scale."""
    import normx

    tokenizer = word_tokenizer(model, kind)
    texts = reference_texts(model, kind)
    explanations = normx.explain(model, tokenizer, texts, "normxlogit", batch_size=len(texts))
    worst = 0.0
    for text, exp in zip(texts, explanations):
        with torch.no_grad():
            own = model(**tokenizer(text, return_tensors="pt"), output_hidden_states=True)
        norms = own.hidden_states[0][0].float().norm(dim=-1)  # [T]
        logits = own.logits[0].float()
        got = torch.from_numpy(exp.scores[0, -1]).float()  # [T]
        if kind == "sequence_classification":
            column = int(logits.argmax())  # the model's own prediction, which normx explains by default
            if plan_pooling(model) == "late":
                want, got = logits[column], (got / norms).mean()
            else:
                want, got = norms[exp.pooled] * logits[column], got[exp.pooled]
        else:
            column = tokenizer.convert_tokens_to_ids(exp.labels[0])
            if column != int(logits[exp.pooled].argmax()):  # the model's own prediction
                return float("inf")
            want = norms * logits[:, column]
        worst = max(worst, float((got - want).abs().max() / want.abs().max().clamp_min(1e-12)))
    return worst


def plan_pooling(model) -> str:
    from normx.core.verify import verified_adapter

    return verified_adapter(model).pooling


def verdict(kind: str, model_type: str, name: str) -> tuple[str, str]:
    """(verified / refused / transformers fails, detail): the reason of a refusal or failure; for a verified
    model, how far NormXLogit is from the reference (it must be within float32 rounding)."""
    import normx
    from normx.core.verify import verified_adapter

    try:
        model = build(model_type, name, kind)
    except TransformersFailed as exc:
        return FAILS, str(exc)
    try:
        adapter = verified_adapter(model)
    except normx.UnsupportedModelError as exc:
        return REFUSED, _reason(str(exc))
    off = reference_check(model, kind)
    return VERIFIED if off <= TOLERANCE else WRONG, f"{adapter.family}; NormXLogit off the reference by {off:.1e}"


def _reason(message: str) -> str:
    for start, end in (("cannot explain ", ". A bare encoder"), ("does not match at ", ". normx will not")):
        if start in message:
            text = message.split(start, 1)[1].split(end, 1)[0]
            return text.split(": ", 1)[1] if start.startswith("cannot") else text
    return message
