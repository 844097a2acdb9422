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
from transformers.models.auto import modeling_auto as auto

MAPPINGS = {"causal_lm": auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES, "masked_lm": auto.MODEL_FOR_MASKED_LM_MAPPING_NAMES,
            "sequence_classification": auto.MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES}
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
    """(head kind, model type, class name) of every architecture in the mappings (of one kind)."""
    out = []
    for head, mapping in MAPPINGS.items():
        if kind in (None, head):
            for model_type, names in mapping.items():
                for name in (names,) if isinstance(names, str) else names:
                    if hasattr(transformers, name):
                        out.append((head, model_type, name))
    return out


def config(model_type: str, kind: str):
    default = CONFIG_MAPPING[model_type]()
    kwargs = {key: value for key, value in SHRINK.items() if isinstance(getattr(default, key, None), int)}
    made = CONFIG_MAPPING[model_type](**kwargs)
    for name in SPECIAL_IDS:  # ids the shrunk vocabulary no longer has
        value = getattr(made, name, None)
        if isinstance(value, int) and value >= SHRINK["vocab_size"]:
            setattr(made, name, 0 if name == "pad_token_id" else 1)
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
            raise TransformersFailed(f"{type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''}"
                                     ) from None
    return model


# ---- verdicts ---------------------------------------------------------------------------------------------------

VERIFIED, REFUSED, FAILS, WRONG = "verified", "refused", "transformers fails", "wrong scores"
TOLERANCE = 1e-4  # float32: NormXLogit against the reference, as a fraction of its scale


class _Tokenizer:
    """What explain's plan reads of a tokenizer here: the mask token (a masked LM's prediction is read there)."""

    mask_token_id = 7


def reference_check(model, kind: str) -> float:
    """NormXLogit at the last layer, computed by normx, against a reference read from the model's own forward
    (``hidden_states[0]`` and its logits): at every position for LM heads, at the pooled one for classifiers.
    With ``"late"`` pooling (the prediction is the mean of the head on every token) LogAt = NormXLogit / norm,
    averaged over the tokens, must be the model's logit. Returns the largest difference as a fraction of the
    reference's scale."""
    from normx.core.verify import probe_inputs
    from normx.explanations.explain import attribute_batch, prepare

    inputs = probe_inputs(model)
    if kind == "masked_lm":
        inputs["input_ids"][:, 3] = _Tokenizer.mask_token_id
    plan = prepare(model, _Tokenizer(), "normxlogit")
    out = attribute_batch(plan, inputs)
    with torch.no_grad():
        own = model(**inputs, output_hidden_states=True)
    norms = own.hidden_states[0].float().norm(dim=-1)  # [B, T]
    rows = torch.arange(norms.shape[0])
    pooled, target = out.pooled, out.columns[:, 0]
    got = out.scores[:, 0, 0]  # [B, T]
    if kind == "sequence_classification" and plan.adapter.pooling == "late":
        want = own.logits.float()[rows, target]
        got = (got / norms).mean(-1)
    elif kind == "sequence_classification":
        want = norms[rows, pooled] * own.logits.float()[rows, target]
        got = got[rows, pooled]
    else:
        assert torch.equal(target, own.logits[rows, pooled].argmax(-1))  # the model's own prediction
        want = norms * own.logits.float()[rows, :, target]
    return float((got - want).abs().max() / want.abs().max().clamp_min(1e-12))


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
