"""Attention rows in linear memory (#45): each block's probabilities recomputed at the query rows read, from the
block's own queries and keys (normx.models.attention_scores), equal the probabilities eager attention returns at those
rows, in every family the decoder tests cover (rotary, partial rotary, grouped-query heads, q / k norms, clipped
projections, soft-caps, sliding windows, a padded batch); the methods run on the model's own attention implementation
(no eager pass) and the memory they take grows with the tokens, not their square."""

from __future__ import annotations

import architectures
import numpy as np
import pytest
import tiny
import torch
import transformers

import normx
from normx.core.forward import Pass
from normx.core.hooks import hooked, output_tensor
from normx.methods.decoder import head_rows, maps, query_rows
from normx.methods.decoder.heads import block_attention
from normx.models import get_adapter
from normx.models.attention_scores import read_scores

# (model type, class, config changes): sliding windows shorter than the text, a soft-cap that matters, a clip,
# attention sinks
FAMILIES = [
    ("llama", "LlamaForCausalLM", {}),
    ("qwen2", "Qwen2ForCausalLM", {"use_sliding_window": True, "sliding_window": 5, "max_window_layers": 0}),
    ("qwen3", "Qwen3ForCausalLM", {}),
    ("mistral", "MistralForCausalLM", {"sliding_window": 5}),
    ("gemma", "GemmaForCausalLM", {}),
    ("gemma2", "Gemma2ForCausalLM", {"sliding_window": 5, "attn_logit_softcapping": 0.5}),
    ("gemma3_text", "Gemma3ForCausalLM", {"sliding_window": 5}),
    ("gpt2", "GPT2LMHeadModel", {}),
    ("gpt_neox", "GPTNeoXForCausalLM", {}),
    ("phi3", "Phi3ForCausalLM", {}),
    ("phi", "PhiForCausalLM", {}),
    ("olmo", "OlmoForCausalLM", {"clip_qkv": 0.3}),
    ("olmo2", "Olmo2ForCausalLM", {}),
    ("gpt_oss", "GptOssForCausalLM", {"sliding_window": 5}),  # attention sinks, half-width cos / sin
]
IDS = torch.tensor([[5, 17, 90, 33, 41, 8, 120, 77, 64, 12, 300, 9], [7, 250, 31, 16, 44, 99, 21, 3, 0, 0, 0, 0]])
MASK = (torch.arange(12) < torch.tensor([[12], [8]])).long()
QUERIES = torch.tensor([[11, 2, 7], [7, 0, 4]])  # each row's last real token, the first, one between


def build(model_type: str, name: str, changes: dict, implementation: str | None = None):
    config = architectures.config(model_type, "causal_lm")
    for key, value in changes.items():
        setattr(config, key, value)
    torch.manual_seed(0)
    model = getattr(transformers, name)(config).eval()
    tiny.randomize(model, seed=1)  # weights large enough for peaked attention: a wrong rotation shows
    if implementation is not None:
        model.set_attn_implementation(implementation)
    return model


def eager_rows(model) -> list[torch.Tensor]:
    """Every block's probabilities at QUERIES [B, H, Q, T] from eager attention's output_attentions."""
    model.set_attn_implementation("eager")
    with torch.no_grad():
        out = model(input_ids=IDS, attention_mask=MASK, output_attentions=True)
    index = QUERIES[:, None, :, None]
    return [a.gather(2, index.expand(a.shape[0], a.shape[1], -1, a.shape[-1])) * MASK[:, None, None] for a in
            out.attentions]


@pytest.mark.parametrize(("model_type", "name", "changes"), FAMILIES, ids=[f[1] for f in FAMILIES])
def test_recomputed_rows_equal_eager_attention(model_type, name, changes):
    """read_scores on what each attention module received under eager attention (its float mask) gives the
    probabilities the module returned, at the rows read."""
    model = build(model_type, name, changes)
    want = eager_rows(model)
    adapter = get_adapter(model)
    blocks = adapter.block_modules(model)
    parts = [adapter.attention_parts(model, block) for block in blocks]
    seen, got = {}, []
    modules = {}
    for i, p in enumerate(parts):
        modules[f"{i}.attention"] = p.module
        modules |= {f"{i}.qk.{role}": m for role, m in p.query_key_sources().items()}

    def on_call(key, _args, kwargs, output):
        i, part, *role = key.split(".")
        if part == "qk":
            seen[role[0]] = output_tensor(output)
            return
        scores = read_scores(parts[int(i)], dict(seen), kwargs, MASK)
        assert not isinstance(scores, str), scores
        got.append(scores.probabilities(QUERIES) * MASK[:, None, None])

    with torch.no_grad(), hooked(modules, on_call):
        model(input_ids=IDS, attention_mask=MASK)
    assert len(got) == len(want) == len(blocks)
    for mine, theirs in zip(got, want):
        np.testing.assert_allclose(mine.numpy(), theirs.float().numpy(), rtol=1e-5, atol=1e-6)


