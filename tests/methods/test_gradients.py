"""Gradient baselines (Gradient Norm, Gradient×Input, Integrated Gradients, Random) against Captum.

The reference forward function :class:`ModelForward` never calls normx: it runs the whole model from
``inputs_embeds`` (the model's own position / type embeddings, LayerNorm and head) and reads its logits at the
pooled position, minus the foil column. Captum's Saliency / InputXGradient / IntegratedGradients on it, aggregated
over the embedding dimension here, must equal ``normx.explain`` within 1e-4 for every family, target kind, PEFT
model and text pair. normx's own forward function is checked separately against the model's logits from
``input_ids`` (position and type embeddings applied once).
"""

from __future__ import annotations

import json

import minilm
import numpy as np
import pytest
import tiny
import torch
from captum.attr import InputXGradient, IntegratedGradients, Saliency
from peft_cases import PEFT_CASES, base_of, peft_model
from tiny import CASES, PAIRS, TEXTS, build, texts_for

import normx
from normx.cli.main import main
from normx.errors import InvalidInputError
from normx.methods.gradients import RULES, HeadForward, integrated_gradients, rule_parameters, select
from normx.models import get_adapter

pytestmark = pytest.mark.filterwarnings("ignore:Input Tensor 0 did not already require gradients:UserWarning")
ATOL = 1e-4  # parity with Captum
RTOL = 1e-5  # float32 rounding, for the huge IG values of RMSNorm decoders from a zero baseline (~1e8)
INVARIANCE_ATOL = 1e-5
CLASSIFIERS = [c for c in CASES if c.kind == "sequence_classification"]
GRADIENT_METHODS = ("gradient_norm", "gradient_x_input", "integrated_gradients")


def ids(cases):
    return [c.id for c in cases]


# ---- the reference ---------------------------------------------------------------------------------------------------

def batch(case, tokenizer, texts, pairs=None, side=None) -> dict:
    """The padded batch as the model takes it; decoders get position ids that skip left padding."""
    before = tokenizer.padding_side
    tokenizer.padding_side = side or before
    try:
        enc = dict(tokenizer(texts, pairs, padding=True, return_tensors="pt"))
    finally:
        tokenizer.padding_side = before
    if case.decoder:
        enc["position_ids"] = (enc["attention_mask"].cumsum(-1) - 1).clamp(min=0)
    return enc


def pooled_positions(case, model, tokenizer, enc) -> torch.Tensor:
    ids_, mask = enc["input_ids"], enc["attention_mask"]
    if case.kind == "masked_lm":
        return (ids_ == tokenizer.mask_token_id).int().argmax(-1)
    rows = range(len(ids_))
    if case.decoder:  # decoder classifiers skip trailing pad tokens, as transformers does
        pad = base_of(model).config.pad_token_id if case.kind == "sequence_classification" else None
        return torch.tensor([max(j for j in range(mask.shape[1]) if mask[r, j] and ids_[r, j] != pad) for r in rows])
    return torch.tensor([min(j for j in range(mask.shape[1]) if mask[r, j]) for r in rows])


class ModelForward:
    """f(inputs_embeds) -> [N, C]: the whole model's logits at the pooled position (minus the foil column)."""

    def __init__(self, model, case, enc, pooled, foil: int | None = None):
        self.base, self.case, self.pooled, self.foil = base_of(model), case, pooled, foil
        self.inputs = {k: v for k, v in enc.items() if k != "input_ids"}

    def __call__(self, embeds):
        repeats = embeds.shape[0] // len(self.pooled)
        inputs = {k: v.repeat(repeats, 1) for k, v in self.inputs.items()}
        pooled, rows = self.pooled.repeat(repeats), torch.arange(embeds.shape[0])
        kwargs = {"use_cache": False} if self.case.decoder else {}
        if self.case.decoder and self.case.kind == "sequence_classification":
            # the model pools at -1 without input_ids; read its score head on every position instead
            seen = {}
            handle = self.base.score.register_forward_hook(lambda m, i, o: seen.setdefault("logits", o))
            try:
                self.base(inputs_embeds=embeds, **inputs, **kwargs)
            finally:
                handle.remove()
            logits = seen["logits"][rows, pooled]
        else:
            logits = self.base(inputs_embeds=embeds, **inputs, **kwargs).logits
            if self.case.kind != "sequence_classification":
                logits = logits[rows, pooled]
        return logits if self.foil is None else logits - logits[:, self.foil:self.foil + 1]


