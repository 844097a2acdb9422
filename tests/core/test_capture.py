"""Forward hooks never leak: not after success, not after an error in the body, a bad target or a failing module."""

from __future__ import annotations

import pytest
import tiny
import torch
import transformers
from leaks import assert_no_hooks

import normx
import normx.models
from normx.core.concurrency import attention_weights, model_lock, using
from normx.core.hooks import capture, record_calls, replace_outputs
from normx.errors import HookNotFiredError, UnknownTargetError
from normx.models import Adapter

# fresh models: the transformers `output_hidden_states` machinery installs its own (permanent) hooks on models that
# used it, so these tests never share models with the reference tests
CAPTURE_CASES = ["BertForSequenceClassification", "DebertaV2ForSequenceClassification", "ElectraForMaskedLM",
                 "LlamaForCausalLM", "GPT2ForSequenceClassification"]


def fresh(case_id: str = "BertForSequenceClassification"):
    model, tokenizer = tiny.build(case_id, fresh=True)
    assert_no_hooks(model)
    return model, tokenizer



def inputs(tokenizer, case_id: str = "BertForSequenceClassification"):
    case = tiny.CASE_BY_ID[case_id]
    return tokenizer(tiny.texts_for(case, tokenizer)[:2], padding=True, return_tensors="pt")


def text(case_id: str, tokenizer) -> str:
    return tiny.texts_for(tiny.CASE_BY_ID[case_id], tokenizer)[0]


# ---- record_calls(), replace_outputs(), attention_weights() ---------------------------------------------------

def test_record_calls_and_replace_outputs_remove_their_hooks():
    model, tokenizer = fresh()
    enc = inputs(tokenizer)
    layer = model.bert.encoder.layer[1]
    with torch.no_grad(), record_calls({"l1": layer, "v": layer.attention.self.value}) as calls:
        out = model.bert(**enc).last_hidden_state
    assert_no_hooks(model)
    torch.testing.assert_close(calls["l1"].output[0] if isinstance(calls["l1"].output, tuple) else calls["l1"].output,
                               out)
    value = calls["v"].output
    assert value.shape[:2] == enc["input_ids"].shape
    with torch.no_grad(), replace_outputs(layer.attention.self.value, torch.zeros_like):
        zeroed = model.bert(**enc).last_hidden_state
    assert_no_hooks(model)
    assert not torch.allclose(zeroed, out)
    with torch.no_grad():
        torch.testing.assert_close(model.bert(**enc).last_hidden_state, out)  # nothing left replacing outputs
    with pytest.raises(RuntimeError, match="boom"), replace_outputs(layer, torch.zeros_like):
        raise RuntimeError("boom")
    assert_no_hooks(model)
    value = layer.attention.self.value
    with pytest.raises(HookNotFiredError, match="Linear"), replace_outputs(value, torch.zeros_like):
        pass


def test_attention_weights_is_restored_after_errors():
    model, _ = fresh()
    model.train()
    before = model.config._attn_implementation
    with pytest.raises(RuntimeError, match="boom"), attention_weights(model):
        assert model.config._attn_implementation == "eager"
        assert not any(module.training for module in model.modules())
        assert model_lock(model).held_by_this_thread == "exclusive"
        raise RuntimeError("boom")
    assert model.config._attn_implementation == before
    assert all(module.training for module in model.modules())
    assert model_lock(model).held_by_this_thread is None


def test_using_restores_training_flags_after_errors():
    model, _ = fresh()
    model.train()
    model.classifier.eval()  # a mixed state must come back exactly
    before = {name: module.training for name, module in model.named_modules()}
    with pytest.raises(RuntimeError, match="boom"), using(model):
        assert not any(module.training for module in model.modules())
        assert model_lock(model).held_by_this_thread == "exclusive"  # nobody else sees it switched
        raise RuntimeError("boom")
    assert {name: module.training for name, module in model.named_modules()} == before
    model.eval()
    with using(model):  # an eval-mode model is only held shared
        assert model_lock(model).held_by_this_thread == "shared"
    assert model_lock(model).held_by_this_thread is None


def test_gradient_methods_leave_requires_grad_as_it_was(monkeypatch):
    model, tokenizer = fresh()
    model.bert.embeddings.word_embeddings.weight.requires_grad_(False)
    before = {name: p.requires_grad for name, p in model.named_parameters()}
    sentence = text("BertForSequenceClassification", tokenizer)
    normx.explain(model, tokenizer, sentence, method="integrated_gradients", n_steps=3)
    assert {name: p.requires_grad for name, p in model.named_parameters()} == before
    assert all(p.grad is None for p in model.parameters())  # nothing accumulated into the weights

    forward = model.classifier.forward

    def boom(*args, **kwargs):  # the forward pass with gradients fails
        if torch.is_grad_enabled():
            # not even inside the pass: another thread using the model would see it
            assert {name: p.requires_grad for name, p in model.named_parameters()} == before
            raise RuntimeError("boom")
        return forward(*args, **kwargs)

    monkeypatch.setattr(model.classifier, "forward", boom)
    with pytest.raises(RuntimeError, match="boom"):
        normx.explain(model, tokenizer, sentence, method="gradient_x_input")
    assert {name: p.requires_grad for name, p in model.named_parameters()} == before


