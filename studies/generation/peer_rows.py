"""The peers' rows for the generation peers study (studies/generation/peers.py): for every step of normx's greedy
generations, a score per earlier token from inseq, Captum and LXT's AttnLRP (run in its own virtualenv by
studies/parity/lxt_attnlrp.py), each with its checks; and which of normx's own methods run on the model. The study's
constants live here, the lowest of its three modules (rows, results file, commands)."""

from __future__ import annotations

import contextlib
import functools
import json
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from studies.settings import REPO, lxt_command

NEW_TOKENS = 6
COST_NEW_TOKENS = 32
COST_LENGTHS = ("64", "512")  # total tokens (prompt + 32 generated), at most
COST_ROUNDS, LONG_CALL_S = 3, 20.0  # timed rounds after the first call, unless that call took longer than this
# normx's methods, in table order: studies/generation/faithfulness.py's and the decoder methods being added; those not
# registered, or refused by the model (UnsupportedModelError), are left out of a default run
NORMX_CANDIDATES = ("normxlogit", "gradient_x_input", "integrated_gradients", "attention", "norm_attention",
                    "decompx", "alti_logit", "attnlrp", "recency", "random")
NORMX_OPTIONS = {"integrated_gradients": {"n_steps": 16}}  # as studies/generation/faithfulness.py
PEERS = {
    "inseq_attention": "inseq 0.7.1 attention: mean over heads, then layers (its default aggregation)",
    "inseq_input_x_gradient": "inseq 0.7.1 input_x_gradient: target p(token), L2 over the embedding (its defaults)",
    "captum_gradient_x_activation": "Captum LLMGradientAttribution(LayerGradientXActivation(embeddings)): target "
                                    "log p(token), signed sum over the embedding",
    "lxt_attnlrp": "LXT 2.1 AttnLRP (lxt.efficient.monkey_patch, transformers 4.52): target logit, "
                   "relevance = embedding x modified gradient, summed",
}
BASELINE = "recency"
MODES = ("comprehensiveness", "sufficiency")


def normx_methods(model, tokenizer, wanted: Sequence[str] = NORMX_CANDIDATES) -> tuple[list[str], dict[str, str]]:
    """Those of ``wanted`` that normx has and that explain a generation of this model (tried on a two-token
    generation), and why each other one was left out."""
    import normx
    from normx.errors import UnsupportedModelError

    usable, left_out = [], {}
    registered = normx.list_methods()
    for method in wanted:
        if method not in registered:
            left_out[method] = "not registered in normx"
            continue
        try:
            normx.explain_generation(model, tokenizer, "The film was", method=method, max_new_tokens=2,
                                     **NORMX_OPTIONS.get(method, {}))
        except UnsupportedModelError as error:
            left_out[method] = f"UnsupportedModelError: {error}"[:300]
            continue
        usable.append(method)
    return usable, left_out


@contextlib.contextmanager
def _attention_implementation(model, name: str):
    before = model.config._attn_implementation
    model.set_attn_implementation(name)
    try:
        yield
    finally:
        model.set_attn_implementation(before)


def inseq_model(model, tokenizer, method: str):
    """inseq's model for ``method``, as :func:`inseq_attribute` uses it: an instance of :func:`_holding_ids`'s
    subclass of inseq's own class (same behaviour unless given ids to hold)."""
    import inseq

    wrapped = inseq.load_model(model, method, tokenizer=tokenizer)
    wrapped.__class__ = _holding_ids(type(wrapped))
    return wrapped


@functools.cache
def _holding_ids(cls: type) -> type:
    """A subclass of inseq's model class whose ``encode`` gives exact ids for one text: inseq takes texts only and
    re-tokenises them; where the decoded text reads back as other ids (e.g. two generated "\\n" tokens as one
    "\\n\\n"), ``encode`` of ``held = (text, ids)``'s text returns ``ids`` instead (inseq's own baseline rule applied
    to them: unk, eos kept), so that inseq attributes the same steps; everything else is inseq's own."""
    import torch

    class HoldingIds(cls):
        held: tuple[str, list[int]] | None = None
        was_held = False

        def encode(self, texts, *args, **options):
            batch = super().encode(texts, *args, **options)
            if self.held is None:
                return batch
            full, ids = self.held
            if texts in (full, [full]) and batch.input_ids[0].tolist() != list(ids):  # inseq's BatchEncoding
                self.was_held = True
                exact = torch.tensor([list(ids)], device=batch.input_ids.device)
                batch.input_ids, batch.attention_mask = exact, torch.ones_like(exact)
                batch.input_tokens = [self._convert_ids_to_tokens(exact[0], skip_special_tokens=False)]
                if batch.baseline_ids is not None:
                    eos = self.eos_token_id
                    batch.baseline_ids = torch.where(exact.eq(eos), eos, self.tokenizer.unk_token_id)
            return batch

    HoldingIds.__name__ = HoldingIds.__qualname__ = f"HoldingIds{cls.__name__}"
    return HoldingIds


