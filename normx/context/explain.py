"""``normx.explain_context``: build the prompt around a context, remember where each source is (characters in the
context, tokens in the prompt), and explain the response through :func:`normx.explain_generation`."""

from __future__ import annotations

from collections.abc import Sequence

from normx.context.result import ContextAttribution, Source
from normx.core.concurrency import tokenizer_lock
from normx.core.handle import model_handle
from normx.core.inputs import max_input_length
from normx.errors import EmptyTextError, InputTooLongError, InvalidInputError
from normx.explanations.generation import explain_generation
from normx.methods import get_method
from normx.methods.ablation.sources import SPLITS, split_text, token_sources

# ContextCite's default prompt (context_cite.ContextCiter's prompt_template)
DEFAULT_TEMPLATE = "Context: {context}\n\nQuery: {query}"


def explain_context(model, tokenizer, context: str | Sequence[str], query: str | None = None, *,
                    sources: str = "sentences", method: str = "contextcite", response=None, chat: bool | None = None,
                    prompt_template: str | None = None, max_new_tokens: int = 64, separator: str = "\n\n",
                    batch_size: int = 8, scope: str | None = None, **options) -> ContextAttribution:
    """Which part of ``context`` the model's response (to ``query``) came from.

    Args:
        model, tokenizer: a causal LM and its fast tokenizer.
        context: a text, split into ``sources``; or a list of source texts, joined with ``separator``.
        query: the question or instruction; put after the context by ``prompt_template``.
        sources: how a text context is split: ``"sentences"`` (offline nltk Punkt, per line), ``"paragraphs"``
            (blank lines), ``"lines"`` or ``"words"``.
        method: any method that explains a generation (``normx.list_methods(response_only=True)`` adds the
            ablations: ``contextcite``, the default, and ``leave_one_out``).
        response: the response to explain (a text, or token ids), as ``explain_generation``'s ``target``; ``None``:
            the model writes it (greedy, ``max_new_tokens``).
        chat: wrap the prompt as a user message with the tokenizer's chat template (its scaffolding is no source);
            ``None`` (the default): where the tokenizer has a chat template, as a chat model is meant to be asked
            (the result's ``settings["chat"]`` says which).
        prompt_template: the prompt with ``{context}`` (once) and optionally ``{query}`` marking their places;
            default :data:`DEFAULT_TEMPLATE` with a query, the context alone without one.
        scope: as in ``explain_generation``; default ``"response"`` for the methods that have a response-level
            computation (the gradient methods, AttnLRP: one backward pass of the response's log-probability).
        **options: the method's options (e.g. ``n_ablations=32``); a method with a ``sources`` option is given the
            sources' token spans.
    """
    spec = get_method(method)
    if chat is None:
        chat = has_chat_template(tokenizer)
    spec.resolve_options({k: v for k, v in options.items() if k != "sources"})  # bad options before any work
    limit = max_input_length(tokenizer, model_handle(model))
    if isinstance(response, str):
        with tokenizer_lock(tokenizer):
            room = len(tokenizer(response, add_special_tokens=False)["input_ids"])
    else:
        room = max_new_tokens if response is None else len(response)
    if isinstance(context, str):
        _refuse_long(tokenizer, context, limit, room, response is None)
    prompt, context_text, context_at, spans = _prompt(context, query, sources, prompt_template, separator)
    ids, offsets, special, text_at = _prompt_tokens(tokenizer, prompt, chat)
    if len(ids) + room > limit:
        raise InputTooLongError(f"the prompt is {len(ids):,} tokens and the answer {room:,} more: "
                                f"{len(ids) + room:,}, more than the {limit:,} this model takes; "
                                + _way_out(response is None))
    members = token_sources([(a + context_at + text_at, b + context_at + text_at) for a, b in spans], offsets,
                            special)
    empty = [k for k, m in enumerate(members) if not m]
    if empty:
        raise InvalidInputError(f"source {empty[0]} ({context_text[slice(*spans[empty[0]])]!r:.60}) has no token of "
                                "its own (its characters share tokens with its neighbours): use larger sources")
    found = [Source(context_text[a:b], a, b, m[0], m[-1] + 1) for (a, b), m in zip(spans, members)]
    if "sources" in spec.options:
        options["sources"] = [(s.token_start, s.token_end) for s in found]
    if scope is None and spec.response is not None and not spec.response_only:
        scope = "response"
    generation = explain_generation(model, tokenizer, prompt, method=method, target=response,
                                    max_new_tokens=max_new_tokens, chat=chat, batch_size=batch_size, scope=scope,
                                    **options)
    if generation.token_ids[:generation.prompt_length] != ids:
        raise RuntimeError("explain_generation tokenised the prompt differently from explain_context")
    return ContextAttribution(context=context_text, query=query, prompt=prompt, sources=found,
                              generation=generation, settings={"sources": sources if isinstance(context, str)
                                                               else "given", "chat": chat})


