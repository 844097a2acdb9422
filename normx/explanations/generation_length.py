"""How long a sequence explain_generation takes, and what it does with a prompt that is longer.

The limit is ``max_length`` tokens, the prompt and its continuation together (by default the model's own context
length, :func:`normx.core.inputs.max_input_length`: its position table, capped by the tokenizer's
``model_max_length`` when that is a real number; SmolLM2: 8,192). The continuation's room is the given target's
length, or ``max_new_tokens`` when the model writes it. A prompt that leaves too little room is refused
(``truncation="error"``, the default: an :class:`~normx.errors.InputTooLongError` that says the counts and the ways
out) or cut at its start (``truncation="warn"``: the tokens nearest the continuation are kept, after the special
tokens the tokenizer puts first, e.g. a BOS; an :class:`~normx.errors.InputWarning` says how many tokens were cut,
from where, and the first words kept). A chat-wrapped prompt is never cut (that would remove the template's start).
"""

from __future__ import annotations

import warnings

from normx.errors import InputTooLongError, InputWarning, InvalidInputError

TRUNCATION = ("error", "warn")


def check_truncation(truncation: str) -> str:
    if truncation not in TRUNCATION:
        raise InvalidInputError(f"truncation={truncation!r} is not allowed; use 'error' (refuse a prompt that does "
                                "not fit) or 'warn' (cut its start, with a warning)")
    return truncation


def fit_prompt(tokenizer, ids: list[int], room: int, limit: int, truncation: str, chat: bool, lead: int,
               what: str) -> tuple[list[int], list[str]]:
    """``ids`` (a prompt's, ``lead`` of them the tokenizer's leading special tokens) fitted so that ``room`` more
    tokens (``what``: "generated tokens" or "continuation tokens") stay within ``limit``: (ids, warnings)."""
    if len(ids) + room <= limit:
        return ids, []
    keep = limit - room
    said = (f"the prompt has {len(ids)} tokens and {room} {what} follow it: {len(ids) + room} tokens, more than "
            f"max_length={limit}")
    if truncation == "error" or chat or keep < lead + 1:
        why = ("a chat-wrapped prompt is not cut (the template's start would go); shorten it" if chat else
               f"there is no room for the prompt (it needs max_length > {room + lead})" if keep < lead + 1 else
               "shorten the prompt, give fewer new tokens, or pass truncation='warn' (CLI: --truncation warn) to "
               "cut the prompt's start")
        raise InputTooLongError(f"{said}; {why}")
    cut = len(ids) - keep
    kept = ids[:lead] + ids[lead + cut:]
    start = tokenizer.decode(kept[lead:lead + 8])
    message = (f"{said}: the prompt's first {cut} tokens{f' after its {lead} special token(s)' if lead else ''} "
               f"were cut; the explained prompt is its last {keep - lead} tokens, from {start!r}")
    warnings.warn(message, InputWarning, stacklevel=3)
    return kept, [message]