def inseq_attribute(wrapped, model, tokenizer, ids: Sequence[int], prompt_length: int, method: str, **kwargs):
    """inseq's attribution of every generated token of ``ids`` (teacher forcing: ``attribute(prompt text, prompt +
    continuation text)``, ``wrapped`` from :func:`inseq_model`): the raw sequence attribution, the ids inseq
    attributed, and whether the text had to be held to ``ids`` (:func:`_holding_ids`)."""
    prompt = tokenizer.decode(ids[:prompt_length])
    full = tokenizer.decode(ids)
    implementation = "eager" if method == "attention" else model.config._attn_implementation  # inseq reads weights
    wrapped.held, wrapped.was_held = (full, list(ids)), False
    try:
        with _attention_implementation(model, implementation):
            out = wrapped.attribute(prompt, full, show_progress=False, **kwargs)
    finally:
        wrapped.held = None
    attribution = out.sequence_attributions[0]
    return attribution, [token.id for token in attribution.target], wrapped.was_held


def inseq_rows(attribution, prompt_length: int, steps: int, raw_l1: bool = False) -> list[np.ndarray]:
    """Step t's row: column t of inseq's token x step matrix at the p + t positions before the token. inseq's
    default aggregation (``aggregate()``), or (``raw_l1``, for comparing with normx) the L1 norm of the raw
    per-dimension attributions."""
    if raw_l1:
        matrix = attribution.target_attributions.abs().sum(-1)
    else:
        matrix = attribution.aggregate().target_attributions
    matrix = matrix.float().numpy()
    if matrix.shape[1] != steps:
        raise ValueError(f"inseq gave {matrix.shape[1]} steps, not {steps}")
    return [matrix[:prompt_length + t, t].astype(np.float64) for t in range(steps)]


def captum_attribution(model, tokenizer):
    from captum.attr import LayerGradientXActivation, LLMGradientAttribution

    return LLMGradientAttribution(LayerGradientXActivation(model, model.get_input_embeddings()), tokenizer)


def captum_input(tokenizer, ids: Sequence[int]):
    """Captum's ``TextTokenInput`` holding exactly ``ids`` (not a re-tokenisation of their text)."""
    import torch
    from captum.attr import TextTokenInput

    inp = TextTokenInput(tokenizer.decode(ids), tokenizer)
    inp.inp_tensor = inp.itp_tensor = torch.tensor([list(ids)])
    inp.values = tokenizer.convert_ids_to_tokens(list(ids))
    inp.n_itp_features = len(ids)
    return inp


def captum_rows(attribution, tokenizer, ids: Sequence[int], prompt_length: int) -> list[np.ndarray]:
    import torch

    rows = []
    for p in range(prompt_length, len(ids)):
        out = attribution.attribute(captum_input(tokenizer, ids[:p]), target=torch.tensor([ids[p]]))
        rows.append(out.token_attr[0].float().numpy().astype(np.float64))
    return rows


def lxt_rows(generations, lxt_file: str | None, lxt_python: str | None, lxt_model: str | None) -> dict:
    """LXT's rows for the generations: read from ``lxt_file``, or computed by ``studies.parity.lxt_attnlrp rows``
    with ``lxt_python`` (LXT's own virtualenv) on ``lxt_model``; checked to be for the same ids."""
    ids = [list(g.token_ids) for g in generations]
    if lxt_file is None:
        with tempfile.TemporaryDirectory() as tmp:
            steps_file, rows_file = Path(tmp) / "steps.json", Path(tmp) / "rows.json"
            command = lxt_command(lxt_python, lxt_model, "rows", str(steps_file), str(rows_file))
            steps_file.write_text(json.dumps({"sequences": [{"ids": i, "prompt_length": g.prompt_length}
                                                            for i, g in zip(ids, generations)]}) + "\n")
            subprocess.run(command, check=True, cwd=REPO)
            lxt = json.loads(rows_file.read_text())
    else:
        lxt = json.loads(Path(lxt_file).read_text())
    if lxt["ids"] != ids:
        raise SystemExit("the LXT rows were computed on other ids than this run generated")
    return lxt