CHARS_PER_TOKEN = 16  # a bound on a text's characters per token: beyond it, a prefix of the text is counted


def _refuse_long(tokenizer, text: str, limit: int, answer: int, generated: bool) -> None:
    """Refuse a context that cannot fit in the ``limit`` tokens the model takes beside an ``answer`` of that many
    tokens, in time that does not grow with it: only its first ``CHARS_PER_TOKEN * (room + 1)`` characters are
    tokenised (before it is split or tokenised whole)."""
    room = limit - answer
    if room < 1:
        way = "give fewer new tokens (max_new_tokens; normx cite: --max-new-tokens)" if generated else \
            "give a shorter response"
        raise InputTooLongError(f"this model takes {limit:,} tokens and the answer needs {answer:,} of them: {way}")
    cut = CHARS_PER_TOKEN * (room + 1)
    if len(text) <= cut:
        return
    with tokenizer_lock(tokenizer):
        count = len(tokenizer(text[:cut], add_special_tokens=False, verbose=False)["input_ids"])
    if count > room:
        raise InputTooLongError(f"the context has {len(text):,} characters, and its first {cut:,} alone are "
                                f"{count:,} tokens, more than the {room:,} this model has for it; "
                                + _way_out(generated))


def _way_out(generated: bool) -> str:
    more = " or fewer new tokens (max_new_tokens; normx cite: --max-new-tokens)" if generated else ""
    return f"give a shorter context{more}"


def has_chat_template(tokenizer) -> bool:
    """Whether ``tokenizer`` has a chat template (a chat model's prompts are wrapped in it by default)."""
    return bool(getattr(tokenizer, "chat_template", None))


def _prompt(context, query, how, template, separator):
    """(prompt, the context's text, where it starts in the prompt, the sources' character spans in the context)."""
    if isinstance(context, str):
        if how not in SPLITS:
            raise InvalidInputError(f"sources={how!r} is not allowed; use one of {SPLITS}")
        text = context
        spans = split_text(text, how)
    else:
        given = list(context) if isinstance(context, Sequence) else None
        if not given or not all(isinstance(s, str) for s in given):
            raise InvalidInputError("context must be a text or a non-empty list of source texts")
        if any(not s.strip() for s in given):
            raise EmptyTextError("a source text is empty or only whitespace")
        text, spans = "", []
        for k, source in enumerate(given):
            if k:
                text += separator
            spans.append((len(text), len(text) + len(source)))
            text += source
    if not spans:
        raise EmptyTextError("the context is empty or only whitespace; give some text to attribute to")
    if query is not None and (not isinstance(query, str) or not query.strip()):
        raise InvalidInputError(f"query must be a non-empty text or None, got {query!r:.60}")
    template = template if template is not None else DEFAULT_TEMPLATE if query is not None else "{context}"
    if not isinstance(template, str) or template.count("{context}") != 1:
        raise InvalidInputError("prompt_template must contain {context} exactly once (and {query} where the query "
                                f"goes), got {template!r:.80}")
    before, after = template.split("{context}")
    if query is None and "{query}" in template:
        raise InvalidInputError("prompt_template has a {query} place but no query was given")
    before, after = (part.replace("{query}", query or "") for part in (before, after))
    return before + text + after, text, len(before), spans


def _prompt_tokens(tokenizer, prompt: str, chat: bool):
    """The prompt's ids as explain_generation makes them, each token's characters in the tokenised text, the
    special-token flags, and where the prompt starts in that text."""
    with tokenizer_lock(tokenizer):
        if chat:
            if not getattr(tokenizer, "chat_template", None):
                raise InvalidInputError("chat=True, but this tokenizer has no chat template")
            text = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False,
                                                 add_generation_prompt=True)
            encoded = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
            at = text.find(prompt)
        else:
            encoded = tokenizer(prompt, return_offsets_mapping=True)
            at = 0
    if at < 0:
        raise InvalidInputError("the chat template does not keep the prompt's text as given")
    ids = list(encoded["input_ids"])
    special_ids = set(getattr(tokenizer, "all_special_ids", []))
    return ids, [tuple(o) for o in encoded["offset_mapping"]], [i in special_ids for i in ids], at