def aggregate(attributions: torch.Tensor, how: str) -> torch.Tensor:
    if how == "l1":
        return attributions.abs().sum(-1)
    if how == "l2":
        return attributions.pow(2).sum(-1).sqrt()
    return attributions.sum(-1)


def captum_scores(model, case, tokenizer, enc, method, columns, foil=None, **options):
    """Captum's attributions, aggregated -> ([B, K, T] scores, [B, K] IG deltas or None)."""
    base = base_of(model)
    forward = ModelForward(model, case, enc, pooled_positions(case, model, tokenizer, enc), foil)
    embeds = base.get_input_embeddings()(enc["input_ids"]).detach()
    how = options.get("aggregation", "l1")
    scores, deltas = [], []
    for k in range(columns.shape[1]):
        target = columns[:, k]
        if method == "gradient_norm":
            a = Saliency(forward).attribute(embeds, target=target, abs=False)
        elif method == "gradient_x_input":
            a = InputXGradient(forward).attribute(embeds, target=target)
        else:
            if options.get("baselines", "zero") == "zero":
                baseline = torch.zeros_like(embeds)
            else:
                pad = torch.tensor([[tokenizer.pad_token_id]])
                baseline = base.get_input_embeddings()(pad).detach().expand_as(embeds)
            a, delta = IntegratedGradients(forward).attribute(
                embeds, baselines=baseline, target=target, n_steps=options.get("n_steps", 50),
                method=options.get("rule", "gausslegendre"), internal_batch_size=options.get("internal_batch_size"),
                return_convergence_delta=True)
            deltas.append(delta)
        scores.append(aggregate(a.detach(), how))
    return torch.stack(scores, 1), (torch.stack(deltas, 1) if deltas else None)


def model_logits(model, case, tokenizer, enc) -> torch.Tensor:
    """The model's own logits at the pooled position, from input_ids: [B, C]."""
    with torch.no_grad():
        logits = model(**enc).logits
    if case.kind != "sequence_classification":
        logits = logits[torch.arange(len(logits)), pooled_positions(case, model, tokenizer, enc)]
    return logits


def check_captum(model, tokenizer, case, texts, method, target=None, foil=None, pairs=None, regression=False,
                 **options):
    """explain(...) == Captum on the reference forward, for every text and target, within ATOL."""
    explanations = normx.explain(model, tokenizer, texts, method=method, target=target, foil=foil, text_pair=pairs,
                                 batch_size=len(texts), **options)
    enc = batch(case, tokenizer, texts, pairs)
    logits = model_logits(model, case, tokenizer, enc)
    if regression or target is None:
        columns = torch.zeros((len(texts), 1), dtype=torch.long) if regression else logits.argmax(-1, keepdim=True)
    else:
        names = explanations[0].labels
        columns = torch.tensor([[column_of(case, tokenizer, n) for n in names]] * len(texts))
    foil_column = None if foil is None else column_of(case, tokenizer, foil)
    want, deltas = captum_scores(model, case, tokenizer, enc, method, columns, foil_column, **options)
    mask = enc["attention_mask"].bool()
    for row, exp in enumerate(explanations):
        assert exp.layers == [0] and exp.method == method
        got = exp.scores[:, 0]
        np.testing.assert_allclose(got, want[row][:, mask[row]].numpy(), atol=ATOL, rtol=RTOL)
        if not (method == "gradient_norm" and options.get("aggregation") == "sum"):  # see test_gradient_sum_...
            assert np.ptp(got, axis=-1).min() > 1e-3  # informative: a wrong attribution would show
        if deltas is not None:
            np.testing.assert_allclose(exp.diagnostics["convergence_delta"], deltas[row].numpy(), atol=ATOL, rtol=RTOL)
    return explanations


