"""A GGUF file's header, read strictly before anything else reads the file.

A GGUF file comes from a stranger: the ``gguf`` package's reader trusts every count and length in it (a truncated
header is a ``struct``/``IndexError`` deep inside transformers, a flipped array length can make it loop for a very
long time). :func:`read_header` walks the header itself, checking every count, length, type and tensor extent
against the file's size, and raises :class:`~normx.errors.ModelLoadError` naming the file, the byte offset and what
is wrong. Layout (GGUF v2 / v3, https://github.com/ggml-org/ggml/blob/master/docs/gguf.md): magic ``GGUF``,
version (u32), tensor count (u64), key/value count (u64), the key/value pairs, the tensor infos (name, dims, type,
offset), padding to the alignment, the tensor data.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass, field
from pathlib import Path

from normx.errors import ModelLoadError

MAGIC = b"GGUF"
VERSIONS = (2, 3)
MAX_DIMS = 4  # GGML_MAX_DIMS
DEFAULT_ALIGNMENT = 32
# value type -> struct code of the scalar types (8 = string, 9 = array)
SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
STRING, ARRAY = 8, 9


@dataclass(frozen=True)
class Tensor:
    name: str
    dims: tuple[int, ...]
    type: int
    offset: int  # from the start of the tensor data
    nbytes: int

    @property
    def elements(self) -> int:
        count = 1
        for d in self.dims:
            count *= d
        return count


@dataclass(frozen=True)
class Header:
    version: int
    values: dict = field(repr=False)  # key -> value, for the scalar and string keys (arrays are checked, not kept)
    tensors: tuple[Tensor, ...] = field(repr=False)
    data_offset: int = 0

    @property
    def elements(self) -> int:
        """How many numbers the tensors hold (what a de-quantised float32 model stores, 4 bytes each)."""
        return sum(t.elements for t in self.tensors)


def read_header(file: Path) -> Header:
    """The header of the GGUF file ``file``, every field checked against the file's size; a
    :class:`ModelLoadError` naming the file and what is wrong for anything that is not a whole GGUF file."""
    try:
        with open(file, "rb") as stream:
            size = stream.seek(0, 2)
            if size < 24:
                raise _Bad(0, f"{size} bytes is too short for a GGUF header (24 bytes at least)")
            with mmap.mmap(stream.fileno(), 0, access=mmap.ACCESS_READ) as data:
                return _Reader(data, size).header()
    except _Bad as bad:
        raise ModelLoadError(f"{file} is not a valid GGUF file: {bad.what} (at byte {bad.offset} of "
                             f"{file.stat().st_size})") from None
    except OSError as exc:
        raise ModelLoadError(f"could not read {file}: {exc}") from exc


class _Bad(Exception):
    def __init__(self, offset: int, what: str):
        super().__init__(what)
        self.offset, self.what = offset, what


class _Reader:
    def __init__(self, data, size: int):
        self.data, self.size, self.at, self.order = data, size, 0, "<"

    def take(self, code: str, what: str):
        width = struct.calcsize(code)
        if self.at + width > self.size:
            raise _Bad(self.at, f"the file ends inside {what}")
        (value,) = struct.unpack_from(self.order + code, self.data, self.at)
        self.at += width
        return value

    def count(self, what: str, least_bytes: int) -> int:
        """A u64 count of things each at least ``least_bytes`` long, checked to fit in what is left of the file."""
        at = self.at
        value = self.take("Q", what)
        if value * least_bytes > self.size - self.at:
            raise _Bad(at, f"{what} is {value}, more than the {self.size - self.at} bytes left can hold (the file is "
                           "cut short, or this number is corrupt)")
        return value

    def string(self, what: str) -> str:
        length = self.count(f"the length of {what}", 1)
        raw = self.data[self.at:self.at + length]
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise _Bad(self.at, f"{what} is not UTF-8 text") from None
        self.at += length
        return text

    def header(self) -> Header:
        if self.data[:4] != MAGIC:
            raise _Bad(0, f"it does not start with {MAGIC!r} (starts with {bytes(self.data[:4])!r})")
        self.at = 4
        version = self.take("I", "the version")
        if version & 0xFFFF == 0:  # written on a big-endian machine
            self.order, self.at = ">", 4
            version = self.take("I", "the version")
        if version not in VERSIONS:
            raise _Bad(4, f"version {version} is not one of {VERSIONS}")
        tensor_count = self.count("the tensor count", 8 + 4 + 8 + 4 + 8)
        kv_count = self.count("the key/value count", 8 + 4 + 1)
        values = {}
        for i in range(kv_count):
            at = self.at
            key = self.string(f"key {i}")
            if key in values:
                raise _Bad(at, f"key {key!r} appears twice")
            kind = self.take("I", f"the type of {key!r}")
            values[key] = self.value(kind, key)
        alignment = values.get("general.alignment", DEFAULT_ALIGNMENT)
        if not isinstance(alignment, int) or alignment <= 0 or alignment & (alignment - 1):
            raise _Bad(self.at, f"general.alignment is {alignment!r}, not a power of two")
        infos = [self.tensor_info(i) for i in range(tensor_count)]
        names = [info[1] for info in infos]
        if len(set(names)) < len(names):
            twice = next(n for n in names if names.count(n) > 1)
            raise _Bad(infos[names.index(twice)][0], f"tensor {twice!r} appears twice")
        data_offset = -(-self.at // alignment) * alignment
        return Header(version, {k: v for k, v in values.items() if v is not None},
                      tuple(self.tensor(info, alignment, data_offset) for info in infos), data_offset)

    def value(self, kind: int, key: str, depth: int = 0):
        """The value of ``key`` (a scalar or string; None for an array, whose items are checked and skipped)."""
        if kind in SCALARS:
            return self.take(SCALARS[kind], f"the value of {key!r}")
        if kind == STRING:
            return self.string(f"the value of {key!r}")
        if kind != ARRAY or depth > 2:
            raise _Bad(self.at - 4, f"{key!r} has value type {kind}, not one GGUF defines")
        item = self.take("I", f"the item type of {key!r}")
        width = struct.calcsize(SCALARS[item]) if item in SCALARS else 8 if item in (STRING, ARRAY) else 1
        length = self.count(f"the length of array {key!r}", width)
        if item in SCALARS:
            self.at += length * width
        else:
            for _ in range(length):
                self.value(item, key, depth + 1)
        return None

    def tensor_info(self, i: int) -> tuple[int, str, tuple[int, ...], int, int]:
        at = self.at
        name = self.string(f"the name of tensor {i}")
        n_dims = self.take("I", f"the dimension count of {name!r}")
        if not 1 <= n_dims <= MAX_DIMS:
            raise _Bad(self.at - 4, f"tensor {name!r} has {n_dims} dimensions (1 to {MAX_DIMS} allowed)")
        dims = tuple(self.take("Q", f"the dimensions of {name!r}") for _ in range(n_dims))
        kind = self.take("I", f"the type of {name!r}")
        offset = self.take("Q", f"the data offset of {name!r}")
        return at, name, dims, kind, offset

    def tensor(self, info, alignment: int, data_offset: int) -> Tensor:
        from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

        at, name, dims, kind, offset = info
        if min(dims) < 1:
            raise _Bad(at, f"tensor {name!r} has dimensions {dims}")
        try:
            block, type_size = GGML_QUANT_SIZES[GGMLQuantizationType(kind)]
        except (ValueError, KeyError):
            raise _Bad(at, f"tensor {name!r} has type {kind}, not one ggml defines") from None
        elements = Tensor(name, dims, kind, offset, 0).elements
        if dims[0] % block:
            raise _Bad(at, f"tensor {name!r}'s first dimension {dims[0]} is not a multiple of its block size {block}")
        nbytes = elements // block * type_size
        if offset % alignment:
            raise _Bad(at, f"tensor {name!r}'s data offset {offset} is not a multiple of the alignment {alignment}")
        if data_offset + offset + nbytes > self.size:
            raise _Bad(at, f"tensor {name!r} ({nbytes} bytes at {data_offset + offset}) runs past the end of the "
                           f"file ({self.size} bytes)")
        return Tensor(name, dims, kind, offset, nbytes)