def test_only_the_rows_read_are_rotated():
    """A block's queries are kept as its projection made them (the model's dtype, not rotated): only the rows a
    method reads are converted and rotated, so nothing the size of every query is made for a few rows (the rows
    equal eager attention's: the test above); keys are rotated once, whole."""
    model = build("llama", "LlamaForCausalLM", {}).to(torch.bfloat16)
    adapter = get_adapter(model)
    parts = adapter.attention_parts(model, adapter.block_modules(model)[0])
    modules = {"attention": parts.module} | {f"qk.{role}": m for role, m in parts.query_key_sources().items()}
    seen, got = {}, []

    def on_call(key, _args, kwargs, output):
        if key.startswith("qk."):
            seen[key[3:]] = output_tensor(output)
        else:
            got.append(read_scores(parts, dict(seen), kwargs, MASK))

    with torch.no_grad(), hooked(modules, on_call):
        model(input_ids=IDS, attention_mask=MASK)
    scores = got[0]
    assert scores.rotation is not None and scores.dtype == torch.float32
    projected = parts.queries_keys(seen)[0].transpose(1, 2)
    assert scores.queries.dtype == torch.bfloat16 and torch.equal(scores.queries, projected)
    b, heads, t, d = scores.queries.shape
    index = QUERIES[:, None, :, None].expand(b, heads, QUERIES.shape[1], d)
    whole = scores.rotation.queries(scores.queries.float(), torch.arange(t).expand(b, -1))
    picked = scores.rotation.queries(scores.queries.float().gather(2, index), QUERIES)
    assert torch.equal(picked, whole.gather(2, index))
    assert not torch.equal(whole, scores.queries.float())  # (rotated: the positions differ)


SDPA = [family for family in FAMILIES if family[1] not in ("Gemma2ForCausalLM", "GptOssForCausalLM")]  # eager models


@pytest.mark.parametrize(("model_type", "name", "changes"), SDPA, ids=[f[1] for f in SDPA])
def test_methods_read_the_rows_on_the_models_own_attention(model_type, name, changes, monkeypatch):
    """read_blocks on a model running sdpa (its own default) recomputes the rows with no eager pass: they equal
    eager attention's, and norm_attention's check against the module's output passed at every block."""
    model = build(model_type, name, changes)
    want = eager_rows(build(model_type, name, changes))
    assert model.config._attn_implementation == "sdpa"

    def no_eager(_model):
        raise AssertionError("an eager-attention pass ran")

    monkeypatch.setattr(maps, "attention_weights", no_eager)
    blocks = list(range(1, len(want) + 1))
    read = block_attention(model, blocks, "norm_attention", values=True)
    run = Pass(model, get_adapter(model), {"input_ids": IDS, "attention_mask": MASK}, [len(blocks)]).locate()
    with torch.no_grad():
        rows = maps.read_blocks(run, QUERIES, read, "norm_attention", lambda _b, r, _v: r)
    for layer in blocks:  # (the two passes' hidden states differ by float rounding: sdpa against eager)
        np.testing.assert_allclose(rows[layer].numpy(), want[layer - 1].float().numpy(), rtol=1e-4, atol=2e-5)
    assert model.config._attn_implementation == "sdpa"


def test_a_position_bias_is_read_from_the_modules_own_probabilities(monkeypatch):
    """MPT adds ALiBi inside its module and always returns its probabilities: those are read (no eager pass)."""
    model = build("mpt", "MptForCausalLM", {})
    adapter = get_adapter(model)
    parts = adapter.attention_parts(model, adapter.block_modules(model)[0])
    reason = read_scores(parts, {"qkv": torch.zeros(1, 3, 3 * 64)}, {"position_bias": torch.zeros(4, 1, 3)},
                         torch.ones(1, 3))
    assert isinstance(reason, str) and "position bias of its own (position_bias)" in reason
    monkeypatch.setattr(maps, "attention_weights", lambda _m: (_ for _ in ()).throw(AssertionError("eager")))
    want = eager_rows(build("mpt", "MptForCausalLM", {}))
    read = block_attention(model, [1, 2], "norm_attention", values=True)
    run = Pass(model, adapter, {"input_ids": IDS, "attention_mask": MASK}, [2]).locate()
    with torch.no_grad():
        rows = maps.read_blocks(run, QUERIES, read, "norm_attention", lambda _b, r, _v: r)
    for layer in (1, 2):
        np.testing.assert_allclose(rows[layer].numpy(), want[layer - 1].numpy(), rtol=1e-5, atol=1e-6)


def test_head_rows_are_every_heads_probabilities_at_the_rows():
    """head_rows (the public per-head reading): [B, Q, layers, heads, T], eager's probabilities per head, and their
    mean over heads is the attention method's row."""
    model = build("llama", "LlamaForCausalLM", {})
    want = eager_rows(build("llama", "LlamaForCausalLM", {}))
    run = Pass(model, get_adapter(model), {"input_ids": IDS, "attention_mask": MASK}, [1, 2]).locate()
    with torch.no_grad():
        got = head_rows(run, QUERIES, [1, 2])
        mean = query_rows(run, QUERIES, "attention", aggregate=False)
    assert got.shape == (2, 3, 2, model.config.num_attention_heads, 12)
    for where in (0, 1):
        np.testing.assert_allclose(got[:, :, where].transpose(1, 2).numpy(), want[where].numpy(), rtol=1e-4,
                                   atol=2e-5)
    np.testing.assert_allclose(got.mean(3).numpy(), mean.numpy(), rtol=1e-5, atol=1e-7)