def column_of(case, tokenizer, name) -> int:
    if isinstance(name, int):
        return name
    if case.kind == "sequence_classification":
        return {v: k for k, v in tiny.ID2LABEL.items()}[name]
    return tokenizer.convert_tokens_to_ids(name)


def target_specs(case, index: int):
    """Per method: (target, foil, options); options rotate over aggregations, IG rules and baselines."""
    rule = RULES[index % len(RULES)]
    ig = dict(n_steps=6, internal_batch_size=7, rule=rule, baselines="pad" if index % 2 else "zero")
    if case.kind == "sequence_classification":
        several, contrastive = "all", (["positive", "negative"], "neutral")
    else:
        several, contrastive = [17, 42], ([42], 5)
    return {
        "gradient_norm": (several, None, dict(aggregation=("l2", "l1")[index % 2])),  # "sum": see below
        "gradient_x_input": (contrastive[0], contrastive[1], dict(aggregation=("sum", "l1", "l2")[index % 3])),
        "integrated_gradients": (None, None, ig),
    }


# ---- a. the forward function: position / type embeddings applied once -------------------------------------------

def our_forward(model, tokenizer, case, enc, columns) -> HeadForward:
    base = base_of(model)
    return HeadForward(base, get_adapter(model), enc, pooled_positions(case, model, tokenizer, enc), columns)


@pytest.mark.parametrize("case", CASES, ids=ids(CASES))
def test_forward_from_word_embeddings_is_the_models_logits(case):
    model, tokenizer = build(case.id)
    texts = texts_for(case, tokenizer)
    for side in (["right", "left"] if case.decoder else ["right"]):
        for pairs in ([None, PAIRS] if case.kind == "sequence_classification" else [None]):
            enc = batch(case, tokenizer, texts, pairs, side)
            logits = model_logits(model, case, tokenizer, enc)
            columns = torch.arange(logits.shape[1]).expand(len(texts), -1)
            forward = our_forward(model, tokenizer, case, enc, columns)
            with torch.no_grad():
                got = forward(forward.embed())
            torch.testing.assert_close(got, logits, atol=1e-5, rtol=0)


def test_embedding_layer_output_fed_back_is_wrong():
    """The authors' notebook feeds the embedding layer's output back as inputs_embeds: position and type
    embeddings (and the LayerNorm) are then applied twice, and the logits are not the model's."""
    case = tiny.CASE_BY_ID["BertForSequenceClassification"]
    model, tokenizer = build(case.id)
    enc = batch(case, tokenizer, TEXTS, PAIRS)
    assert enc["token_type_ids"].any()
    logits = model_logits(model, case, tokenizer, enc)
    forward = our_forward(model, tokenizer, case, enc, torch.arange(3).expand(3, -1))
    with torch.no_grad():
        torch.testing.assert_close(forward(forward.embed()), logits, atol=1e-5, rtol=0)
        twice = forward(model.bert.embeddings(input_ids=enc["input_ids"], token_type_ids=enc["token_type_ids"]))
        assert (twice - logits).abs().max() > 1e-2
        without_types = {k: v for k, v in enc.items() if k != "token_type_ids"}
        typeless = our_forward(model, tokenizer, case, without_types, torch.arange(3).expand(3, -1))
        assert (typeless(typeless.embed()) - logits).abs().max() > 1e-2  # the type ids matter, and are passed


