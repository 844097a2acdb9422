"""``normx.load_model``: an offline preset by name, or anything :func:`normx.models.loading.load_pretrained` loads
(a model folder, a PEFT adapter folder, a hub id)."""

from __future__ import annotations

import logging
import warnings
from pathlib import Path

from normx.errors import InputWarning, ModelLoadError
from normx.models.loading import HubUnreachableError, load_pretrained, never_ask_to_run_code, ready, refuse_remote_code
from normx.zoo.presets import PRESETS, preset_named, shadowed_folder


def load_model(name_or_path: str | Path = "minilm-sst2", *, task: str | None = None, dtype=None, device=None,
               notify=None, **kwargs):
    """Load ``(model, tokenizer)``, ready for :func:`normx.explain` (eval mode).

    ``name_or_path``: a preset name (``normx.list_presets()``; offline; a bare name is the preset even where the
    working directory has a folder of that name, which loads as ``"./NAME"``), a local model folder, a PEFT adapter
    folder (``adapter_config.json``; its base is loaded the same way), a GGUF file or a folder holding one (a causal
    LM unless ``task`` says otherwise; converted once, then loaded from the cache: ``normx cache``) or a Hugging
    Face hub id (needs network). ``task`` (``"sequence-classification"``, ``"masked-lm"``, ``"causal-lm"``) picks
    the head when the folder's ``architectures`` has none normx supports, e.g. a bare encoder to be given a fresh
    head. ``notify(message)`` is told of slow first-time steps (by default the ``normx`` logger's warning, which
    Python shows on standard error where logging is not set up). Other keyword arguments (``num_labels``,
    ``gguf_file``, ``revision``...) go to ``from_pretrained``.
    """
    notify = notify if notify is not None else logging.getLogger("normx").warning
    preset = preset_named(name_or_path)
    if preset is not None:
        if (folder := shadowed_folder(preset.name)) is not None:
            warnings.warn(f"{preset.name!r} is a preset and also a folder here: the preset was loaded (presets are "
                          f"names, folders are paths); to load the folder, give its path: {folder}", InputWarning,
                          stacklevel=2)
        refuse_remote_code(kwargs)
        kwargs.pop("trust_remote_code", None)
        if dtype is not None:
            kwargs["dtype"] = dtype
        with never_ask_to_run_code():
            model, tokenizer = ready(*preset.load(notify, **kwargs), device)
        model.normx_name = preset.name  # what results and run manifests call it (normx.models.identity)
        return model, tokenizer
    source = str(name_or_path)
    if not isinstance(name_or_path, str) and not Path(source).expanduser().exists():
        raise ModelLoadError(f"no model folder at {Path(source).expanduser()} (a Path is a folder; a preset is "
                             "named by a str)")
    try:
        return load_pretrained(source, task=task, dtype=dtype, device=device, notify=notify, **kwargs)
    except HubUnreachableError as exc:  # say which names load offline
        raise ModelLoadError(f"{exc.source!r} is not a preset (`normx models`: {', '.join(PRESETS)}), "
                             f"{exc.detail}") from None
