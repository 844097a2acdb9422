"""Where each token ends in a decoded text: ``len(tokenizer.decode(ids[:i + 1]))`` for every i, in time linear in
the ids.

Decoding every prefix is quadratic (SmolLM2: about 10 s at 8,192 tokens, 90 s at 32,768). A decoder's text near a
token depends only on the tokens around it (the bytes of one character, a space cleaned up before punctuation, a
word-start marker), so each token's end is read from a short window instead: the end of the token before the window's
measured tokens plus what the window's text grows by up to the token, with ``CONTEXT`` tokens of the window before
the tokens it measures. The windows' reading is checked against whole prefixes at ``CHECKS`` positions and at the end;
where one differs (a decoder whose text is not local), every prefix is decoded, as before.
"""

from __future__ import annotations

CONTEXT = 16  # tokens of a window before the ones it measures (a character is at most 4 bytes of a byte-level BPE)
CHECKS = 16  # whole prefixes the windows are checked against, besides the whole text


def decoded_ends(tokenizer, ids: list[int]) -> tuple[str, list[int]]:
    """(``tokenizer.decode(ids)``, ``[len(tokenizer.decode(ids[:i + 1])) for i in range(len(ids))]``); the caller
    holds the tokenizer's lock."""
    ids = list(ids)
    text = tokenizer.decode(ids)
    if len(ids) <= 2 * CONTEXT + CHECKS:
        return text, _every_prefix(tokenizer, ids)
    ends = [len(tokenizer.decode(ids[:i + 1])) for i in range(CONTEXT)]
    for start in range(CONTEXT, len(ids), CONTEXT):  # window ids[start - CONTEXT:i + 1] measures start..
        window = ids[start - CONTEXT:start]
        before = len(tokenizer.decode(window))
        ends += [ends[start - 1] + len(tokenizer.decode(window + ids[start:i + 1])) - before
                 for i in range(start, min(len(ids), start + CONTEXT))]
    checked = [len(ids) * (k + 1) // (CHECKS + 1) for k in range(CHECKS)]
    if ends[-1] != len(text) or any(ends[i] != len(tokenizer.decode(ids[:i + 1])) for i in checked):
        return text, _every_prefix(tokenizer, ids)
    return text, ends


def _every_prefix(tokenizer, ids: list[int]) -> list[int]:
    return [len(tokenizer.decode(ids[:i + 1])) for i in range(len(ids))]