def _long_llama():
    """A tiny Llama with 2,048 positions on the tests' BPE tokenizer."""
    import copy

    tok = copy.deepcopy(tiny.bpe_tokenizer("llama"))
    tok.model_max_length = 2048
    config = transformers.LlamaConfig(vocab_size=len(tok), hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=2, intermediate_size=64, max_position_embeddings=2048,
                                      pad_token_id=tok.pad_token_id, bos_token_id=0, eos_token_id=2)
    torch.manual_seed(0)
    return tiny.randomize(transformers.LlamaForCausalLM(config), seed=3).eval(), tok


def _largest_tensor(fn) -> int:
    """The most elements of any one tensor an operator made during ``fn()``."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Largest(TorchDispatchMode):
        most = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for tensor in out if isinstance(out, (tuple, list)) else [out]:
                if isinstance(tensor, torch.Tensor):
                    Largest.most = max(Largest.most, tensor.numel())
            return out

    with Largest():
        fn()
    return Largest.most


@pytest.mark.parametrize("method", ["attention", "norm_attention", "alti_logit", "attention_logit"])
def test_memory_grows_with_the_tokens_not_their_square(method, monkeypatch):
    """The largest tensor made while explaining 8 teacher-forced steps after a prompt of T and of 2T tokens: about
    twice as large (a [T, T] matrix would make it four times), while the eager path it replaces grows 4x (its
    [B, heads, T, T] probabilities; ALTI-Logit's rows of contributions are chunks of a bounded size either way)."""
    import normx
    from normx.methods.decoder import decompose

    model, tok = _long_llama()
    largest = {}
    for words in (25, 50):
        prompt = " ".join(["the film was a gripping story of love"] * words)
        tokens = len(tok(prompt)["input_ids"])
        largest[tokens] = _largest_tensor(lambda prompt=prompt: normx.explain_generation(
            model, tok, prompt, method=method, target=list(range(10, 18))))
    (short, small), (long, big) = sorted(largest.items())
    assert 1.9 < long / short < 2.1
    assert big / small < 2.3, largest
    if method == "alti_logit":  # its largest tensors are chunks of a bounded size on either path
        return
    monkeypatch.setattr(maps, "linear_modules", lambda _read: None)  # the eager path, for contrast
    monkeypatch.setattr(decompose, "linear_modules", lambda _read: None)
    eager = [_largest_tensor(lambda w=w: normx.explain_generation(
        model, tok, " ".join(["the film was a gripping story of love"] * w), method=method,
        target=list(range(10, 18)))) for w in (25, 50)]
    assert eager[1] / eager[0] > 3.5, eager


@pytest.mark.parametrize("method", ["alti_logit", "decompx"])
def test_recorded_pass_needs_no_eager_attention(method, monkeypatch):
    """ALTI-Logit and decoder DecompX record each block's queries and keys on the model's own attention (no eager
    pass) and give what the eager path's stored probabilities give (a padded batch, every layer)."""
    import normx
    from normx.methods.decoder import decompose

    model, tok = tiny.build("Qwen2ForCausalLM")
    texts = ["the film was a gripping story", "a dull movie"]
    monkeypatch.setattr(decompose, "attention_weights", lambda _m: (_ for _ in ()).throw(AssertionError("eager")))
    linear = normx.explain(model, tok, texts, method=method, layer="all")
    monkeypatch.undo()
    monkeypatch.setattr(decompose, "linear_modules", lambda _read: None)
    eager = normx.explain(model, tok, texts, method=method, layer="all")
    for mine, theirs in zip(linear, eager):
        np.testing.assert_allclose(mine.scores, theirs.scores, rtol=1e-4, atol=1e-5 * np.abs(theirs.scores).max())


def test_the_rows_checks_are_read_once_after_the_pass(monkeypatch):
    """Every block's checks are tensors made inside the hooks and read in one copy after the forward pass (no device
    synchronisation inside it): the blocks' sums and mixes are all pending when the last block has run. (A model's
    first pass of a kind makes the checks: normx.methods.decoder.checked; so a model no other test has read.)"""
    from normx.methods.decoder import maps

    model, tok = tiny.build("LlamaForCausalLM", fresh=True)
    copies = []
    real = maps.Checks.verify

    def verify(self):
        copies.append([what for what, *_ in self._pending])
        return real(self)

    monkeypatch.setattr(maps.Checks, "verify", verify)
    normx.explain_generation(model, tok, "the film was good", method="norm_attention", target=[5, 6, 7])
    blocks = model.config.num_hidden_layers
    assert copies == [["sums", "mix"] * blocks]
