"""``normx.load_model``: a model with its head and a fast tokenizer, from a folder, a hub id or a PEFT adapter."""

from __future__ import annotations

import json
import pickle
import re
import threading
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import transformers
from safetensors import SafetensorError

from normx.errors import ModelLoadError, UnsupportedModelError
from normx.models.discovery import head_kind
from normx.models.gguf import gguf_file, load_gguf
from normx.models.registry import supported_models
from normx.models.tasks import TASKS

_PEFT_TASKS = {"SEQ_CLS": "sequence-classification", "CAUSAL_LM": "causal-lm"}
# peft asks transformers a deprecated question on every adapter load (is_gradient_checkpointing): a FutureWarning
# the user can do nothing about. Only that one message, from that one place, is silenced.
warnings.filterwarnings("ignore", message=r".*`is_gradient_checkpointing` is deprecated", category=FutureWarning,
                        module=r"transformers\.modeling_utils")
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "vocab.json", "spiece.model")
_ADAPTER_WEIGHTS = ("adapter_model.safetensors", "adapter_model.bin")  # the file peft loads: the first present
_NO_PROMPT = threading.Lock()
_ONE_LOAD_AT_A_TIME = threading.RLock()  # normx's loads in one process, one after another (never_ask_to_run_code)
_NAME_MAX = 255  # the longest file or folder name the usual file systems take
_no_prompt = {"loads": 0, "timeout": None}  # loads in flight under never_ask_to_run_code; the timeout they replaced


class HubUnreachableError(ModelLoadError):
    """A name that is neither a local folder nor in the Hugging Face cache, with the hub out of reach."""

    def __init__(self, source: str, detail: str):
        super().__init__(f"{source!r} is {detail}")
        self.source, self.detail = source, detail


def load_pretrained(name_or_path: str | Path, *, task: str | None = None, dtype=None, device=None,
                    notify: Callable[[str], None] | None = None, **kwargs):
    """Load ``(model, tokenizer)``, ready for :func:`normx.explain` (eval mode).

    ``name_or_path``: a local model folder, a PEFT adapter folder (``adapter_config.json``; its base is loaded the
    same way), a GGUF file or a folder holding one (loaded as a causal LM unless ``task`` says otherwise, converted
    once and cached: :mod:`normx.models.gguf`) or a Hugging Face hub id (needs network); :func:`normx.load_model`
    also takes the offline presets. ``task`` (``"sequence-classification"``, ``"masked-lm"``, ``"causal-lm"``)
    picks the head when the folder's ``architectures`` has none normx supports, e.g. a bare encoder to be given a
    fresh head (a warning says when a head's weights are new). ``notify(message)`` is told of slow steps (a GGUF
    file's first conversion). Other keyword arguments (``num_labels``, ``gguf_file``, ``revision``...) go to
    ``from_pretrained``.
    """
    if task is not None and task not in TASKS:
        raise ModelLoadError(f"task={task!r} is not known; use one of {sorted(TASKS)}")
    refuse_remote_code(kwargs)
    kwargs["trust_remote_code"] = False  # never run code from a model folder or hub repository, never ask
    with never_ask_to_run_code():
        return _load(str(name_or_path), task, dtype, device, notify, kwargs)


def check_model_name(source: str) -> None:
    """A name no file system takes (a part over 255 characters: probing it as a path raises OSError, File name too
    long) is a :class:`ModelLoadError` before anything looks for it."""
    longest = max((len(part) for part in Path(source).parts), default=0)
    if longest > _NAME_MAX:
        raise ModelLoadError(f"the model name {source[:40]!r}... has a part of {longest} characters; a preset, hub "
                             f"id or folder name is at most {_NAME_MAX}")


def _load(source: str, task: str | None, dtype, device, notify, kwargs: dict):
    check_model_name(source)
    path = Path(source).expanduser()
    file = path / kwargs.pop("gguf_file") if kwargs.get("gguf_file") else gguf_file(path)
    if file is not None:
        if not file.is_file():
            raise ModelLoadError(f"no GGUF file at {file}")
        return ready(*load_gguf(file, task=task, tasks=TASKS, dtype=dtype, notify=notify), device)
    if _looks_local(source) and not path.exists():
        raise ModelLoadError(f"no model folder at {path}; give an existing folder or a hub id")
    if not path.exists():
        _check_hub_id(source)
    if dtype is not None:
        kwargs["dtype"] = dtype
    if (path / "adapter_config.json").is_file():
        model, tokenizer = _load_peft(path, task, kwargs)
    else:
        model = _load_transformers(source, task, kwargs)
        tokenizer = _load_tokenizer(source, kwargs)
    return ready(model, tokenizer, device)


def refuse_remote_code(kwargs: dict) -> None:
    if kwargs.get("trust_remote_code"):
        raise ModelLoadError("trust_remote_code=True is not allowed: normx explains transformers' built-in "
                             "architectures only (normx.supported_models()), and never runs a model folder's own code")


