"""``text_ids``: a text's ids as ``tokenizer(text)["input_ids"]`` gives them, from the Rust tokenizer without offsets
where that is the same call, and from the tokenizer's own call wherever anything set on it could change the result."""

from __future__ import annotations

import copy

import pytest
import tiny

from normx.core import inputs
from normx.core.inputs import _plain_encoding, backend_encodings, encode, text_ids

TEXTS = ["The cat sat on the mat.", "  leading and trailing spaces  ", "naïve café — 東京 🙂", "a\nb\n\nc\t d",
         "<s> a literal special token </s> in text", " ".join(tiny.CORPUS)]


def _tokenizers():
    out = {style: copy.deepcopy(tiny.bpe_tokenizer(style)) for style in ("llama", "gpt2", "roberta", "llama-eos")}
    out["wordpiece"] = copy.deepcopy(tiny.wordpiece_tokenizer())
    return out


@pytest.mark.parametrize("name", sorted(_tokenizers()))
@pytest.mark.parametrize("special", [True, False])
def test_equal_to_the_tokenizers_own_call(name, special):
    tokenizer = _tokenizers()[name]
    tokenizer("x")  # a tokenizer file may set truncation on its Rust tokenizer (MiniLM's: 128): the call clears it
    assert _plain_encoding(tokenizer, tokenizer.backend_tokenizer)  # the offset-free path is the one tested here
    for text in TEXTS:
        assert text_ids(tokenizer, text, add_special_tokens=special) == \
            tokenizer(text, add_special_tokens=special)["input_ids"], text


def test_state_set_on_the_tokenizer_takes_its_own_call():
    tokenizer = _tokenizers()["llama"]
    backend = tokenizer.backend_tokenizer
    backend.enable_truncation(max_length=3)  # left behind by someone's own use of the Rust tokenizer
    assert not _plain_encoding(tokenizer, backend)
    assert text_ids(tokenizer, TEXTS[-1]) == tokenizer(TEXTS[-1])["input_ids"]
    assert len(text_ids(tokenizer, TEXTS[-1])) > 3  # the call resets what it does not ask for
    tokenizer.split_special_tokens = True  # "<s>" in the text is then spelled out, not the special token
    assert not _plain_encoding(tokenizer, tokenizer.backend_tokenizer)
    assert text_ids(tokenizer, TEXTS[4]) == tokenizer(TEXTS[4])["input_ids"]
    assert tokenizer.convert_tokens_to_ids("<s>") not in text_ids(tokenizer, TEXTS[4])[1:]


def test_a_subclass_with_its_own_encoding_takes_its_call():
    tokenizer = _tokenizers()["gpt2"]

    class Prefixed(type(tokenizer)):
        def _encode_plus(self, text, *args, **kwargs):  # a model's tokenizer that changes the text first
            return super()._encode_plus(f"Q: {text}" if isinstance(text, str) else text, *args, **kwargs)

    tokenizer.__class__ = Prefixed
    assert not _plain_encoding(tokenizer, tokenizer.backend_tokenizer)
    assert text_ids(tokenizer, "hello") == tokenizer("hello")["input_ids"] != tokenizer.backend_tokenizer.encode(
        "hello").ids


@pytest.mark.parametrize("name", sorted(_tokenizers()))
def test_encode_reads_the_same_from_the_rust_encodings(name, monkeypatch):
    """``encode`` (normx.explain's tokenising) from the Rust tokenizer's encodings gives each text (and pair) what
    it gives from the tokenizer's own call: ids, offsets, segments, special tokens, token types, warnings."""
    tokenizer = _tokenizers()[name]
    tokenizer("x")
    pairs = list(reversed(TEXTS))
    assert backend_encodings(tokenizer, TEXTS, None) is not None  # the fast path is the one measured
    fast = [encode(tokenizer, TEXTS, None, 512, "warn"), encode(tokenizer, TEXTS, pairs, 512, "warn"),
            encode(tokenizer, TEXTS, None, 6, "warn")]  # (an over-long text is encoded again, truncated)
    monkeypatch.setattr(inputs, "backend_encodings", lambda *_: None)
    slow = [encode(tokenizer, TEXTS, None, 512, "warn"), encode(tokenizer, TEXTS, pairs, 512, "warn"),
            encode(tokenizer, TEXTS, None, 6, "warn")]
    assert fast == slow
    assert any(item.warnings for item in fast[2]) and fast[1][0].segments.count(1) > 0


@pytest.mark.parametrize("name", sorted(_tokenizers()))
def test_encoded_tokens_are_the_vocabularys_own_strings(name):
    """``encode`` takes each token's string from the Rust encoding it made: the same as ``convert_ids_to_tokens``,
    with pairs and special tokens, and on the truncating path (which reads them from the vocabulary)."""
    tokenizer = _tokenizers()[name]
    tokenizer("x")
    for text in TEXTS:
        for item in encode(tokenizer, [text], [TEXTS[0]], 10_000, "warn") + encode(tokenizer, [text], None, 6, "warn"):
            assert item.tokens == tokenizer.convert_ids_to_tokens(item.ids), text