def peer_rows(name: str, model, tokenizer, generations, lxt: Mapping | None = None) -> tuple[list, dict]:
    """A peer's rows for every step of ``generations``, and checks: the ids it saw, inseq against normx's own
    computations, Captum's per-step rows against its one call, LXT's conservation."""
    import torch

    import normx

    checks: dict = {}
    if name.startswith("inseq_"):
        method = name.removeprefix("inseq_")
        wrapped = inseq_model(model, tokenizer, method)
        rows, mismatched, held = [], [], []
        for i, g in enumerate(generations):
            attribution, seen, was_held = inseq_attribute(wrapped, model, tokenizer, g.token_ids, g.prompt_length,
                                                          method)
            mismatched += [i] if seen != list(g.token_ids) else []
            held += [i] if was_held else []
            rows.append(inseq_rows(attribution, g.prompt_length, g.steps))
        if mismatched:
            raise SystemExit(f"{name}: inseq attributed other ids than normx generated for prompts {mismatched}")
        checks["prompts_whose_text_retokenises_differently_ids_held"] = held
        continuations = [g.token_ids[g.prompt_length:] for g in generations]
        if method == "attention":  # the same reading as normx's attention (mean over heads and blocks)
            ours = normx.explain_generation(model, tokenizer, [g.prompt for g in generations], method="attention",
                                            target=continuations)
            checks["max_abs_diff_vs_normx_attention"] = max(
                float(np.abs(mine - theirs).max()) for o, r in zip(ours, rows) for mine, theirs in zip(o.rows(), r))
        else:  # with the logit as target and L1: normx's gradient_x_input
            diffs = []
            for g in generations[:4]:
                attribution, _, _ = inseq_attribute(wrapped, model, tokenizer, g.token_ids, g.prompt_length, method,
                                                    attributed_fn="logit")
                ours = normx.explain_generation(model, tokenizer, g.prompt, method="gradient_x_input",
                                                target=g.token_ids[g.prompt_length:]).rows()
                theirs = inseq_rows(attribution, g.prompt_length, g.steps, raw_l1=True)
                diffs += [float(np.abs(m - t).max() / np.abs(m).max()) for m, t in zip(ours, theirs)]
            checks["logit_target_l1_vs_normx_gradient_x_input_max_rel_diff_first_4_prompts"] = max(diffs)
        return rows, checks
    if name == "captum_gradient_x_activation":
        attribution = captum_attribution(model, tokenizer)
        rows = [captum_rows(attribution, tokenizer, g.token_ids, g.prompt_length) for g in generations]
        first = generations[0]
        whole = attribution.attribute(captum_input(tokenizer, first.token_ids[:first.prompt_length]),
                                      target=torch.tensor(first.token_ids[first.prompt_length:])).token_attr
        checks["per_step_vs_one_call_max_abs_diff_prompt_columns_first_prompt"] = max(
            float(np.abs(whole[t].numpy() - row[:first.prompt_length]).max()) for t, row in enumerate(rows[0]))
        return rows, checks
    if name == "lxt_attnlrp":
        if lxt is None:
            raise SystemExit("lxt_attnlrp: no LXT rows given")
        ratios = np.array([s / logit for sums, logits in zip(lxt["relevance_sums"], lxt["logits"])
                           for s, logit in zip(sums, logits)])
        checks = {"versions": lxt["versions"], "relevance_sum_over_target_logit": {
            "mean": float(ratios.mean()), "median": float(np.median(ratios)), "min": float(ratios.min()),
            "max": float(ratios.max()), "steps": int(ratios.size)}}
        return lxt["rows"], checks
    raise SystemExit(f"unknown peer {name!r}; peers: {', '.join(PEERS)}")
