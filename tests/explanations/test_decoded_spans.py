"""Each token's end in the decoded text, read from short windows: the same as decoding every prefix (byte-level BPE
with characters split over tokens, WordPiece with its spaces cleaned up, a SentencePiece-style decoder that strips
the text's first space, SmolLM2's own tokenizer), in time linear in the tokens, and every prefix decoded where the
windows do not read a decoder right."""

from __future__ import annotations

import time

import pytest
import tiny
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from normx.explanations import decoded_spans
from normx.explanations.decoded_spans import decoded_ends

TEXTS = [
    "Don't stop . It 's fine , isn't it ? \"Yes\" - he said ( twice ) ; I 'm sure you 've seen it ...",
    "Emoji 🙂👍🏽 and flags 🇫🇷🇯🇵, accents: café, naïve, Ångström; CJK 日本語のテキスト, Ελληνικά, עברית.",
    "Lines\n\n  indented\ttabs   and    runs of spaces\r\nend.  ",
]


def _every_prefix(tokenizer, ids):
    """What generation's _encoded computed before: one decode per prefix."""
    return tokenizer.decode(ids), [len(tokenizer.decode(ids[:i + 1])) for i in range(len(ids))]


def _sentencepiece_style():
    """A BPE on Metaspace words with byte fallback, decoded as Llama 2's tokenizer is (the first space stripped)."""
    tok = Tokenizer(models.BPE(byte_fallback=True, unk_token="<unk>"))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="never")
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    specials = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    trainer = trainers.BpeTrainer(vocab_size=600, special_tokens=specials, show_progress=False)
    tok.train_from_iterator([t.replace("🙂", "") for t in TEXTS] * 3 + tiny.CORPUS, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>")


def _tokenizers():
    yield "byte-level", tiny.bpe_tokenizer("llama")
    yield "wordpiece", tiny.wordpiece_tokenizer()
    yield "sentencepiece-style", _sentencepiece_style()
    yield from _smollm2()


def _smollm2():
    """SmolLM2's own tokenizer, where its package is here (the other tokenizers run without it)."""
    try:
        from normx.zoo.presets import smollm2_dir

        return [("smollm2", AutoTokenizer.from_pretrained(smollm2_dir(), trust_remote_code=False))]
    except Exception:  # the package or its cache is not here
        return []


@pytest.mark.parametrize(("name", "tokenizer"), list(_tokenizers()))
def test_windows_give_every_prefixs_length(name, tokenizer, monkeypatch):
    texts = [" ".join([text] * 6) for text in TEXTS] + [" ".join(TEXTS * 4)]
    for text in texts:
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        special = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else tokenizer.sep_token_id
        ids = [*ids[:len(ids) // 2], special, *ids[len(ids) // 2:]]  # a special token inside
        assert len(ids) > 3 * decoded_spans.CONTEXT + decoded_spans.CHECKS
        want = _every_prefix(tokenizer, ids)
        with monkeypatch.context() as patch:  # the windows' reading, not the fallback
            patch.setattr(decoded_spans, "_every_prefix", lambda *_: pytest.fail(f"{name}: windows disagreed"))
            assert decoded_ends(tokenizer, ids) == want, (name, text[:40])
        for cut in (0, 1, 5, 2 * decoded_spans.CONTEXT + decoded_spans.CHECKS + 1):  # short sequences
            assert decoded_ends(tokenizer, ids[:cut]) == _every_prefix(tokenizer, ids[:cut])


class _Counting:
    """A tokenizer's decode, counting the ids it decodes; ``shift`` makes its text depend on how many ids there are
    (a decoder the windows cannot read)."""

    def __init__(self, tokenizer, shift: bool = False):
        self.tokenizer, self.shift, self.decoded = tokenizer, shift, 0

    def decode(self, ids):
        self.decoded += len(ids)
        text = self.tokenizer.decode(ids)
        return "#" * (len(ids) // 100) + text if self.shift else text


def test_linear_in_the_tokens():
    tokenizer = tiny.bpe_tokenizer("llama")
    ids = tokenizer(" ".join(TEXTS * 80), add_special_tokens=False)["input_ids"][:8192]
    assert len(ids) == 8192
    counting = _Counting(tokenizer)
    start = time.perf_counter()
    text, ends = decoded_ends(counting, ids)
    seconds = time.perf_counter() - start
    assert text == tokenizer.decode(ids) and ends[-1] == len(text) and len(ends) == len(ids)
    assert counting.decoded < 50 * len(ids), counting.decoded  # every prefix: len(ids)^2 / 2 = 4,096 * len(ids)
    assert seconds < 5, seconds  # decoding every prefix: ~10 s for SmolLM2's 8,192 tokens


def test_a_decoder_the_windows_do_not_read_gets_every_prefix():
    tokenizer = _Counting(tiny.bpe_tokenizer("llama"), shift=True)
    ids = tiny.bpe_tokenizer("llama")(" ".join(TEXTS * 4), add_special_tokens=False)["input_ids"][:300]
    assert decoded_ends(tokenizer, ids) == _every_prefix(tokenizer, ids)


def _byte_level():
    yield "byte-level", tiny.bpe_tokenizer("llama")
    yield "gpt2-style", tiny.bpe_tokenizer("gpt2")
    yield from _smollm2()


@pytest.mark.parametrize(("name", "tokenizer"), list(_byte_level()))
def test_byte_level_tokenizers_are_read_from_their_bytes(name, tokenizer, monkeypatch):
    """A byte-level tokenizer's ends come from its vocabulary's bytes (no window decoded, no prefix), equal to every
    prefix's decoding: characters split over tokens, a special token inside, short and long sequences."""
    assert decoded_spans.byte_table(tokenizer) is not None, name
    monkeypatch.setattr(decoded_spans, "_batch_decoder", lambda *_: pytest.fail(f"{name}: windows decoded"))
    monkeypatch.setattr(decoded_spans, "_every_prefix", lambda *_: pytest.fail(f"{name}: every prefix decoded"))
    for text in [*TEXTS, " ".join(TEXTS * 5)]:
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        special = tokenizer.eos_token_id
        ids = [*ids[:len(ids) // 2], special, *ids[len(ids) // 2:]]
        assert decoded_ends(tokenizer, ids) == _every_prefix(tokenizer, ids), (name, text[:40])
        assert decoded_ends(tokenizer, ids[:1]) == _every_prefix(tokenizer, ids[:1])


def test_bytes_that_are_not_utf8_are_read_by_the_windows():
    """A sequence whose bytes end inside a character (a model that wrote the first byte of an emoji) decodes with a
    replacement character: the byte table says so and the windows read it, equal to every prefix."""
    tokenizer = tiny.bpe_tokenizer("llama")
    ids = tokenizer(" ".join(TEXTS * 3), add_special_tokens=False)["input_ids"]
    lone = tokenizer.convert_tokens_to_ids(decoded_spans._byte_alphabet()[0xF0])  # a 4-byte character's first byte
    table = decoded_spans.byte_table(tokenizer)
    assert table.ends([*ids, lone]) is None
    assert decoded_ends(tokenizer, [*ids, lone]) == _every_prefix(tokenizer, [*ids, lone])
    assert decoded_ends(tokenizer, [lone, *ids]) == _every_prefix(tokenizer, [lone, *ids])


def test_tables_are_read_once_per_tokenizer_and_again_when_tokens_are_added():
    import copy
    import threading

    tokenizer = copy.deepcopy(tiny.bpe_tokenizer("llama"))
    ids = tokenizer(TEXTS[0], add_special_tokens=False)["input_ids"]
    results = []

    def read():
        results.append(decoded_ends(tokenizer, ids))

    threads = [threading.Thread(target=read) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results == [_every_prefix(tokenizer, ids)] * 8
    first = decoded_spans.byte_table(tokenizer)
    assert decoded_spans.byte_table(tokenizer) is first
    tokenizer.add_tokens(["<new>"])
    again = decoded_spans.byte_table(tokenizer)
    assert again is not first and len(again.pieces) == len(first.pieces) + 1
    new = [*ids, len(tokenizer) - 1]
    assert decoded_ends(tokenizer, new) == _every_prefix(tokenizer, new)


def test_the_lead_ids_are_read_once_per_template():
    import copy

    from tokenizers import processors

    from normx.explanations import generation

    tokenizer = copy.deepcopy(tiny.bpe_tokenizer("llama"))  # "<s> $A"
    ids = tokenizer("the film")["input_ids"]
    calls = []

    class Counting(type(tokenizer)):
        def __call__(self, *args, **kwargs):
            calls.append(1)
            return super().__call__(*args, **kwargs)

    tokenizer.__class__ = Counting
    assert generation._added_prefix(tokenizer, ids) == 1
    read = len(calls)
    assert generation._added_prefix(tokenizer, ids) == 1 and len(calls) == read  # kept
    tokenizer.backend_tokenizer.post_processor = processors.TemplateProcessing(single="$A", pair="$A $B:1")
    assert generation._added_prefix(tokenizer, ids) == 0  # another template: read again
    assert len(calls) > read