# ---- capture() -----------------------------------------------------------------------------------------------------

def test_capture_records_outputs_and_removes_hooks():
    model, tokenizer = fresh()
    enc = inputs(tokenizer)
    layers = model.bert.encoder.layer
    modules = {"emb": model.bert.embeddings, "l0": layers[0], "l1": layers[1]}
    with torch.no_grad(), capture(modules, {"emb": lambda t: t.norm(dim=-1)}) as store:
        assert all(len(m._forward_hooks) == 1 for m in modules.values())
        out = model.bert(**enc)
    assert_no_hooks(model)
    assert set(store) == {"emb", "l0", "l1"}
    torch.testing.assert_close(store["l1"], out.last_hidden_state)
    assert store["emb"].shape == enc["input_ids"].shape  # the transform ran inside the hook
    with torch.no_grad():
        embedded = model.bert.embeddings(input_ids=enc["input_ids"], token_type_ids=enc["token_type_ids"])
    torch.testing.assert_close(store["emb"], embedded.norm(dim=-1))
    assert not torch.allclose(store["l0"], store["l1"])


def test_capture_removes_hooks_when_the_body_raises():
    model, tokenizer = fresh()
    enc = inputs(tokenizer)
    modules = {"l0": model.bert.encoder.layer[0], "never": model.classifier}
    with pytest.raises(RuntimeError, match="boom"):  # the body's error, not HookNotFiredError
        with torch.no_grad(), capture(modules):
            model.bert(**enc)
            raise RuntimeError("boom")
    assert_no_hooks(model)


def test_capture_removes_hooks_when_the_body_raises_before_any_forward():
    model, _ = fresh()
    with pytest.raises(KeyError):
        with capture({"l0": model.bert.encoder.layer[0]}):
            raise KeyError("early")
    assert_no_hooks(model)


def test_capture_removes_hooks_when_a_hooked_module_raises(monkeypatch):
    model, tokenizer = fresh()
    enc = inputs(tokenizer)
    block = model.bert.encoder.layer[1]

    def broken(*args, **kwargs):
        raise RuntimeError("block failed")

    monkeypatch.setattr(block, "forward", broken)
    with pytest.raises(RuntimeError, match="block failed"):
        with torch.no_grad(), capture({"l0": model.bert.encoder.layer[0], "l1": block}):
            model.bert(**enc)
    assert_no_hooks(model)


def test_capture_removes_hooks_when_registration_fails():
    model, _ = fresh()
    with pytest.raises(AttributeError):
        with capture({"l0": model.bert.encoder.layer[0], "bad": object()}):
            pass
    assert_no_hooks(model)


def test_hook_that_never_fires_raises_and_names_the_module():
    model, tokenizer = fresh()
    enc = inputs(tokenizer)
    modules = {"l1": model.bert.encoder.layer[1], "head": model.classifier, "pre": model.bert.pooler.activation}
    with pytest.raises(HookNotFiredError) as info:
        with torch.no_grad(), capture(modules):
            model.bert.embeddings(input_ids=enc["input_ids"])
    message = str(info.value)
    assert "l1 (BertLayer)" in message and "head (Linear)" in message and "pre (Tanh)" in message
    assert_no_hooks(model)
    # a module that does run is not reported
    with pytest.raises(HookNotFiredError) as info:
        with torch.no_grad(), capture(modules):
            model.bert(**enc)
    assert "head (Linear)" in str(info.value)
    assert "l1" not in str(info.value) and "pre" not in str(info.value)
    assert_no_hooks(model)


# ---- explain() ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("case_id", CAPTURE_CASES)
def test_explain_leaves_no_hooks(case_id):
    model, tokenizer = fresh(case_id)
    texts = tiny.texts_for(tiny.CASE_BY_ID[case_id], tokenizer)
    for method in ("normxlogit", "l2norm"):
        normx.explain(model, tokenizer, texts, method=method, layer="all", batch_size=2)
        assert_no_hooks(model)
    normx.explain(model, tokenizer, texts[0], embedding="word")
    assert_no_hooks(model)


@pytest.mark.parametrize("case_id", ["BertForSequenceClassification", "LlamaForCausalLM"])
def test_explain_bad_target_leaves_no_hooks(case_id):
    model, tokenizer = fresh(case_id)
    with pytest.raises(UnknownTargetError):
        normx.explain(model, tokenizer, text(case_id, tokenizer), target="no such label or token xyz")
    assert_no_hooks(model)
    with pytest.raises(UnknownTargetError):
        normx.explain(model, tokenizer, text(case_id, tokenizer), foil=10**7)
    assert_no_hooks(model)


def _blocks(model):
    adapter = normx.get_adapter(model)
    return adapter.block_modules(model), adapter.embedding_module(model, "layer")


@pytest.mark.parametrize("where", ["embeddings", "first block", "last block"])
@pytest.mark.parametrize("case_id", ["BertForSequenceClassification", "LlamaForCausalLM",
                                     "DebertaV2ForSequenceClassification"])
