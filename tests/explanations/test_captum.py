"""``Generation.to_captum()`` / ``Explanation.to_captum()``: Captum's own ``LLMAttributionResult``, laid out as
Captum's ``LLMGradientAttribution`` lays out its results (the prompt's tokens as input features, the generated
tokens as outputs), and drawn by Captum's own plots."""

from __future__ import annotations

import numpy as np
import pytest
import tiny
import torch

import normx
from normx.errors import InvalidInputError

captum_attr = pytest.importorskip("captum.attr", reason="captum is in the test extra: pip install -e '.[test]'")
matplotlib = pytest.importorskip("matplotlib")
matplotlib.use("Agg")
from matplotlib import pyplot as plt  # noqa: E402 (after the backend is chosen)

PROMPT, CONTINUATION = "the film was", " a gripping story"


@pytest.fixture(scope="module")
def llama():
    return tiny.build("LlamaForCausalLM")


def plotted(result) -> tuple[list[str], list[str], list[str]]:
    """Captum's two plots of ``result``: the token plot's x and y tick labels and the sequence plot's x labels."""
    fig, ax = result.plot_token_attr(show=False)
    xs, ys = [t.get_text() for t in ax.get_xticklabels()], [t.get_text() for t in ax.get_yticklabels()]
    fig2, ax2 = result.plot_seq_attr(show=False)
    seq = [t.get_text() for t in ax2.get_xticklabels()]
    plt.close(fig)
    plt.close(fig2)
    return xs, ys, seq


def test_generation_as_captums_result(llama):
    model, tok = llama
    g = normx.explain_generation(model, tok, PROMPT, max_new_tokens=4)
    result = g.to_captum()
    assert isinstance(result, captum_attr.LLMAttributionResult)
    n = g.prompt_length
    assert result.input_tokens == g.vocabulary_tokens[:n] and result.output_tokens == [t.strip() for t in g.tokens[n:]]
    want = np.stack([row[:n] for row in g.rows()])  # each generated token's scores over the prompt only
    np.testing.assert_array_equal(result.token_attr.numpy(), want)
    np.testing.assert_allclose(result.seq_attr.numpy(), want.sum(0), rtol=1e-6)
    np.testing.assert_array_equal(result.output_probs.numpy(), g.probabilities)
    xs, ys, seq = plotted(result)
    assert len(xs) == len(seq) == n and len(ys) == g.steps


def test_the_layout_is_captums_own(llama):
    """Captum's LLMGradientAttribution on the same prompt and continuation has the same input and output tokens
    and the same shapes."""
    model, tok = llama
    g = normx.explain_generation(model, tok, PROMPT, target=CONTINUATION)
    ours = g.to_captum()
    gradient = captum_attr.LayerGradientXActivation(model, model.get_input_embeddings())
    theirs = captum_attr.LLMGradientAttribution(gradient, tok).attribute(
        captum_attr.TextTokenInput(PROMPT, tok), target=torch.tensor(g.token_ids[g.prompt_length:]))
    assert ours.input_tokens == theirs.input_tokens
    assert ours.output_tokens == theirs.output_tokens
    assert ours.token_attr.shape == theirs.token_attr.shape and ours.seq_attr.shape == theirs.seq_attr.shape


def test_layers_and_skipped_tokens(llama):
    model, tok = llama
    g = normx.explain_generation(model, tok, PROMPT, target=CONTINUATION, layer="all")
    first = g.to_captum(layer=1)
    np.testing.assert_array_equal(first.token_attr.numpy(), g.scores[g.layer_index(1), :, :g.prompt_length])
    assert not np.array_equal(first.token_attr.numpy(), g.to_captum().token_attr.numpy())
    assert g.vocabulary_tokens[0] == "<s>"
    for skip in (["<s>"], [g.token_ids[0]]):
        result = g.to_captum(skip_tokens=skip)
        assert result.input_tokens == g.vocabulary_tokens[1:g.prompt_length]
        np.testing.assert_array_equal(result.token_attr.numpy(), g.scores[-1, :, 1:g.prompt_length])
    with pytest.raises(InvalidInputError, match="skip_tokens"):
        g.to_captum(skip_tokens="<s>")
    empty = normx.explain_generation(model, tok, PROMPT, max_new_tokens=0)
    with pytest.raises(InvalidInputError, match="no generated tokens"):
        empty.to_captum()


def test_a_classifiers_explanation():
    model, tok = tiny.build("BertForSequenceClassification")
    e = normx.explain(model, tok, tiny.TEXTS[0], target="all")
    result = e.to_captum()
    assert result.input_tokens == e.tokens and result.output_tokens == e.labels
    np.testing.assert_array_equal(result.token_attr.numpy(), e.scores[:, -1])
    np.testing.assert_array_equal(result.seq_attr.numpy(), e.scores[0, -1])
    assert result.output_probs.numpy().tolist() == pytest.approx([e.probabilities[label] for label in e.labels])
    xs, ys, seq = plotted(result)
    assert len(xs) == len(seq) == len(e.tokens) and ys == e.labels
    contrast = normx.explain(model, tok, tiny.TEXTS[0], target="positive", foil="negative").to_captum()
    assert contrast.output_tokens == ["positive - negative"]


def test_a_regression_head_has_no_probabilities():
    model, tok = tiny.build("BertForSequenceClassification", num_labels=1)
    result = normx.explain(model, tok, tiny.TEXTS[0]).to_captum()
    assert result.output_probs is None and result.token_attr.shape == (1, len(result.input_tokens))
    plt.close(result.plot_seq_attr(show=False)[0])
