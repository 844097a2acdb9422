"""What the CPU stand-in's excess over the model's own forward is made of (issue #55), on the stand-in's own models
(bench/standin.py, as bench/test_host_overhead.py reads them: the tests' tiny BERT on a 40-token text; a tiny
Llama, 2 blocks of width 32, on 2,048 tokens with 32 steps), one torch thread. Each figure is a median over
alternating blocks of the ratio of one call to the call it is read against, run right next to it.

- Batch-1 classification: ``normx.explain(model, tokenizer, text)`` against ``model(**tokenizer(text,
  return_tensors="pt"))``, and beside it the least a NormXLogit call can do, written out here: the Rust tokenizer's
  encoding with offsets, two forward hooks (the embedding output's norms, the last block's output), the backbone,
  the model's own pooler and classifier on every position, the product; its scores are checked to equal normx's.
- Generation, 2,048 tokens: ``normx.explain_generation(..., method="normxlogit", target=continuation)`` against
  ``model(input_ids=ids, logits_to_keep=33)``; the backbone run without its key-value cache (``use_cache=False``,
  as normx runs it: no cache kept over a long prompt) against the backbone as it runs by default; and tokenising
  the prompt alone (a part of every call that the forward on given ids does not have).
- Batch-1 classification split: ``attribute_batch(prepare(model, tokenizer), inputs)`` (the call's arguments resolved,
  then its pass on the encoded text: lock, hooks, backbone, head on every position, scores) against ``model(**inputs)``
  on the same encoded text, so that what the call adds before and after its pass (tokenising, results) is the rest.
- Generation, 2,048 tokens: ``calibrated_attention`` with the families SmolLM2's shipped weights read (``tokens``,
  ``presence``, ``response_norm``; weights made for the tiny model and written to a temporary file: what a call costs
  depends on its families, not their values) against the same forward.
- Batch-1 classification, counted: the Python-level calls (functions and built-ins, ``sys.setprofile``) each of the
  three calls above makes, the same on every machine: on a 40-token text through a 2-block model the forward itself
  is about a thousand of them, so what normx adds is read in calls as well as in time.
- Last: the classifier's own forward in ``torch.inference_mode`` against ``torch.no_grad`` (normx runs a method that
  never differentiates in the former); and whether compiling the reading's own work pays (:func:`compiled_reading`).

    python -m studies.timing.standin_parts [--out FILE]
"""

from __future__ import annotations

import argparse
import statistics
import time

from studies.settings import Printed, add_out_option

PAIRS = 60


def paired(call, against, blocks: int = PAIRS, repeat: int = 1) -> float:
    """The median over ``blocks`` alternating pairs of (``call`` x repeat) / (``against`` x repeat)."""
    for _ in range(3):
        call(), against()
    ratios = []
    for k in range(blocks):
        times = {}
        for which in ((call, against) if k % 2 else (against, call)):
            start = time.perf_counter()
            for _ in range(repeat):
                which()
            times[which] = time.perf_counter() - start
        ratios.append(times[call] / times[against])
    return statistics.median(ratios)


def least_normxlogit(model, tokenizer, text: str):
    """NormXLogit with nothing around it: (scores [T], tokens, offsets, probabilities)."""
    import torch

    encoding = tokenizer.backend_tokenizer.encode_batch([text])[0]
    ids = torch.tensor([encoding.ids])
    kept = {}
    hooks = [model.bert.embeddings.register_forward_hook(
                 lambda _m, _a, out: kept.__setitem__("x0", out.float().norm(dim=-1))),
             model.bert.encoder.layer[-1].register_forward_hook(
                 lambda _m, _a, out: kept.__setitem__("h", out[0] if isinstance(out, tuple) else out))]
    try:
        with torch.no_grad():
            model.bert(input_ids=ids, attention_mask=torch.ones_like(ids),
                       token_type_ids=torch.tensor([encoding.type_ids]))
            every = model.classifier(model.bert.pooler(kept["h"][0][:, None]))  # each token as the pooled one
    finally:
        for hook in hooks:
            hook.remove()
    label = int(every[0].argmax())
    return ((kept["x0"][0] * every[:, label]).numpy(), encoding.tokens, encoding.offsets,
            torch.softmax(every[0], -1).tolist())