# ---- b. parity with Captum -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("case", CASES, ids=ids(CASES))
def test_captum_parity(case):
    model, tokenizer = build(case.id)
    texts = texts_for(case, tokenizer)
    for method, (target, foil, options) in target_specs(case, CASES.index(case)).items():
        check_captum(model, tokenizer, case, texts, method, target, foil, **options)


@pytest.mark.parametrize("how", ["l1", "l2", "sum"])
@pytest.mark.parametrize("method", GRADIENT_METHODS)
def test_captum_parity_every_aggregation(method, how):
    case = tiny.CASE_BY_ID["RobertaForSequenceClassification"]
    model, tokenizer = build(case.id)
    extra = dict(n_steps=5) if method == "integrated_gradients" else {}
    exps = check_captum(model, tokenizer, case, TEXTS, method, target=[2, 1], aggregation=how, **extra)
    assert exps[0].settings["aggregation"] == how
    if how != "sum":
        assert (exps[0].scores >= 0).all()


def test_gradient_sum_vanishes_behind_an_embedding_layernorm():
    """A LayerNorm right after the word embeddings ignores shifts along (1, ..., 1), so the gradient sums to 0
    over the embedding dimension: Gradient Norm with aggregation='sum' is ~0 for BERT-style encoders (and GPT-2,
    where only LayerNorms read the residual stream), not for Llama-style decoders (RMSNorm keeps the mean)."""
    for case_id, vanishes in (("BertForSequenceClassification", True), ("LlamaForSequenceClassification", False)):
        model, tokenizer = build(case_id)
        exp = normx.explain(model, tokenizer, TEXTS[1], method="gradient_norm", aggregation="sum")
        l1 = normx.explain(model, tokenizer, TEXTS[1], method="gradient_norm", aggregation="l1")
        assert bool(np.abs(exp.scores).max() < 1e-5 * np.abs(l1.scores).max()) is vanishes


@pytest.mark.parametrize("case", CLASSIFIERS, ids=ids(CLASSIFIERS))
def test_captum_parity_text_pairs(case):
    model, tokenizer = build(case.id)
    check_captum(model, tokenizer, case, TEXTS, "gradient_x_input", target="all", pairs=PAIRS)
    check_captum(model, tokenizer, case, TEXTS, "integrated_gradients", pairs=PAIRS, n_steps=4)


@pytest.mark.parametrize("case_id", tiny.REGRESSION)
def test_captum_parity_regression(case_id, monkeypatch):
    case = tiny.CASE_BY_ID[case_id]
    model, tokenizer = build(case_id, num_labels=1)
    if case.decoder:
        monkeypatch.setattr(tokenizer, "padding_side", "left")
    for method in GRADIENT_METHODS:
        options = dict(n_steps=4) if method == "integrated_gradients" else {}
        exps = check_captum(model, tokenizer, case, TEXTS, method, regression=True, aggregation="l2", **options)
        assert exps[0].labels == ["score"]


@pytest.mark.filterwarnings("ignore:.*is_gradient_checkpointing.*:FutureWarning")
@pytest.mark.filterwarnings("ignore:Model has `tie_word_embeddings=True`:UserWarning")
@pytest.mark.parametrize("name", list(PEFT_CASES))
def test_captum_parity_peft(name):
    model, tokenizer, case, _ = peft_model(name)
    texts = texts_for(case, tokenizer)
    for method, (target, foil, options) in target_specs(case, len(name)).items():
        check_captum(model, tokenizer, case, texts, method, target, foil, **options)
    exp = normx.explain(model, tokenizer, texts[0], method="gradient_norm")
    assert exp.settings["peft"] is True
    assert not model.training


# ---- c. Integrated Gradients: closed forms and completeness -------------------------------------------------------