@contextmanager
def never_ask_to_run_code() -> Iterator[None]:
    """While normx loads, a folder's own code is refused, never asked about: every load normx makes passes
    ``trust_remote_code=False``, and a load it does not make itself (peft's, for an adapter whose tuner loads another
    model by name) that would ask "Do you wish to run the custom code? [y/N]" on standard input raises instead
    (transformers' own switch for that: its prompt timeout at 0). Set back when the last load in flight ends."""
    from transformers import dynamic_module_utils

    with _ONE_LOAD_AT_A_TIME, _NO_PROMPT:
        if _no_prompt["loads"] == 0:
            _no_prompt["timeout"] = dynamic_module_utils.TIME_OUT_REMOTE_CODE
            dynamic_module_utils.TIME_OUT_REMOTE_CODE = 0
        _no_prompt["loads"] += 1
    try:
        with _ONE_LOAD_AT_A_TIME:  # transformers' from_pretrained swaps class methods (tie_weights, init) while
            yield  # it loads and puts back what it found: two loads in threads at once can leave them swapped for good
    finally:
        with _NO_PROMPT:
            _no_prompt["loads"] -= 1
            if _no_prompt["loads"] == 0:
                dynamic_module_utils.TIME_OUT_REMOTE_CODE = _no_prompt["timeout"]


def _check_hub_id(source: str) -> None:
    """A hub id must be in the local Hugging Face cache or the hub must be reachable: otherwise fail at once, with
    the presets (transformers would retry for half a minute before saying it cannot connect)."""
    try:
        transformers.AutoConfig.from_pretrained(source, local_files_only=True, trust_remote_code=False)
        return  # cached
    except (OSError, ValueError):
        pass
    if not _hub_reachable():
        raise HubUnreachableError(source, "not a local folder and not in the Hugging Face cache, and the hub cannot "
                                          "be reached from here to download it")


def _hub_reachable(timeout: float = 3.0) -> bool:
    """Whether a TCP connection to the hub endpoint opens within ``timeout`` ($HF_HUB_OFFLINE=1: never tried)."""
    import os
    import socket
    from urllib.parse import urlparse

    if os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on"):
        return False
    endpoint = urlparse(os.environ.get("HF_ENDPOINT") or "https://huggingface.co")
    try:
        socket.create_connection((endpoint.hostname, endpoint.port or 443), timeout=timeout).close()
        return True
    except OSError:
        return False


def ready(model, tokenizer, device=None):
    """``(model, tokenizer)`` made ready to explain: a pad token for batching, on ``device``, in eval mode."""
    _ensure_pad(model, tokenizer)
    if device is not None:
        model.to(device)
    model.eval()
    return model, tokenizer


def _looks_local(source: str) -> bool:
    return source.startswith((".", "/", "~")) or Path(source).exists() or source.count("/") > 1


def _model_class(config, task: str | None, source: str):
    supported = supported_models()
    if task is not None:
        return getattr(transformers, TASKS[task])
    for arch in getattr(config, "architectures", None) or []:
        if arch in supported or (head_kind(arch) is not None and hasattr(transformers, arch)):
            return getattr(transformers, arch)
    raise UnsupportedModelError(
        f"{source} declares architectures {getattr(config, 'architectures', None)}, none of which has a head normx "
        f"supports ({', '.join(supported)}). Pass task= one of {sorted(TASKS)} (CLI: --task) to load it with that "
        "head; normx then says whether the head's weights came from the checkpoint or are new."
    )


def _load_transformers(source: str, task: str | None, kwargs: dict, head_from_adapter: bool = False):
    kwargs = {**kwargs, "trust_remote_code": False}  # whoever calls: never a model's own code
    config_kwargs = {k: v for k, v in kwargs.items() if k in ("gguf_file", "revision", "trust_remote_code",
                                                               "cache_dir", "token", "local_files_only")}
    try:
        config = kwargs.get("config") or transformers.AutoConfig.from_pretrained(source, **config_kwargs)
        cls = _model_class(config, task, source)
        model, info = cls.from_pretrained(source, output_loading_info=True, **kwargs)
        if not head_from_adapter:  # (a PEFT adapter brings the heads its base lacks)
            _say_new_head(model, info, source)
        return model
    except (OSError, ValueError) as exc:
        if isinstance(exc, UnsupportedModelError):
            raise
        if _wants_own_code(exc):
            raise ModelLoadError(_own_code_message("a model", source, exc)) from None
        raise ModelLoadError(f"could not load a model from {source!r}: {exc}. A hub id needs network access "
                             "(the hub is unreachable offline); a local folder needs config.json and weights.") from exc
    except pickle.UnpicklingError as exc:  # a pickled checkpoint that the safe (weights-only) load refuses
        raise ModelLoadError(_pickle_message(f"a model from {source!r}", exc, "model.safetensors")) from None
    except SafetensorError as exc:
        raise ModelLoadError(f"could not load a model from {source!r}: its safetensors weights are damaged ({exc})"
                             ) from None