def python_calls(call) -> int:
    """The Python-level calls (function calls and built-in calls) ``call()`` makes, after one call to warm it."""
    import sys

    call()
    count = [0]

    def counted(_frame, event, _arg):
        if event in ("call", "c_call"):
            count[0] += 1

    sys.setprofile(counted)
    try:
        call()
    finally:
        sys.setprofile(None)
    return count[0]


def calibrated(model, tokenizer, prompt: str, continuation: list[int]):
    """A call of ``calibrated_attention`` on the prompt and continuation with the shipped preset's families, its
    weights (all ones) made for ``model`` and written to a temporary file."""
    import tempfile
    from pathlib import Path

    import numpy as np

    import normx
    from normx.methods.calibrated import weights as stored
    from normx.methods.calibrated.readings import shape
    from normx.models import get_adapter
    from normx.models.identity import model_identity

    families = ("tokens", "presence", "response_norm")
    record = stored.make_record("calibrated_attention", model_identity(model), families,
                                {family: np.ones((1, 1)) for family in families}, shape(model, get_adapter(model)),
                                0.1, "logprob", 0.5, {"contexts": 0, "what": "timing only"})
    path = stored.write(record, Path(tempfile.mkdtemp()) / "weights.json")
    return lambda: normx.explain_generation(model, tokenizer, prompt, method="calibrated_attention",
                                            target=continuation, weights=str(path))