def test_explain_leaves_no_hooks_when_a_module_raises(case_id, where, monkeypatch):
    model, tokenizer = fresh(case_id)
    blocks, embeddings = _blocks(model)
    module = {"embeddings": embeddings, "first block": blocks[0], "last block": blocks[-1]}[where]

    def broken(*args, **kwargs):
        raise RuntimeError(f"{where} failed")

    monkeypatch.setattr(module, "forward", broken)
    model.train()  # explain switches to eval mode and must restore the flags even on failure
    with pytest.raises(RuntimeError, match=f"{where} failed"):
        normx.explain(model, tokenizer, tiny.texts_for(tiny.CASE_BY_ID[case_id], tokenizer), layer="all")
    assert_no_hooks(model)
    assert all(m.training for m in model.modules())
    monkeypatch.undo()
    model.eval()
    # and the model still explains normally afterwards
    normx.explain(model, tokenizer, text(case_id, tokenizer), layer="all")
    assert_no_hooks(model)


class MisdescribedBert(transformers.BertForSequenceClassification):
    """A model class whose adapter points at a module its forward never runs."""


def test_explain_with_a_hook_that_never_fires(monkeypatch):
    model, tokenizer = tiny.build("BertForSequenceClassification", fresh=True)
    broken = MisdescribedBert(model.config).eval()
    broken.load_state_dict(model.state_dict())
    adapter = Adapter("bert", "sequence_classification", embeddings="bert.embeddings",
                      blocks=lambda m: [m.bert.encoder.layer[0], m.classifier],  # the classifier is no block
                      head=normx.get_adapter(model).head, pooling="first")
    monkeypatch.setattr(normx.models.registry, "_REGISTRY", dict(normx.models.registry._REGISTRY))
    normx.register_adapter("MisdescribedBert", adapter)
    # verified on first use, the adapter is refused before anything is explained with it
    with pytest.raises(normx.UnsupportedModelError, match=r"does not match at the blocks: .*never ran.*h2 \(Linear\)"):
        normx.explain(broken, tokenizer, "the film was a gripping story")
    assert_no_hooks(broken)
    # the capture itself: a hooked module that never runs is an error, and no hook is left behind
    from normx.core.forward import Pass

    inputs = {k: v for k, v in tokenizer("the film was a gripping story", return_tensors="pt").items()}
    with pytest.raises(HookNotFiredError, match=r"h2 \(Linear\)"):
        Pass(broken, adapter, inputs, [2]).run()
    assert_no_hooks(broken)
    # layer 1 alone is hooked on a module that runs; the last layer (always captured) still is not
    with pytest.raises(HookNotFiredError, match=r"Linear"):
        Pass(broken, adapter, inputs, [1]).run()
    assert_no_hooks(broken)


@pytest.mark.parametrize("name", ["BertForSequenceClassification", "LlamaForSequenceClassification"])
def test_the_head_on_top_methods_run_a_classifier_head_once(name):
    """NormXLogit reads the head at every position; the prediction is read off that run (one head call, not a second
    at the pooled position), and it is still the model's own prediction."""
    model, tokenizer = tiny.build(name)
    text = " ".join(tiny.CORPUS[:2])
    head = model.classifier if hasattr(model, "classifier") else model.score
    normx.explain(model, tokenizer, text)  # (the first call on a model checks its adapter: head calls of its own)
    calls = []
    handle = head.register_forward_hook(lambda *_: calls.append(1))
    try:
        got = normx.explain(model, tokenizer, text, method="normxlogit")
        assert len(calls) == 1
        calls.clear()
        normx.explain(model, tokenizer, text, method="l2norm")
        assert len(calls) == 1  # a method that does not read the head: the prediction's own run
    finally:
        handle.remove()
    with torch.no_grad():
        logits = model(**tokenizer(text, return_tensors="pt")).logits[0]
    want = logits.softmax(-1).tolist()
    assert list(got.probabilities.values()) == pytest.approx(want, abs=1e-5)


def test_first_parameter_and_resolve_read_what_torch_reads():
    """The host-side shortcuts (no module names built, no __getattr__) give what torch's own calls give."""
    from normx.models import first_parameter
    from normx.models.modules import resolve

    for case in ("BertForSequenceClassification", "LlamaForCausalLM", "GPT2ForSequenceClassification"):
        model, _ = tiny.build(case)
        assert first_parameter(model) is next(model.parameters())
    empty = torch.nn.Sequential(torch.nn.ReLU(), torch.nn.Sequential(torch.nn.Identity(), torch.nn.Linear(2, 2)))
    assert first_parameter(empty) is empty[1][1].weight
    assert first_parameter(torch.nn.ReLU()) is None
    model, _ = tiny.build("BertForSequenceClassification")
    assert resolve(model, "bert.encoder.layer") is model.bert.encoder.layer

    class Shadowed(torch.nn.Module):  # a class attribute of a child's name wins, as getattr has it
        def __init__(self):
            super().__init__()
            self._modules["inner"] = torch.nn.Linear(2, 2)  # (add_module refuses the name)

        inner = property(lambda self: "the property")

    assert resolve(Shadowed(), "inner") == "the property"
