"""A malformed GGUF file is a clear error (issue #42 item 7): its header is read strictly before transformers reads
it, and whatever transformers makes of a stranger's file is a ModelLoadError; the CLI says it with exit 2. Fuzzed:
seeded truncations and bit flips of the tiny GGUF the tests write, each one either loads and runs or is a
ModelLoadError naming the file, never another exception."""

from __future__ import annotations

import random
import struct
import warnings

import pytest
import torch
from gguf_support import write_tiny_gguf

import normx
from normx.cli.main import main
from normx.models.gguf_header import read_header

pytest.importorskip("gguf", reason="GGUF files need `pip install gguf`")


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("NORMX_CACHE", str(tmp_path / "cache"))


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> bytes:
    file = tmp_path_factory.mktemp("gguf") / "tiny-llama.gguf"
    write_tiny_gguf(file)
    return file.read_bytes()


def test_the_header_reads_as_the_gguf_package_reads_it(tiny, tmp_path):
    from gguf import GGUFReader

    file = tmp_path / "tiny.gguf"
    file.write_bytes(tiny)
    header, reader = read_header(file), GGUFReader(str(file))
    assert header.version == 3 and header.data_offset == reader.data_offset
    assert [(t.name, t.dims, t.nbytes) for t in header.tensors] == [
        (t.name, tuple(int(d) for d in t.shape), int(t.n_bytes)) for t in reader.tensors]
    assert header.values["general.architecture"] == "llama" and header.values["llama.block_count"] == 2
    assert header.data_offset + max(t.offset + t.nbytes for t in header.tensors) == len(tiny)  # no trailing bytes


def _with(tiny: bytes, at: int, data: bytes) -> bytes:
    return tiny[:at] + data + tiny[at + len(data):]


CASES = {  # name -> (change to the tiny file, what the error says)
    "empty": (lambda b: b"", r"0 bytes is too short for a GGUF header \(24 bytes at least\) \(at byte 0 of 0\)"),
    "not gguf": (lambda b: b"PK\x03\x04" + b[4:], r"it does not start with b'GGUF' \(starts with b'PK\\x03\\x04'\)"),
    "version": (lambda b: _with(b, 4, struct.pack("<I", 7)), r"version 7 is not one of \(2, 3\) \(at byte 4"),
    "header cut": (lambda b: b[:60], r"the tensor count is 21, more than the 44 bytes left can hold \(the file is cut "
                                     r"short, or this number is corrupt\) \(at byte 8 of 60\)"),
    "cut in a length": (lambda b: b[:b.index(b"token_embd.weight") - 4],  # a tensor info's name length
                        r"the file ends inside the length of the name of tensor \d+ \(at byte \d+ of \d+\)"),
    "counts": (lambda b: _with(b, 16, struct.pack("<Q", 10**9)),
               r"the key/value count is 1000000000, more than the \d+ bytes left can hold"),
    "data cut": (lambda b: b[:-1], r"tensor '[\w.]+' \(\d+ bytes at \d+\) runs past the end of the file"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_malformed_file_is_an_error_naming_it_and_what_is_wrong(tiny, tmp_path, case):
    change, said = CASES[case]
    file = tmp_path / "bad.gguf"
    file.write_bytes(change(tiny))
    with pytest.raises(normx.ModelLoadError, match=rf"^{file} is not a valid GGUF file: {said}"):
        normx.load_model(file)


def test_the_command_line_says_it_with_exit_2(tiny, tmp_path, capsys):
    file = tmp_path / "bad.gguf"
    file.write_bytes(tiny[:100])
    assert main(["generate", "--model", str(file), "--max-new-tokens", "1", "the film"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"normx: error: {file} is not a valid GGUF file: the tensor count is 21, more "
                          "than the 84 bytes left can hold (the file is cut short")
    assert "Traceback" not in err


def test_a_file_transformers_cannot_convert_is_a_load_error(tiny, tmp_path):
    file = tmp_path / "odd.gguf"
    at = tiny.index(b"llama")  # general.architecture's value: a well-formed file of an architecture nobody knows
    file.write_bytes(_with(tiny, at, b"zzzzz"))
    with pytest.raises(normx.ModelLoadError, match=rf"could not convert {file} \(architecture 'zzzzz'\) to a "
                                                   "transformers model: ValueError: .*zzzzz"):
        normx.load_model(file)


def test_fuzzed_truncations_and_bit_flips_load_or_are_a_load_error(tiny, tmp_path):
    rng = random.Random(42)
    header_end = read_header_end(tiny, tmp_path)
    variants = [("cut", n, tiny[:n]) for n in range(0, 100, 3)]  # inside the header's first 100 bytes
    variants += [("cut", n, tiny[:n]) for n in sorted(rng.sample(range(100, len(tiny)), 8))]
    for _ in range(40):  # bit flips in the header: counts, lengths, types, names, values, tensor infos
        at, bit = rng.randrange(header_end), rng.randrange(8)
        variants.append(("flip", at, _with(tiny, at, bytes([tiny[at] ^ 1 << bit]))))
    outcomes = {"loaded": 0, "refused": 0}
    for kind, at, data in variants:
        file = tmp_path / f"{kind}-{at}.gguf"
        file.write_bytes(data)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                model, tokenizer = normx.load_model(file)
        except normx.ModelLoadError as exc:
            assert str(file) in str(exc), (kind, at, str(exc))
            outcomes["refused"] += 1
            continue
        except Exception as exc:  # the test's point: no other exception type
            raise AssertionError(f"{kind} at byte {at}: {type(exc).__name__}: {exc}") from exc
        assert kind == "flip", f"a file cut at byte {at} of {len(tiny)} loaded"
        with torch.no_grad():
            out = model(**tokenizer("the film was good", return_tensors="pt"))
        assert out.logits.shape[-1] == model.config.vocab_size
        outcomes["loaded"] += 1
        file.unlink()
    assert outcomes["refused"] >= 42 and outcomes["loaded"] >= 1, outcomes  # every cut, and flips of both kinds


def read_header_end(tiny: bytes, tmp_path) -> int:
    file = tmp_path / "whole.gguf"
    file.write_bytes(tiny)
    return read_header(file).data_offset