def compiled_reading(model, inputs, given, paired) -> str:
    """The row of the reading's own work beside the forward (the model's pooler and classifier on every position, the
    predicted label, the product with the input norms) compiled by ``torch.compile(dynamic=True)`` against the same in
    eager mode, each right after the model's forward on the encoded text; the compiled reading is checked to equal
    the eager one, and its first call (the compilation) is timed."""
    import torch

    with torch.no_grad():
        out = model(**inputs, output_hidden_states=True)
    hidden, norms = out.hidden_states[-1][0], out.hidden_states[0][0].norm(dim=-1)

    def reading(h, x0):
        every = model.classifier(model.bert.pooler(h[:, None, :]))  # each token as the pooled one
        return x0 * every[:, every[0].argmax()]

    compiled = torch.compile(reading, dynamic=True)
    with torch.inference_mode():
        started = time.perf_counter()
        got = compiled(hidden, norms)
        took = time.perf_counter() - started
        torch.testing.assert_close(got, reading(hidden, norms), rtol=1e-5, atol=1e-6)

    def after_forward(fn):
        def run():
            given()
            with torch.inference_mode():
                fn(hidden, norms)
        return run

    ratio = paired(after_forward(compiled), after_forward(reading), repeat=10)
    return (f"| classification, 40 tokens | the forward, then the reading's own work (the head on every position, the "
            f"label, the product) under `torch.compile(dynamic=True)` (first call {took:.0f} s) | the forward, then "
            f"the same reading in eager mode | {ratio:.3f}× |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m studies.timing.standin_parts",
                                     description=__doc__.split("\n\n")[0])
    add_out_option(parser)
    args = parser.parse_args(argv)

    import numpy as np
    import torch

    import normx
    from bench import standin

    torch.set_num_threads(1)
    show = Printed(args.out)
    show("| case | call | against | ratio (median of alternating pairs) |")
    show("|---|---|---|---|")

    model, tokenizer, text = standin.classifier()

    def forward():
        with torch.no_grad():
            model(**tokenizer(text, return_tensors="pt"))

    np.testing.assert_allclose(least_normxlogit(model, tokenizer, text)[0], normx.explain(model, tokenizer, text).score,
                               rtol=1e-5, atol=1e-6)
    against = "`model(**tokenizer(text, return_tensors=\"pt\"))`"
    show(f"| classification, 40 tokens | `normx.explain` | {against} | "
         f"{paired(lambda: normx.explain(model, tokenizer, text), forward, repeat=10):.3f}× |")
    show(f"| classification, 40 tokens | the least NormXLogit call (above) | {against} | "
         f"{paired(lambda: least_normxlogit(model, tokenizer, text), forward, repeat=10):.3f}× |")
    calls = {name: python_calls(fn) for name, fn in (("forward", forward), ("explain", lambda: normx.explain(
        model, tokenizer, text)), ("least", lambda: least_normxlogit(model, tokenizer, text)))}
    show(f"| classification, 40 tokens | Python-level calls: `normx.explain` {calls['explain']:,}, the least "
         f"NormXLogit call {calls['least']:,} | {against}: {calls['forward']:,} | "
         f"{calls['explain'] / calls['forward']:.3f}× |")
    inputs = tokenizer(text, return_tensors="pt")
    from normx.explanations.explain import attribute_batch, prepare

    def given():
        with torch.no_grad():
            model(**inputs)

    def pass_only():  # the arguments resolved (kept) and the batch's NormXLogit pass, on the encoded text
        attribute_batch(prepare(model, tokenizer), inputs)

    show(f"| classification, 40 tokens | `attribute_batch(prepare(model, tokenizer), inputs)`: the resolved call's "
         f"pass on the encoded text, without tokenising or result objects | `model(**inputs)` on the same encoded "
         f"text | {paired(pass_only, given, repeat=10):.3f}× |")

    def under(mode):
        def run():
            with mode():
                model(**inputs)
        return run

    modes = paired(under(torch.inference_mode), under(torch.no_grad), repeat=10)
    inference_row = (f"| classification, 40 tokens | `model(**inputs)` in `torch.inference_mode()` | the same under "
                     f"`torch.no_grad()` | {modes:.3f}× |")
    compile_row = compiled_reading(model, inputs, given, paired)

    length, steps = 2048, standin.STEPS
    tokenizer = standin.byte_tokenizer(length)
    model = standin.llama(tokenizer, length)
    prompt, prompt_ids, continuation = standin.sequence(tokenizer, length, steps)
    ids = torch.tensor([prompt_ids + continuation])
    mask = torch.ones_like(ids)

    def own():
        with torch.no_grad():
            model(input_ids=ids, logits_to_keep=steps + 1)

    def backbone(**kwargs):
        def run():
            with torch.no_grad():
                model.model(input_ids=ids, attention_mask=mask, **kwargs)
        return run

    explain = lambda: normx.explain_generation(model, tokenizer, prompt, method="normxlogit",  # noqa: E731
                                               target=continuation)
    show(f"| generation, {ids.shape[1]:,} tokens, {steps} steps | `normx.explain_generation` (normxlogit) | "
         f"`model(input_ids=ids, logits_to_keep={steps + 1})` | {paired(explain, own, blocks=16):.3f}× |")
    show(f"| generation, {ids.shape[1]:,} tokens | the backbone, `use_cache=False` | the backbone as it runs by "
         f"default (a cache: its keys and values copied contiguous) | "
         f"{paired(backbone(use_cache=False), backbone(), blocks=24):.3f}× |")
    show(f"| generation, {ids.shape[1]:,} tokens, {steps} steps | `calibrated_attention` (tokens, presence, "
         f"response_norm) | `model(input_ids=ids, logits_to_keep={steps + 1})` | "
         f"{paired(calibrated(model, tokenizer, prompt, continuation), own, blocks=16):.3f}× |")
    tokenize = lambda: tokenizer(prompt)  # noqa: E731
    show(f"| generation, {ids.shape[1]:,} tokens | the forward and tokenising the prompt | "
         f"`model(input_ids=ids, logits_to_keep={steps + 1})` | "
         f"{paired(lambda: (own(), tokenize()), own, blocks=16):.3f}× |")
    show(inference_row)
    show(compile_row)
    show.save()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
