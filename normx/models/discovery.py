"""Adapters discovered from a model's own conventions, for the architectures no adapter is registered for.

What NormXLogit needs of a model is the same in every architecture that follows transformers' conventions:

- the head's kind, from transformers' own auto-model mappings (the class is listed as a causal LM, a masked LM or a
  sequence classifier);
- the stack of blocks: the module list of ``config.num_hidden_layers`` blocks inside ``model.base_model`` (or, for
  layers shared in ``num_hidden_groups`` groups as in ALBERT, each group once per layer it runs for);
- x^0, ``hidden_states[0]``: the input of the first block (``Adapter.embeddings=None``; scaled embeddings such as
  Gemma's and embedding projections are inside it);
- the final norm: the norm module registered after the blocks in the module that holds them (decoders);
- the head: ``get_output_embeddings()`` for LM heads, with the final logit transform the config names
  (soft-capping, a logit scale); the ``score`` layer of decoder classifiers, pooled at the last real token; an
  encoder's classification head through the base model's pooler, pooled at the first token, or over every token
  where the config says ``classifier_pooling="mean"`` (then LogAt is the head on each token's representation).

Nothing here is trusted: :mod:`normx.core.verify` checks every adapter against the model's own outputs on first
use, and a model that does not fit is refused with the part that failed. What is refused here, with its reason:
encoder-decoder models, a stack of blocks that is neither one module list of ``num_hidden_layers`` nor shared
groups, and
heads this module does not describe (encoder classifiers and masked-LM heads of unregistered families: register an
adapter for them).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from normx._torch import torch
from normx.models.adapter import Adapter, HeadKind
from normx.models.modules import active_module, linear_columns

if TYPE_CHECKING:
    from torch import nn

# config attribute -> the transform the model's forward applies to its LM logits
LOGIT_TRANSFORMS = {
    "final_logit_softcapping": lambda z, cap: torch.tanh(z / cap) * cap,  # Gemma-2 / 3
    "logit_scale": lambda z, scale: z * scale,  # Cohere
    "logits_scaling": lambda z, scale: z / scale,  # Granite
}


def logit_softcap(config) -> float | None:
    """The cap of the tanh the model's forward puts on its LM logits (``final_logit_softcapping``: Gemma-2 / 3), or
    None."""
    config = config.get_text_config() if hasattr(config, "get_text_config") else config
    cap = getattr(config, "final_logit_softcapping", None)
    return float(cap) if isinstance(cap, (int, float)) and not isinstance(cap, bool) and cap else None


# model type -> where its base model breaks the conventions (paths inside the base model); verified like the rest
OVERRIDES = {
    # a block's parts in four parallel module lists: hidden_states[l + 1] is layer_norm2[l]'s output (post-LN),
    # hidden_states[0] the embedding LayerNorm's
    "xlm": {"embeddings": "layer_norm_emb", "blocks": "layer_norm2"},
    "flaubert": {"embeddings": "layer_norm_emb", "blocks": "layer_norm2"},
}
# config.classifier_pooling -> the adapter's pooling (ModernBERT: cls / mean; EuroBERT: bos / mean / late)
_CLASSIFIER_POOLING = {"mean": "mean", "late": "late", "cls": "first", "bos": "first"}
_NORM_NAMES = ("norm", "ln_f", "final_layer_norm", "final_layernorm", "norm_f", "final_norm", "ln_out", "layer_norm",
               "layernorm")


class NotDiscovered(Exception):
    """Why no adapter could be discovered (the message is the reason)."""


def head_kind(class_name: str, config=None) -> HeadKind | None:
    """The kind of head transformers' auto-model mappings list the class under, or None. A class listed both as a
    causal and as a masked LM (XLM's ``XLMWithLMHeadModel``) is a causal LM only where its config says its attention
    is causal (``causal`` / ``is_decoder``), else a masked LM."""
    from transformers.models.auto import modeling_auto as auto

    found = [kind for kind, mapping in ((HeadKind.CAUSAL_LM, auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES),
                                        (HeadKind.MASKED_LM, auto.MODEL_FOR_MASKED_LM_MAPPING_NAMES),
                                        (HeadKind.SEQUENCE_CLASSIFICATION,
                                         auto.MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES))
             if any(class_name in ((value,) if isinstance(value, str) else tuple(value)) for value in mapping.values())]
    if {HeadKind.CAUSAL_LM, HeadKind.MASKED_LM} <= set(found):
        causal = bool(getattr(config, "causal", False) or getattr(config, "is_decoder", False))
        return HeadKind.CAUSAL_LM if causal else HeadKind.MASKED_LM
    return found[0] if found else None


def discover(model: nn.Module) -> Adapter:
    """An adapter for ``model`` (PEFT-unwrapped) from its conventions; :class:`NotDiscovered` with the reason."""
    name = type(model).__name__
    kind = head_kind(name, model.config)
    if kind is None:
        raise NotDiscovered(f"transformers does not list {name} as a causal LM, masked LM or sequence classifier")
    config = model.config
    if getattr(config, "is_encoder_decoder", False):
        raise NotDiscovered("it is an encoder-decoder model: the head reads the decoder, whose tokens are not the "
                            "input's")
    base = model.base_model
    if base is model:
        raise NotDiscovered("it has no base model (base_model is the model itself)")
    prefix = _path(model, base)
    override = OVERRIDES.get(getattr(config, "model_type", None), {})
    if "blocks" in override:
        blocks, parent, groups = override["blocks"], override["blocks"].rpartition(".")[0], None
    else:
        blocks, parent, groups = _blocks(base, config)
    pooling = "last" if kind is HeadKind.CAUSAL_LM else "mask" if kind is HeadKind.MASKED_LM else None
    if kind is HeadKind.SEQUENCE_CLASSIFICATION:
        if _is_linear(getattr(model, "score", None)):  # a decoder's score layer, pooled at the last real token
            head, pooling = _score_head, "last"
        else:  # a classification head pooled over every token (the config says), at the last token of a decoder
            _head_modules(model, base, "classification")  # (its model type has a causal LM and no masked LM), or
            pooling = _CLASSIFIER_POOLING.get(getattr(config, "classifier_pooling", None))  # an encoder's first token
            head, pooling = _classifier_head, pooling or ("last" if _decoder(config) else "first")
    else:
        if model.get_output_embeddings() is None:
            raise NotDiscovered("it has no output embeddings (get_output_embeddings() is None)")
        _head_modules(model, base, "LM")
        head = _lm_head
    norm = _final_norm(base, parent, blocks)
    path = ".".join(filter(None, (prefix, blocks)))
    layers = (config.get_text_config() if hasattr(config, "get_text_config") else config).num_hidden_layers
    embeddings = override.get("embeddings")
    return Adapter(family=f"{config.model_type} (discovered)", kind=kind,
                   embeddings=None if embeddings is None else ".".join(filter(None, (prefix, embeddings))),
                   blocks=path if groups is None else _shared(path, groups, layers), head=head, pooling=pooling,
                   final_norm=None if norm is None else ".".join(filter(None, (prefix, norm))))


def _decoder(config) -> bool:
    """The model type has a causal LM in transformers' mappings and no masked LM: a left-to-right decoder."""
    from transformers.models.auto import modeling_auto as auto

    kind = getattr(config, "model_type", None)
    return kind in auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES and kind not in auto.MODEL_FOR_MASKED_LM_MAPPING_NAMES


def _path(root: nn.Module, module: nn.Module) -> str:
    for name, candidate in root.named_modules():
        if candidate is module:
            return name
    raise NotDiscovered("its base model is not one of its modules")


def _blocks(base: nn.Module, config) -> tuple[str, str, int | None]:
    """(dotted path of the module list of blocks, path of the module that holds it, and for layers shared in
    ``num_hidden_groups`` groups (ALBERT) the number of groups, else None)."""
    from torch import nn

    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    layers = getattr(text, "num_hidden_layers", None)
    if not isinstance(layers, int) or layers < 1:
        raise NotDiscovered("its config has no num_hidden_layers")

    def lists(length: int) -> list[str]:
        return [name for name, module in base.named_modules()
                if isinstance(module, nn.ModuleList) and len(module) == length
                and len({type(block) for block in module}) <= 2]

    found, groups = lists(layers), None
    if not found:  # layers shared across the stack: num_hidden_groups groups, each run layers / groups times
        groups = getattr(text, "num_hidden_groups", None)
        if isinstance(groups, int) and groups >= 1 and layers % groups == 0:
            found = lists(groups)
    if not found:
        raise NotDiscovered(f"no module list of its num_hidden_layers={layers} blocks (shared or grouped layers)")
    path = min(found, key=lambda name: name.count("."))  # the outermost
    return path, path.rpartition(".")[0], groups


def _shared(path: str, groups: int, layers: int):
    """The blocks of a stack whose ``groups`` modules each run ``layers / groups`` times in turn, in call order."""
    def blocks(model: nn.Module) -> list[nn.Module]:
        stack = model.get_submodule(path)
        return [stack[i * groups // layers] for i in range(layers)]

    return blocks


def _final_norm(base: nn.Module, parent: str, blocks: str) -> str | None:
    """The final norm: in the module that holds the blocks, a norm child with a final norm's usual name (``norm``,
    ``ln_f``, ``final_layer_norm``, ...), else the first norm registered after the blocks; else a norm child of the
    base model itself (pre-LayerNorm encoders keep it there); None if there is none."""
    holder = base.get_submodule(parent) if parent else base
    names = [name for name, _ in holder.named_children()]
    norms = [name for name in names if _is_norm(holder.get_submodule(name))]
    after = [name for name in names[names.index(blocks.rpartition(".")[2]) + 1:] if name in norms]
    chosen = next((name for name in _NORM_NAMES if name in norms), after[0] if after else None)
    if chosen is not None:
        return ".".join(filter(None, (parent, chosen)))
    if parent:
        outer = [name for name, module in base.named_children() if _is_norm(module)]
        return outer[0] if outer else None
    return None


def _is_norm(module) -> bool:
    """A normalisation layer: nn.LayerNorm / nn.RMSNorm or a class named ...Norm (LlamaRMSNorm, ...)."""
    from torch import nn

    return isinstance(module, (nn.LayerNorm, nn.RMSNorm)) or type(module).__name__.lower().endswith("norm")


def _is_linear(module) -> bool:
    """A layer with weights: an nn.Linear, or one wrapped by PEFT (LoRA, a saved copy)."""
    return module is not None and (hasattr(active_module(module), "weight") or hasattr(module, "base_layer"))


def _head_modules(model: nn.Module, base: nn.Module, what: str) -> list[nn.Module]:
    """The modules of the task model outside its base model, in the order they are registered (dropout and loss
    modules left out): the head, run in that order."""
    from torch import nn

    modules = [module for name, module in model.named_children()
               if module is not base and not isinstance(module, nn.Dropout) and "loss" not in name.lower()]
    if not modules:
        raise NotDiscovered(f"no {what} head outside its base model")
    return modules


def _lm_head(model, h, columns=None):
    """The LM head: the task model's modules outside the base model, in order, up to the one that holds the output
    embedding (the output embedding alone for most decoders; BERT-style prediction heads; other heads, such as
    LUKE's entity head, after it are not the LM's), then the logit transform the config names."""
    output = model.get_output_embeddings()
    modules = _head_modules(model, model.base_model, "LM")
    holder = next((i for i, module in enumerate(modules) if any(m is output for m in module.modules())), None)
    modules = modules if holder is None else modules[:holder + 1]
    for module in modules[:-1]:
        h = module(h)
    if modules[-1] is output:
        logits = linear_columns(output, h, columns)
    else:
        logits = modules[-1](h)
        logits = logits[0] if isinstance(logits, tuple) else logits  # (XLM's prediction layer returns a tuple)
        logits = logits if columns is None else logits[..., columns]
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    for attribute, transform in LOGIT_TRANSFORMS.items():
        value = getattr(config, attribute, None)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value:
            logits = transform(logits, value)
    return logits


def _classifier_head(model, h, columns=None):
    """A classification head on each token as if it were the pooled one: the base's pooler (and its activation)
    when it has one and the head starts with a linear layer (which reads the pooled vector; a head module of its
    own pools the sequence itself, as RoBERTa's and BigBird's), then the head's modules, given each token as a
    length-1 sequence."""
    base = model.base_model
    x = h[:, None, :]
    modules = _head_modules(model, base, "classification")
    pooler = getattr(base, "pooler", None)
    if pooler is not None and _is_linear(modules[0]):
        x = pooler(x)
        activation = getattr(base, "pooler_activation", None)
        x = x if activation is None else activation(x)
    for module in modules:
        x = module(x)
    return x[:, 0] if x.dim() == 3 else x


def _score_head(model, h, columns=None):
    return model.score(h)