class Polynomial:
    """f_k(e) = sum(w_k * e) + sum(c_k * e^2): linear and quadratic parts with known IG."""

    def __init__(self, shape, seed=0):
        generator = torch.Generator().manual_seed(seed)
        self.w = torch.randn((2, *shape), generator=generator)
        self.c = torch.randn((2, *shape), generator=generator)
        self.batch = shape[0]

    def __call__(self, e, quadratic=True):
        w, c = self.w.repeat(1, e.shape[0] // self.batch, 1, 1), self.c.repeat(1, e.shape[0] // self.batch, 1, 1)
        out = (w * e).sum((2, 3)) + (c * e * e).sum((2, 3)) * quadratic
        return out.T  # [N, 2]


@pytest.mark.parametrize("rule", RULES)
def test_ig_closed_form(rule):
    f = Polynomial((3, 5, 4))
    x = torch.randn(3, 5, 4, generator=torch.Generator().manual_seed(1))
    zero = torch.zeros_like(x)
    total = sum(rule_parameters(rule, 8)[0])  # Captum's trapezoid weights sum to 1 - 1/n
    # f linear in the embeddings: IG from zero == (sum of step sizes) x gradient x input, for every rule
    attributions, delta, change = integrated_gradients(lambda e: f(e, quadratic=False), x, zero, 8, rule, 4)
    torch.testing.assert_close(attributions, total * f.w * x, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(change, f(x, quadratic=False) - f(zero, quadratic=False))
    torch.testing.assert_close(delta, (total - 1) * change, atol=1e-4, rtol=1e-4)
    # quadratic: the integrand is linear in alpha, which Gauss-Legendre and the midpoint rule integrate exactly
    attributions, delta, _ = integrated_gradients(f, x, zero, 8, rule, None)
    if rule in ("gausslegendre", "riemann_middle"):
        torch.testing.assert_close(attributions, f.w * x + f.c * x * x, atol=1e-5, rtol=1e-5)
        assert delta.abs().max() < 1e-4
    else:
        assert delta.abs().max() > 1e-3  # the other rules are not exact here: the closed form can fail


def test_ig_pad_baseline_and_internal_batching():
    case = tiny.CASE_BY_ID["BertForSequenceClassification"]
    model, tokenizer = build(case.id)
    kwargs = dict(method="integrated_gradients", n_steps=7, baselines="pad", target="all")
    whole = normx.explain(model, tokenizer, TEXTS, **kwargs)
    for internal in (1, 3, 8, 100):  # 1 and 3 < the batch: one step per pass
        chunked = normx.explain(model, tokenizer, TEXTS, internal_batch_size=internal, **kwargs)
        for a, b in zip(whole, chunked):
            np.testing.assert_allclose(a.scores, b.scores, atol=INVARIANCE_ATOL, rtol=1e-5)
            assert b.settings["internal_batch_size"] == internal
    zero = normx.explain(model, tokenizer, TEXTS[0], **dict(kwargs, baselines="zero"))
    assert not np.allclose(zero.scores, whole[0].scores, atol=1e-2)
    assert whole[0].settings["baselines"] == "pad"


def test_ig_completeness_on_minilm():
    """sum of IG attributions == f(x) - f(zero embeddings) within 1% at 300 steps, on the real MiniLM."""
    model, tokenizer = minilm.fresh_classifier()
    with torch.no_grad():  # a seeded head with unit-scale weights: logit changes of order 1, not 0.01
        model.classifier.weight.copy_(torch.randn(model.classifier.weight.shape,
                                                  generator=torch.Generator().manual_seed(0)))
    texts = ["a gripping film", "thin and flat"]
    explanations = normx.explain(model, tokenizer, texts, method="integrated_gradients", target="positive",
                                 n_steps=300, internal_batch_size=256, aggregation="sum")
    enc = tokenizer(texts, padding=True, return_tensors="pt")
    with torch.no_grad():
        at_x = model(**enc).logits[:, 1]
        zeros = torch.zeros(*enc["input_ids"].shape, model.config.hidden_size)
        at_baseline = model(inputs_embeds=zeros, attention_mask=enc["attention_mask"],
                            token_type_ids=enc["token_type_ids"]).logits[:, 1]
    for i, exp in enumerate(explanations):
        change = float(at_x[i] - at_baseline[i])
        assert abs(change) > 0.1
        total = float(exp.scores.sum())
        assert total == pytest.approx(change, rel=0.01)
        assert exp.diagnostics["output_difference"][0] == pytest.approx(change, abs=1e-4)
        assert exp.diagnostics["convergence_delta"][0] == pytest.approx(total - change, abs=1e-4)
        assert abs(exp.diagnostics["convergence_delta"][0]) < 0.01 * abs(change)
        assert exp.settings["n_steps"] == 300 and exp.settings["rule"] == "gausslegendre"
        assert json.loads(json.dumps(exp.to_dict()))["diagnostics"]["convergence_delta"] == \
            exp.diagnostics["convergence_delta"]


# ---- d. batching and padding invariance -------------------------------------------------------------------------

SIDED = [(c, side) for c in CASES for side in (["right", "left"] if c.decoder else ["right"])]


@pytest.mark.parametrize(("case", "side"), SIDED, ids=[f"{c.id}-{s}" for c, s in SIDED])
def test_batch_and_padding_invariance(case, side, monkeypatch):
    model, tokenizer = build(case.id)
    monkeypatch.setattr(tokenizer, "padding_side", side)
    texts = texts_for(case, tokenizer)
    target = "all" if case.kind == "sequence_classification" else None
    assert len({len(tokenizer(t)["input_ids"]) for t in texts}) == len(texts)  # padding really happens
    for method, options in (("gradient_x_input", {}), ("integrated_gradients", dict(n_steps=4)),
                            ("random", {})):
        kwargs = dict(method=method, target=target, **options)
        singles = [normx.explain(model, tokenizer, text, **kwargs) for text in texts]
        batched = normx.explain(model, tokenizer, texts, batch_size=3, **kwargs)
        reordered = normx.explain(model, tokenizer, texts[::-1], batch_size=2, **kwargs)[::-1]
        for single, *others in zip(singles, batched, reordered):
            for other in others:
                assert other.tokens == single.tokens and other.labels == single.labels
                np.testing.assert_allclose(other.scores, single.scores, atol=INVARIANCE_ATOL, rtol=1e-5)
                for name, values in single.diagnostics.items():
                    np.testing.assert_allclose(other.diagnostics[name], values, atol=INVARIANCE_ATOL, rtol=1e-5)


# ---- e. random -------------------------------------------------------------------------------------------------------

def test_random_is_seeded_and_reproducible():
    model, tokenizer = build("BertForSequenceClassification")
    first = normx.explain(model, tokenizer, TEXTS, method="random")
    again = normx.explain(model, tokenizer, TEXTS[::-1] + TEXTS[:1], method="random", batch_size=2, target="all")
    for a, b in zip(first, again[::-1][1:]):
        np.testing.assert_array_equal(a.scores[0], b.scores[0])
        np.testing.assert_array_equal(b.scores[0], b.scores[2])  # label-independent
    np.testing.assert_array_equal(again[-1].scores[0], first[0].scores[0])
    assert first[0].settings["seed"] == 0 and first[0].settings["label_dependent"] is False
    for exp in first:
        assert exp.layers == [0] and ((exp.scores >= 0) & (exp.scores < 1)).all()
        assert len(set(exp.scores.ravel().tolist())) == len(exp.tokens)
    other = normx.explain(model, tokenizer, TEXTS[0], method="random", seed=7)
    assert other.settings["seed"] == 7
    assert not np.allclose(other.scores, first[0].scores)
    assert not np.allclose(first[1].scores[0, 0, :5], first[0].scores[0, 0, :5])  # texts differ


# ---- f. options, validation, side effects ---------------------------------------------------------------------------

def test_option_validation():
    model, tokenizer = build("BertForSequenceClassification")
    text = TEXTS[0]
    with pytest.raises(InvalidInputError, match=r"does not take the option\(s\) n_steps; it takes: aggregation='l1'"):
        normx.explain(model, tokenizer, text, method="gradient_norm", n_steps=5)
    with pytest.raises(InvalidInputError, match=r"'normxlogit' does not take .* seed; it takes: no options"):
        normx.explain(model, tokenizer, text, seed=1)
    with pytest.raises(InvalidInputError, match="n_steps=50, baselines='zero', rule='gausslegendre'"):
        normx.explain(model, tokenizer, text, method="integrated_gradients", steps=5)
    bad = [
        ("gradient_x_input", dict(aggregation="max"), "aggregation='max' is not allowed"),
        ("integrated_gradients", dict(n_steps=0), "n_steps must be an integer >= 1"),
        ("integrated_gradients", dict(n_steps=1, rule="riemann_left"), "n_steps must be an integer >= 2"),
        ("integrated_gradients", dict(n_steps=True), "n_steps must be"),
        ("integrated_gradients", dict(n_steps=2.5), "n_steps must be"),
        ("integrated_gradients", dict(internal_batch_size=0), "internal_batch_size must be a positive integer"),
        ("integrated_gradients", dict(baselines="mean"), "baselines='mean' is not allowed"),
        ("integrated_gradients", dict(rule="simpson"), "rule='simpson' is not allowed; use one of .*gausslegendre"),
        ("random", dict(seed="x"), "seed must be an integer"),
    ]
    for method, options, message in bad:
        with pytest.raises(InvalidInputError, match=message):
            normx.explain(model, tokenizer, text, method=method, **options)
    for method in (*GRADIENT_METHODS, "random"):
        with pytest.raises(InvalidInputError, match="no per-layer scores; leave layer unset"):
            normx.explain(model, tokenizer, text, method=method, layer=0)
    exp = normx.explain(model, tokenizer, text, method="integrated_gradients", n_steps=3)
    assert {k: exp.settings[k] for k in ("n_steps", "baselines", "rule", "internal_batch_size", "aggregation")} == \
        dict(n_steps=3, baselines="zero", rule="gausslegendre", internal_batch_size=None, aggregation="l1")
    assert normx.explain(model, tokenizer, text, method="gradient_norm").settings["aggregation"] == "l1"
    assert "aggregation" not in normx.explain(model, tokenizer, text).settings
    words = exp.words()
    assert words.diagnostics == exp.diagnostics and "convergence_delta" in words.to_dict()["diagnostics"]


def test_registration_rejects_options_named_like_explain_arguments():
    from normx.methods import Method, Option, register_method

    with pytest.raises(ValueError, match="named like explain's own arguments"):
        register_method(Method("bad", lambda ctx: None, "", options=[Option("target", 1, "clashes")]))
    assert "bad" not in normx.list_methods()
    assert set(GRADIENT_METHODS) | {"random"} <= set(normx.list_methods())


def test_no_gradients_left_on_the_model(unchanged):
    model, tokenizer = build("LlamaForCausalLM", fresh=True)
    unchanged(model)  # no .grad, requires_grad, hooks or flags changed
    for method in GRADIENT_METHODS:
        options = dict(n_steps=3) if method == "integrated_gradients" else {}
        normx.explain(model, tokenizer, TEXTS, method=method, target=[5, 9], foil=3, **options)
    assert torch.is_grad_enabled()


def test_half_precision_follows_the_model():
    model32, tokenizer = minilm.classifier()
    model, _ = minilm.fresh_classifier()
    model.to(torch.bfloat16)
    texts = ["a gripping, beautifully acted film", "the plot is thin and the jokes fall flat"]
    for method in ("gradient_x_input", "integrated_gradients"):
        options = dict(n_steps=4) if method == "integrated_gradients" else {}
        full = normx.explain(model32, tokenizer, texts, method=method, target="positive", **options)
        half = normx.explain(model, tokenizer, texts, method=method, target="positive", **options)
        for f, h in zip(full, half):
            assert h.settings["dtype"] == "bfloat16" and h.scores.dtype == np.float32
            assert np.corrcoef(f.scores.ravel(), h.scores.ravel())[0, 1] > 0.95


def test_cli_options(tmp_path, capsys):
    model, tokenizer = build("BertForSequenceClassification")
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    args = ["explain", "--model", str(tmp_path), "--json", "--method", "integrated_gradients", "--n-steps", "4",
            "--internal-batch-size", "2", "--rule", "riemann_middle", "--baselines", "pad", "--aggregation", "sum",
            TEXTS[0]]
    assert main(args) == 0
    item = json.loads(capsys.readouterr().out)["results"][0]
    options = dict(n_steps=4, internal_batch_size=2, rule="riemann_middle", baselines="pad", aggregation="sum")
    assert {k: item["settings"][k] for k in options} == options
    expected = normx.explain(model, tokenizer, TEXTS[0], method="integrated_gradients", **options)
    assert item["scores"] == pytest.approx(expected.score.tolist(), abs=1e-5)
    assert item["diagnostics"]["convergence_delta"] == pytest.approx(expected.diagnostics["convergence_delta"],
                                                                     abs=1e-6)
    assert main(["explain", "--model", str(tmp_path), "--json", "--method", "random", "--seed", "3", "x"]) == 0
    assert json.loads(capsys.readouterr().out)["results"][0]["settings"]["seed"] == 3
    assert main(["explain", "--model", str(tmp_path), "--n-steps", "4", "x"]) == 2
    assert "does not take the option(s) n_steps" in capsys.readouterr().err


def test_integrated_gradients_with_a_known_output_checks_completeness_the_same():
    """``output=f(x)`` (what explain passes from its prediction pass) only spares the forward pass on x: the same
    attributions, delta and output difference as computing f(x) inside."""
    model, tokenizer = build("BertForSequenceClassification")
    enc = tokenizer(TEXTS[:2], padding=True, return_tensors="pt")
    pooled = torch.zeros(2, dtype=torch.long)
    forward = HeadForward(model, get_adapter(model), dict(enc), pooled, torch.tensor([[0], [1]]))
    embeds = forward.embed()
    baseline = torch.zeros_like(embeds)
    with torch.no_grad():
        output = forward(embeds)
        logits = model(**enc).logits
    # what explain passes: the prediction pass's logits read at the targets
    torch.testing.assert_close(select(logits, torch.tensor([[0], [1]])), output, atol=1e-6, rtol=0)
    inside = integrated_gradients(forward, embeds, baseline, 8, "gausslegendre", None)
    given = integrated_gradients(forward, embeds, baseline, 8, "gausslegendre", None, output=output)
    for a, b in zip(inside, given):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=0)


@pytest.mark.parametrize("case", CASES, ids=ids(CASES))
def test_gradient_methods_predict_what_the_capture_pass_predicts(case):
    """Gradient Norm and Gradient×Input make the prediction from their own forward pass (from the word embeddings,
    with gradients): the same prediction, probabilities and targets as the capture pass of the other methods."""
    model, tokenizer = build(case.id)
    texts = texts_for(case, tokenizer)[:3]  # different lengths: padding included
    reference = normx.explain(model, tokenizer, texts, method="normxlogit", batch_size=3)
    for method in ("gradient_norm", "gradient_x_input"):
        for got, want in zip(normx.explain(model, tokenizer, texts, method=method, batch_size=3), reference):
            assert got.prediction == want.prediction and got.labels == want.labels
            assert got.probabilities.keys() == want.probabilities.keys()
            for name, p in want.probabilities.items():
                assert got.probabilities[name] == pytest.approx(p, abs=1e-5)
