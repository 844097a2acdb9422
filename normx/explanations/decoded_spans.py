"""Where each token ends in a decoded text: ``len(tokenizer.decode(ids[:i + 1]))`` for every i, with host work that
does not grow with the ids in Python.

Decoding every prefix is quadratic (SmolLM2: about 10 s at 8,192 tokens, 90 s at 32,768). Two readings replace it:

- **Byte-level decoders** (GPT-2, Llama 3, Qwen, SmolLM2: the ``tokenizers`` ``ByteLevel`` decoder): the text is the
  UTF-8 decoding of the tokens' bytes, concatenated. Each vocabulary entry's bytes are read once per tokenizer (the
  decoder's byte alphabet; an entry outside it, an added token, is its own UTF-8), checked once against the
  tokenizer's own decoding of every entry alone and of the whole vocabulary in one sequence. A call then joins the
  bytes and counts the characters each prefix holds in numpy: a prefix that ends inside a character decodes to one
  replacement character for it, so its length is the number of characters begun in it.
- **Any other decoder**: a decoder's text near a token depends only on the tokens around it (a space cleaned up before
  punctuation, a word-start marker), so each token's end is read from a short window: the end of the token before
  the window's measured tokens plus what the window's text grows by up to the token, with ``CONTEXT`` tokens of the
  window before the tokens it measures, every window decoded in one call of the Rust tokenizer where its decoding is
  the tokenizer's. The windows are checked against whole prefixes at ``CHECKS`` positions and at the end; where one
  differs (a decoder whose text is not local), every prefix is decoded.
"""

from __future__ import annotations

from dataclasses import dataclass
from operator import itemgetter

import numpy as np

from normx.core.vocabulary import kept_for

CONTEXT = 16  # tokens of a window before the ones it measures (a character is at most 4 bytes of a byte-level BPE)
CHECKS = 16  # whole prefixes the windows are checked against, besides the whole text


def decoded_ends(tokenizer, ids: list[int]) -> tuple[str, list[int]]:
    """(``tokenizer.decode(ids)``, ``[len(tokenizer.decode(ids[:i + 1])) for i in range(len(ids))]``); the caller
    holds the tokenizer's lock."""
    ids = list(ids)
    table = byte_table(tokenizer)
    if table is not None and ids:
        found = table.ends(ids)
        if found is not None:
            return found
    text = tokenizer.decode(ids)
    decode = _batch_decoder(tokenizer, ids, text)
    if len(ids) <= 2 * CONTEXT + CHECKS:
        return text, _every_prefix(tokenizer, ids)
    windows = [ids[:i + 1] for i in range(CONTEXT)]
    bases = []
    for start in range(CONTEXT, len(ids), CONTEXT):  # window ids[start - CONTEXT:i + 1] measures start..
        window = ids[start - CONTEXT:start]
        bases.append(len(windows))
        windows.append(window)
        windows += [window + ids[start:i + 1] for i in range(start, min(len(ids), start + CONTEXT))]
    lengths = [len(t) for t in decode(windows)]
    ends = lengths[:CONTEXT]
    for base, start in zip(bases, range(CONTEXT, len(ids), CONTEXT)):
        stop = min(len(ids), start + CONTEXT)
        ends += [ends[start - 1] + lengths[base + 1 + k] - lengths[base] for k in range(stop - start)]
    checked = [len(ids) * (k + 1) // (CHECKS + 1) for k in range(CHECKS)]
    if ends[-1] != len(text) or any(ends[i] != len(tokenizer.decode(ids[:i + 1])) for i in checked):
        return text, _every_prefix(tokenizer, ids)
    return text, ends


def _every_prefix(tokenizer, ids: list[int]) -> list[int]:
    return [len(tokenizer.decode(ids[:i + 1])) for i in range(len(ids))]


def _batch_decoder(tokenizer, ids: list[int], text: str):
    """Many sequences decoded as ``tokenizer.decode`` decodes each: in one call of its Rust tokenizer where that
    gives ``text``, the tokenizer's own decoding of ``ids`` (no clean-up of spaces after it), else one ``decode`` per
    sequence."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None and backend.decode(ids, skip_special_tokens=False) == text:
        return lambda many: backend.decode_batch(many, skip_special_tokens=False)
    return lambda many: [tokenizer.decode(one) for one in many]


# ---- byte-level decoders -------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class ByteTable:
    """Each vocabulary id's bytes in a byte-level tokenizer's decoded text."""

    pieces: tuple[bytes, ...]
    lengths: np.ndarray  # [V] int64: len(pieces[i])

    def ends(self, ids: list[int]) -> tuple[str, list[int]] | None:
        """(text, each prefix's decoded length), or None where the joined bytes are not UTF-8 (the decoding's
        replacement characters then depend on where a prefix stops: the windows read it)."""
        if min(ids) < 0 or max(ids) >= len(self.pieces):
            return None
        data = b"".join(itemgetter(*ids)(self.pieces)) if len(ids) > 1 else self.pieces[ids[0]]
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            return None
        begun = np.zeros(len(data) + 1, np.int64)  # characters begun in data[:k]
        np.cumsum((np.frombuffer(data, np.uint8) & 0xC0) != 0x80, out=begun[1:])
        return text, begun[np.cumsum(self.lengths[np.fromiter(ids, np.int64, len(ids))])].tolist()  # (a list index: 3x)


def byte_table(tokenizer) -> ByteTable | None:
    """The tokenizer's :class:`ByteTable` if its decoding is byte-level and the table reproduces it (read once per
    tokenizer and vocabulary size), else None."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None or type(backend.decoder).__name__ != "ByteLevel":
        return None
    return kept_for(tokenizer, "bytes", lambda size: _read_table(tokenizer, backend, size))


def _read_table(tokenizer, backend, size: int) -> ByteTable | None:
    byte_of = {char: byte for byte, char in _byte_alphabet().items()}
    pieces = []
    for i in range(size):
        token = backend.id_to_token(i)
        if token is None:
            pieces.append(b"")
        elif all(char in byte_of for char in token):
            pieces.append(bytes(byte_of[char] for char in token))
        else:
            pieces.append(token.encode("utf-8"))
    alone = backend.decode_batch([[i] for i in range(size)], skip_special_tokens=False)
    if alone != [piece.decode("utf-8", "replace") for piece in pieces]:
        return None
    if tokenizer.decode(list(range(size))) != b"".join(pieces).decode("utf-8", "replace"):
        return None  # the tokenizer's decode adds to the decoder's text (a clean-up of spaces, say)
    return ByteTable(tuple(pieces), np.array([len(piece) for piece in pieces], np.int64))


def _byte_alphabet() -> dict[int, str]:
    """The byte-level decoder's alphabet: each byte's character (GPT-2's: printable Latin-1 bytes stand for
    themselves, the others for the characters from U+0100 on, in byte order)."""
    kept = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    chars, extra = {}, 0
    for byte in range(256):
        if byte in kept:
            chars[byte] = chr(byte)
        else:
            chars[byte] = chr(256 + extra)
            extra += 1
    return chars
