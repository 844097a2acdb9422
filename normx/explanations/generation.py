"""Explain what a causal language model writes: every generated token's attribution to the tokens before it.

In a causal LM the hidden state at position i depends only on the tokens at positions <= i. So one forward pass over
the prompt and its continuation holds every generation step: the head on every position, read at each generated
token's vocabulary column and kept at the positions before that token, is what the step's own pass on its prefix
would give. The head-on-top methods (NormXLogit, LogAt, l2 and the variants: ``Method.per_position``) take that
one pass for all steps, batched over prompts; so do the decoder attention maps (``Method.query_rows``: attention,
norm-based attention), whose row for the prediction at position q is final once q has run, so step t reads row
q = p - 1 of the one pass (p: the generated token's index) over the keys before p. The gradient methods and AttnLRP
(``Method.steps``) take one forward pass over each sequence and one backward pass per batch of steps; the baselines
that read no model (``Method.model_free``: random, recency) no pass at all; the rest one pass (and backward pass)
per step on its prefix (:mod:`normx.explanations.generation_steps`). Methods with a response-level computation run
once for the whole response (:mod:`normx.explanations.generation_response`: the ablations always, the gradient
methods with ``scope="response"``). Everything is computed from the ids the model produced, never from re-encoded
text.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import pairwise

import numpy as np

from normx._torch import torch
from normx.core.concurrency import tokenizer_lock
from normx.core.forward import Pass
from normx.core.inputs import Encoded, batches, max_input_length, positive_int, resolve_max_length, text_ids
from normx.core.vocabulary import kept_for, vocabulary_names
from normx.errors import EmptyTextError, InputTooLongError, InvalidInputError, UnsupportedModelError
from normx.explanations.decoded_spans import decoded_ends
from normx.explanations.explain import Plan, attribute_batch, full_rows, model_settings, prepare
from normx.explanations.generation_length import check_truncation, fit_prompt
from normx.explanations.generation_reading import mask_after, step_readings
from normx.explanations.generation_response import at_response_level, response_level
from normx.explanations.generation_result import Generation, Generations
from normx.explanations.generation_steps import from_one_pass, model_free, per_prefix
from normx.methods import Context
from normx.models import HeadKind


def explain_generation(model, tokenizer, prompts: str | Sequence[str], method: str = "normxlogit", layer=None, *,
                       target=None, max_new_tokens: int = 20, chat: bool = False, gen_args: dict | None = None,
                       batch_size: int = 8, scope: str | None = None, max_length: int | None = None,
                       truncation: str = "error", **options) -> Generation | list[Generation]:
    """Generate a continuation of each prompt (or take the given one) and explain every generated token.

    Args:
        model: a causal LM (``*ForCausalLM``), PEFT-wrapped or not.
        tokenizer: its fast tokenizer.
        prompts: one prompt or a list; a single string returns one :class:`Generation`.
        method: a name from ``normx.list_methods()`` that explains causal LMs.
        layer: as in :func:`normx.explain` (``None``: the method's default; ``"all"``; a list).
        target: the continuation to explain instead of generating one (teacher forcing), as Captum's
            ``LLMAttribution`` takes it: a text (tokenised without special tokens and appended to the prompt's
            ids; give the leading space the words need) or a list of token ids; for a list of prompts, a list with
            one such target per prompt. ``None``: the model writes it with its own ``generate``.
        max_new_tokens: the most tokens to generate (greedy unless ``gen_args`` says otherwise).
        chat: wrap each prompt as a user message with the tokenizer's chat template and its generation prompt.
        gen_args: more keyword arguments for ``model.generate`` (e.g. ``{"do_sample": True, "top_p": 0.9}``).
        batch_size: sequences per forward pass (one-pass methods), or prefixes per pass (the per-prefix methods).
            The gradient methods and AttnLRP take one sequence per forward pass and batch their backward passes by
            a memory rule (:mod:`normx.methods.step_gradients`); the baselines that read no model (random, recency:
            ``Method.model_free``) run no pass, so their Generation has no model outputs (probabilities NaN,
            predictions -1).
        scope: ``"response"`` runs a method with a response-level computation (``Method.response``: the gradient
            methods and AttnLRP) once for the whole response: ONE backward pass of the response's total
            log-probability, each token's score divided evenly over the steps that see it
            (:mod:`normx.methods.response`); ``"step"``: one computation per generated token; ``None``: the
            method's own (the ablations, ``leave_one_out`` and ``contextcite``, always score the whole response).
        max_length: the most tokens of a prompt and its continuation together (``max_new_tokens``, or the given
            target's length), 1 .. the model's context length (the default: its position table, capped by the
            tokenizer's ``model_max_length`` when that is real; :mod:`normx.explanations.generation_length`).
        truncation: what a prompt that does not fit gets: ``"error"`` (an :class:`InputTooLongError` with the
            counts) or ``"warn"`` (its start is cut, the tokens nearest the continuation kept, and an
            :class:`~normx.errors.InputWarning` says how many tokens were cut; also in the result's ``warnings``).
        **options: the method's own options, as in :func:`normx.explain`.
    """
    single = isinstance(prompts, str)
    prompts = [prompts] if single else list(prompts)
    if not prompts or not all(isinstance(p, str) for p in prompts):
        raise InvalidInputError("prompts must be a string or a non-empty list of strings")
    targets = _targets(target, len(prompts), single)
    positive_int(batch_size, "batch_size")
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 0:
        raise InvalidInputError(f"max_new_tokens must be a whole number >= 0, got {max_new_tokens!r}")
    if gen_args is not None and not isinstance(gen_args, dict):
        raise InvalidInputError(f"gen_args must be a dict of model.generate arguments, got {type(gen_args).__name__}")
    plan = _causal_plan(model, tokenizer, method, layer, options, "explain_generation")
    at_response_level(plan, scope)  # a scope the method does not have is refused before any generation
    limit = resolve_max_length(max_length, tokenizer, plan.handle)
    check_truncation(truncation)
    sequences, cuts = [], []
    for prompt, forced in zip(prompts, targets):
        ids = _prompt_ids(tokenizer, prompt, chat)
        new = None if forced is None else _target_ids(tokenizer, forced)
        lead = 0 if chat else _added_prefix(tokenizer, ids)
        room, what = (max_new_tokens, "new tokens may") if new is None else (len(new), "continuation tokens")
        ids, said = fit_prompt(tokenizer, ids, room, limit, truncation, chat, lead, what)
        if said:
            prompt = tokenizer.decode(ids[lead:])
        if new is None:
            new = _generate(plan, tokenizer, ids, max_new_tokens, gen_args)
        if len(ids) + len(new) > limit:  # (gen_args may have asked for more tokens)
            raise InputTooLongError(f"the prompt ({len(ids)} tokens) and its continuation ({len(new)}) are longer "
                                    f"than max_length={limit}")
        sequences.append((prompt, ids, new))
        cuts.append(said)
    request = {"layer": layer, "chat": chat, "max_new_tokens": max_new_tokens, "teacher_forcing": target is not None,
               "gen_args": dict(gen_args or {}), "scope": scope, "max_length": limit, "truncation": truncation,
               "warnings": cuts}
    out = _explained(plan, tokenizer, sequences, batch_size, request)
    return out[0] if single else Generations(out)


def explain_token_ids(model, tokenizer, token_ids: Sequence[Sequence[int]], prompt_lengths: Sequence[int],
                      method: str = "normxlogit", layer=None, *, batch_size: int = 8,
                      **options) -> list[Generation]:
    """Explain given sequences of token ids, each a prompt's ids then its continuation's: what
    :func:`explain_generation` gives with ``target=`` the continuation, from ids that no tokenizer reads again (e.g.
    another library's batch, :mod:`normx.integrations.inseq`).

    Args:
        model, tokenizer: as in :func:`explain_generation`.
        token_ids: the sequences, each a non-empty list of vocabulary ids.
        prompt_lengths: per sequence, how many of its first ids are the prompt (1 or more); every id after them is
            explained as a generated token, on the ids before it.
        method, layer, batch_size, **options: as in :func:`explain_generation`.
    """
    if isinstance(token_ids, str) or not isinstance(token_ids, Sequence) or not token_ids:
        raise InvalidInputError("token_ids must be a non-empty list of token id lists")
    if isinstance(prompt_lengths, str) or not isinstance(prompt_lengths, Sequence) or \
            len(prompt_lengths) != len(token_ids):
        raise InvalidInputError(f"prompt_lengths must be a list with one length per sequence ({len(token_ids)})")
    positive_int(batch_size, "batch_size")
    plan = _causal_plan(model, tokenizer, method, layer, options, "explain_token_ids")
    limit = max_input_length(tokenizer, plan.handle)
    sequences, items = [], []
    vocab = len(tokenizer)
    for given, length in zip(token_ids, prompt_lengths):
        ids = [] if isinstance(given, str) or not isinstance(given, Sequence) else list(given)
        if not ids or not all(isinstance(i, (int, np.integer)) and not isinstance(i, bool) and 0 <= i < vocab
                              for i in ids):
            raise InvalidInputError(f"each of token_ids must be a non-empty list of token ids in 0..{vocab - 1}, "
                                    f"got {given!r:.80}")
        ids = [int(i) for i in ids]
        if isinstance(length, bool) or not isinstance(length, (int, np.integer)) or not 1 <= length <= len(ids):
            raise InvalidInputError(f"a prompt length must be a whole number in 1..{len(ids)} (the sequence's "
                                    f"length), got {length!r}")
        if len(ids) > limit:
            raise InputTooLongError(f"a sequence has {len(ids)} tokens; this model takes {limit}")
        item = _encoded(tokenizer, ids)
        items.append(item)
        sequences.append((item.text[:item.offsets[length - 1][1]], ids[:length], ids[length:]))
    request = {"layer": layer, "chat": False, "max_new_tokens": None, "teacher_forcing": True, "gen_args": {},
               "scope": None, "max_length": limit, "truncation": "error", "warnings": [[]] * len(sequences)}
    return _explained(plan, tokenizer, sequences, batch_size, request, items)


def _causal_plan(model, tokenizer, method: str, layer, options: dict, caller: str) -> Plan:
    plan = prepare(model, tokenizer, method, None, layer, **options)
    if plan.adapter.kind is not HeadKind.CAUSAL_LM:
        raise UnsupportedModelError(f"{caller} explains causal LMs (*ForCausalLM); {plan.handle.name} has "
                                    f"a {plan.adapter.kind.value.replace('_', ' ')} head: use normx.explain")
    return plan


def _explained(plan: Plan, tokenizer, sequences: list[tuple[str, list[int], list[int]]], batch_size: int,
               request: dict, items: list[Encoded] | None = None) -> list[Generation]:
    """Each ``(prompt, prompt ids, continuation ids)`` explained (one pass for all steps, or one per step), with
    the ``request``'s layer, chat, max_new_tokens, teacher_forcing and gen_args in the settings; ``items``: the
    sequences already encoded (:func:`_encoded` of prompt ids + continuation ids), where the caller has them."""
    if items is None:
        items = [_encoded(tokenizer, ids + new) for _, ids, new in sequences]
    lengths = [len(ids) for _, ids, _ in sequences]
    prompts = [prompt for prompt, _, _ in sequences]
    method = plan.method
    if at_response_level(plan, request["scope"]):
        scores, probabilities, predictions, shown, diagnostics, added = response_level(
            plan, tokenizer, prompts, items, lengths, batch_size)
    else:
        if method.model_free:
            found = model_free(plan, tokenizer, items, lengths, batch_size)
        elif method.steps is not None:
            found = from_one_pass(plan, tokenizer, prompts, items, lengths, batch_size)
        else:
            compute = _one_pass if method.per_position or method.query_rows is not None else per_prefix
            found = compute(plan, tokenizer, items, lengths, batch_size)
        scores, probabilities, predictions, shown, diagnostics = found
        added = [{}] * len(items)
    settings = {"method": plan.method.name, "layer": request["layer"], "chat": request["chat"],
                "max_new_tokens": request["max_new_tokens"], "reading": plan.method.reading_for(plan.options),
                "label_dependent": plan.method.label_dependent, "teacher_forcing": request["teacher_forcing"],
                "gen_args": request["gen_args"], "max_length": request["max_length"],
                "truncation": request["truncation"], **model_settings(plan.handle), **plan.options}
    return [Generation(prompt=prompt, text=item.text, token_ids=list(item.ids),
                       vocabulary_tokens=list(item.tokens),
                       offsets=list(item.offsets), special=list(item.special), prompt_length=length, scores=s,
                       probabilities=p, predictions=q, layers=list(plan.layers), method=plan.method.name,
                       settings={**settings, **extra}, family=plan.adapter.family, alternatives=a, diagnostics=d,
                       warnings=list(said))
            for (prompt, _, _), item, length, s, p, q, a, d, extra, said in zip(
                sequences, items, lengths, scores, probabilities, predictions, shown, diagnostics, added,
                request["warnings"])]


# ---- inputs --------------------------------------------------------------------------------------------------------
def _targets(target, count: int, single: bool) -> list:
    if target is None:
        return [None] * count
    if single:
        return [target]
    if isinstance(target, str) or not isinstance(target, Sequence) or len(target) != count:
        raise InvalidInputError(f"for {count} prompts give target as a list of {count} continuations (texts or "
                                "lists of token ids), or None to generate")
    return list(target)


def _prompt_ids(tokenizer, prompt: str, chat: bool) -> list[int]:
    if not prompt.strip():
        raise EmptyTextError("a prompt is empty or only whitespace; give some text to continue")
    with tokenizer_lock(tokenizer):
        if chat:
            if not getattr(tokenizer, "chat_template", None):
                raise InvalidInputError("chat=True, but this tokenizer has no chat template")
            text = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False,
                                                 add_generation_prompt=True)
            ids = text_ids(tokenizer, text, add_special_tokens=False)
        else:
            ids = text_ids(tokenizer, prompt)
    return list(ids)


def _target_ids(tokenizer, target) -> list[int]:
    if isinstance(target, str):
        if not target:
            raise EmptyTextError("target is an empty continuation; give some text or token ids")
        with tokenizer_lock(tokenizer):
            return text_ids(tokenizer, target, add_special_tokens=False)
    ids = list(target)
    vocab = len(tokenizer)
    if not ids or not all(isinstance(i, (int, np.integer)) and not isinstance(i, bool) and 0 <= i < vocab
                          for i in ids):
        raise InvalidInputError(f"target must be a text or a non-empty list of token ids in 0..{vocab - 1}")
    return [int(i) for i in ids]


def _generate(plan: Plan, tokenizer, ids: list[int], max_new_tokens: int, gen_args: dict | None) -> list[int]:
    """The model's own continuation of ``ids`` (greedy unless ``gen_args`` says otherwise), one prompt at a time
    (so that no padding changes what it writes)."""
    if max_new_tokens == 0:
        return []
    handle = plan.handle
    inputs = torch.tensor([ids], device=handle.device)
    kwargs = {"max_new_tokens": max_new_tokens, "do_sample": False, **(gen_args or {})}
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    with handle.using(), torch.no_grad():
        out = handle.model.generate(input_ids=inputs, attention_mask=torch.ones_like(inputs), pad_token_id=pad,
                                    **kwargs)
    return out[0, len(ids):].tolist()


def _encoded(tokenizer, ids: list[int]) -> Encoded:
    """The sequence as normx's batching takes it, with character spans of each token in its decoded text. The
    special tokens the tokenizer itself puts before a text (a BOS) are not in that text (their spans are empty), so
    that the text of any prefix, given to ``normx.explain``, is tokenised back to the same ids."""
    with tokenizer_lock(tokenizer):
        tokens = vocabulary_names(tokenizer, ids)
        lead = _added_prefix(tokenizer, ids)
        text, ends = decoded_ends(tokenizer, ids[lead:])  # each prefix's decoded length, in linear time
        special_ids = list(getattr(tokenizer, "all_special_ids", []))
    bounds = np.zeros(len(ids) + 1, np.int64)  # [0, end of token 0, end of token 1, ...]
    bounds[1 + lead:] = ends
    np.maximum.accumulate(np.clip(bounds, 0, len(text), out=bounds), out=bounds)  # spans in order
    bounds = bounds.tolist()
    special = np.isin(np.fromiter(ids, np.int64, len(ids)), special_ids)  # (np.asarray of a list: 3x as long)
    return Encoded(text=text, text_pair=None, ids=list(ids), tokens=tokens, offsets=list(pairwise(bounds)),
                   segments=[0] * len(ids), special=special.tolist())


def _added_prefix(tokenizer, ids: list[int]) -> int:
    """How many of ``ids``' first ids are the special tokens the tokenizer adds before any text (0 if none)."""
    prefix = _lead_ids(tokenizer)
    return len(prefix) if prefix and list(ids[:len(prefix)]) == prefix else 0


def _lead_ids(tokenizer) -> list[int]:
    """The special tokens the tokenizer puts before any text, read once per tokenizer and template (its post
    processor and BOS / EOS switches: setting ``add_bos_token`` reads them again)."""
    template = (str(getattr(getattr(tokenizer, "backend_tokenizer", None), "post_processor", None)),
                getattr(tokenizer, "add_bos_token", None), getattr(tokenizer, "add_eos_token", None))

    def read(_size: int) -> list[int]:
        plain = tokenizer("a", add_special_tokens=False)["input_ids"]
        full = tokenizer("a")["input_ids"]
        return list(full[:len(full) - len(plain)]) if full[len(full) - len(plain):] == plain else []

    return kept_for(tokenizer, f"lead ids {template}", read)


# ---- the two ways of computing -----------------------------------------------------------------------------------
def _one_pass(plan: Plan, tokenizer, items: list[Encoded], lengths: list[int], batch_size: int):
    """One forward pass per batch of whole sequences; every step read from it."""
    scores, probabilities, predictions, shown, diagnostics = [], [], [], [], []
    base, adapter = plan.base, plan.adapter
    starts = iter(lengths)
    for batch, inputs in batches(items, plan.handle.rows_per_pass(batch_size), tokenizer, plan.handle.device):
        rows = [(item, next(starts)) for item in batch]
        steps = max(len(item.ids) - length for item, length in rows)
        if steps == 0:
            for item, _ in rows:
                scores.append(np.full((len(plan.layers), 0, len(item.ids)), np.nan, np.float32))
                probabilities.append(np.zeros(0, np.float32))
                predictions.append([])
                shown.append([])
                diagnostics.append({})
            continue
        device = inputs["input_ids"].device  # rows padded on the right (collate): token i of a row at position i
        columns = torch.tensor([_padded(item.ids[length:], steps) for item, length in rows], device=device)
        queries = torch.tensor([_padded(list(range(length - 1, len(item.ids) - 1)), steps) for item, length in rows],
                               device=device)
        every, run, found = _all_steps(plan, inputs, columns, queries, full_rows(batch, plan.pad_token_id))
        last = run.head_input(adapter.num_layers(base))  # [B, T, H], after the final norm
        with plan.handle.using(), torch.no_grad():
            for r, (item, length) in enumerate(rows):
                n, width = len(item.ids) - length, len(item.ids)
                logits = adapter.head(base, last[r, length - 1:width - 1], None).float()  # [n, V]: positions before
                probs, best, alternatives = step_readings(plan.labels, logits, item.ids[length:])
                shown.append(alternatives)
                matrix = every[r, :n, :, :width].permute(1, 0, 2).cpu().numpy().copy()  # [L, n, T]
                mask_after(matrix, length)
                scores.append(matrix)
                probabilities.append(probs)
                predictions.append(best)
                diagnostics.append({name: value[r, :n].float().cpu().tolist() for name, value in found.items()})
    return scores, probabilities, predictions, shown, diagnostics


def _all_steps(plan: Plan, inputs: dict, columns: torch.Tensor, queries: torch.Tensor, full: bool = False
               ) -> tuple[torch.Tensor, Pass, dict[str, torch.Tensor]]:
    """Every step's scores [B, steps, layers, T] from one pass, that pass, and the method's diagnostics per step
    ([B, steps] each). A per-position method scores every
    position for each step's column (the step's row: the positions before its token); a per-query method
    (``Method.query_rows``) gives each step's row at its query position, the token before the generated one.
    ``full``: every row fills the batch (:attr:`Pass.full`; a per-position method's pass leaves its mask out)."""
    method = plan.method
    if method.query_rows is None:
        out = attribute_batch(plan, inputs, columns, prediction=False, full=full)  # (per-position: never read)
        return out.scores, out.run, dict(out.diagnostics)
    run = Pass(plan.base, plan.adapter, inputs, plan.layers, plan.embedding, reads=plan.reads,
               num_layers=plan.num_layers).locate()  # (its hooks read the attention its mask makes: kept)
    ctx = Context(run, plan.labels, columns, None, options=plan.options)
    with plan.handle.using(), method.grad_mode():
        every = method.query_rows(ctx, queries).float()
    if not run.hidden:
        raise RuntimeError(f"method {method.name!r} has query_rows but did not run its forward pass on ctx.run")
    return every, run, dict(ctx.diagnostics)


def _padded(ids: list[int], width: int) -> list[int]:
    """A row of target columns padded to ``width`` (repeating its last id; the padding's scores are dropped)."""
    return ids + [ids[-1] if ids else 0] * (width - len(ids))