def _say_new_head(model, info: dict, source: str) -> None:
    """A warning when weights the task model needs were not in the checkpoint (a head normx would explain while
    untrained); nothing when every weight loaded (a tied LM head counts as loaded)."""
    missing = [name for name in (info or {}).get("missing_keys", []) if not name.endswith("position_ids")]
    if missing:
        shown = ", ".join(missing[:4]) + (f" and {len(missing) - 4} more" if len(missing) > 4 else "")
        warnings.warn(f"{type(model).__name__} from {source}: {len(missing)} weight(s) were not in the checkpoint and "
                      f"are new, untrained ({shown}); explanations of an untrained head mean nothing until it is "
                      "trained", UserWarning, stacklevel=4)


def _load_tokenizer(source: str, kwargs: dict):
    tok_kwargs = {k: v for k, v in kwargs.items() if k in ("gguf_file", "revision", "cache_dir", "token",
                                                            "local_files_only")}
    try:
        return transformers.AutoTokenizer.from_pretrained(source, trust_remote_code=False, **tok_kwargs)
    except (OSError, ValueError) as exc:
        if _wants_own_code(exc):
            raise ModelLoadError(_own_code_message("a tokenizer", source, exc)) from None
        raise ModelLoadError(f"could not load a tokenizer from {source!r}: {exc}") from exc


def _pickle_message(what: str, exc: Exception, safetensors: str) -> str:
    """A pickle the weights-only load refused: what it refused (not torch's advice around it, which is to load the
    file without the check), and the format that needs no unpickling."""
    text = str(exc)
    found = re.search(r"WeightsUnpickler error:(.*?)(?:Check the documentation|$)", text, re.DOTALL)
    reason = " ".join((found.group(1) if found else text).split()) or type(exc).__name__
    return (f"could not load {what}: its pickled weights failed the safe load (only tensors are allowed, no code; "
            f"nothing in the file ran): {reason}. normx unpickles weights only with torch's weights-only load; "
            f"save them as safetensors ({safetensors}), which needs no unpickling")


def _wants_own_code(exc: Exception) -> bool:
    """Whether transformers refused a load because it needs the folder's or repository's own code (its message
    asks for ``trust_remote_code=True``, which normx never passes)."""
    return isinstance(exc, ValueError) and "trust_remote_code" in str(exc)


def _own_code_message(what: str, source: str, exc: Exception) -> str:
    found = re.search(r"The repository (\S+) (?:contains|references) custom code", str(exc))
    if found is None:  # transformers' message without the place: the code is the source's or a model's it names
        needs = "a model's own Python code (its own, or that of a model it names)"
    else:
        needs = "its own Python code" if found.group(1) == source else f"the Python code in {found.group(1)}"
    return (f"could not load {what} from {source!r}: it needs {needs} (an auto_map in config.json or "
            "tokenizer_config.json names the files), and normx never runs a model's own code (trust_remote_code is "
            "always off; none of those files was imported). normx loads transformers' built-in architectures and "
            "tokenizers only")


def _load_peft(path: Path, task: str | None, kwargs: dict):
    from peft import PeftModel

    adapter_config = json.loads((path / "adapter_config.json").read_text())
    base_source = adapter_config.get("base_model_name_or_path")
    if not base_source:
        raise ModelLoadError(f"{path / 'adapter_config.json'} names no base_model_name_or_path")
    task = task or _PEFT_TASKS.get(adapter_config.get("task_type"))
    if (path / "config.json").is_file() and "config" not in kwargs:
        # the task model's config (labels, pad token) saved beside the adapter
        kwargs["config"] = transformers.AutoConfig.from_pretrained(path, trust_remote_code=False)
    base = _load_transformers(base_source, task, kwargs, head_from_adapter=True)
    weights = next((path / name for name in _ADAPTER_WEIGHTS if (path / name).is_file()), path)
    try:
        model = PeftModel.from_pretrained(base, str(path))
    except pickle.UnpicklingError as exc:  # a pickle that the safe (weights-only) load refuses
        raise ModelLoadError(_pickle_message(f"the adapter {weights}", exc, "adapter_model.safetensors")) from None
    except SafetensorError as exc:
        raise ModelLoadError(f"could not load the adapter {weights}: its safetensors weights are damaged ({exc})"
                             ) from None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        if _wants_own_code(exc):
            raise ModelLoadError(_own_code_message("the PEFT adapter", str(path), exc)) from None
        raise ModelLoadError(f"could not load the PEFT adapter in {path}: {exc}") from exc
    has_tokenizer = any((path / name).is_file() for name in _TOKENIZER_FILES)
    tokenizer = _load_tokenizer(str(path) if has_tokenizer else base_source, {} if has_tokenizer else kwargs)
    return model, tokenizer


def _ensure_pad(model, tokenizer) -> None:
    """Decoders often have no pad token; batching needs one (the EOS token is used, and told to the model)."""
    if tokenizer.pad_token_id is None and tokenizer.eos_token is not None:
        tokenizer.pad_token = tokenizer.eos_token
    config = model.config
    if getattr(config, "pad_token_id", None) is None and tokenizer.pad_token_id is not None:
        config.pad_token_id = tokenizer.pad_token_id
