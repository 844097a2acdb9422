"""AttnLRP (Achtibat et al., ICML 2024) with LXT 2.1's efficient implementation, on the generation steps that
``studies/generation/peers.py`` scores: for every step (prefix = prompt + the tokens generated before it, target = the
logit of the generated token at the prefix's last position), the relevance of every prefix token = the sum over the
embedding dimensions of input embedding × its (LRP-modified) gradient, after ``lxt.efficient.monkey_patch`` of
transformers' Llama module, as LXT's README shows. One backward pass per step.

LXT 2.1 imports only under transformers <= 4.5x, so this runs in its own virtualenv (docs/generation.md), from the
repository root (it imports no normx module; the output file is its ``--out``):

    python3 -m venv LXT_VENV
    LXT_VENV/bin/pip install torch==2.13.0 'transformers==4.52.4'
    LXT_VENV/bin/pip install --no-deps lxt zennit
    python -m studies.generation.peers export LXT_MODEL       # (normx's venv) the model as a plain folder
    LXT_VENV/bin/python -m studies.parity.lxt_attnlrp rows LXT_MODEL STEPS.json ROWS.json
    LXT_VENV/bin/python -m studies.parity.lxt_attnlrp cost LXT_MODEL COST.json LENGTH ROUNDS [LONG_CALL_S]

(``studies.generation.peers score`` and ``cost`` and ``studies.parity.attnlrp`` run these commands themselves, given
``--lxt-python LXT_VENV/bin/python --lxt-model LXT_MODEL``; ``cost`` prints JSON.)

``lxt.efficient`` imports ``torchvision.models.vision_transformer`` at import time for its ViT patches; PyPI's
torchvision wheels are CUDA builds that cannot load with the CPU torch (``operator torchvision::nms does not
exist``), so while lxt is imported an empty stand-in module takes that name (the Llama patches never touch it).

Input: ``{"sequences": [{"ids": [...], "prompt_length": p}, ...]}``. Output rows: per sequence, per step t (the token
at index p + t), a list of p + t relevances; with each step's target logit and relevance sum (their ratio: how much
of the logit the relevances conserve).
"""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path

import torch
import transformers
from transformers.models.llama import modeling_llama


def _import_lxt():
    stand_in = {name: types.ModuleType(name)
                for name in ("torchvision", "torchvision.models", "torchvision.models.vision_transformer")}
    stand_in["torchvision.models.vision_transformer"].nn = torch.nn
    absent = [name for name in stand_in if name not in sys.modules]
    sys.modules.update({name: stand_in[name] for name in absent})
    try:
        import lxt
        from lxt.efficient import monkey_patch
    finally:
        for name in absent:
            sys.modules.pop(name, None)
    return lxt, monkey_patch


def load(model_dir: str):
    lxt, monkey_patch = _import_lxt()
    monkey_patch(modeling_llama)  # AttnLRP rules for Llama (lxt.efficient.models.llama.attnLRP), before loading
    model = modeling_llama.LlamaForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32).eval()
    for param in model.parameters():
        param.requires_grad_(False)
    versions = {"lxt": getattr(lxt, "__version__", None) or _dist_version("lxt"), "torch": torch.__version__,
                "transformers": transformers.__version__}
    return model, versions


def _dist_version(name: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return None


def step_relevance(model, ids: list[int], p: int) -> tuple[list[float], float]:
    """(relevance of each of the p tokens before index p, the target logit) for generating ``ids[p]``."""
    prefix = torch.tensor([ids[:p]])
    embeds = model.get_input_embeddings()(prefix).detach().requires_grad_(True)
    logits = model(inputs_embeds=embeds, use_cache=False).logits
    target = logits[0, -1, ids[p]]
    target.backward()
    relevance = (embeds.grad * embeds).float().sum(-1)[0]
    return relevance.tolist(), float(target.detach())


def all_steps(model, ids: list[int], prompt_length: int) -> tuple[list[list[float]], list[float]]:
    rows, logits = [], []
    for p in range(prompt_length, len(ids)):
        row, logit = step_relevance(model, ids, p)
        rows.append(row)
        logits.append(logit)
    return rows, logits


def rows(model_dir: str, steps_file: str, out_file: str) -> None:
    torch.manual_seed(0)
    model, versions = load(model_dir)
    sequences = json.loads(Path(steps_file).read_text())["sequences"]
    out = {"ids": [seq["ids"] for seq in sequences], "rows": [], "logits": [], "relevance_sums": [],
           "versions": versions}
    for n, seq in enumerate(sequences):
        rel, logits = all_steps(model, seq["ids"], seq["prompt_length"])
        out["rows"].append(rel)
        out["logits"].append(logits)
        out["relevance_sums"].append([sum(r) for r in rel])
        print(f"\r{n + 1}/{len(sequences)}", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)
    Path(out_file).write_text(json.dumps(out) + "\n")


def cost(model_dir: str, cost_file: str, length: str, rounds: str, long_call_s: str = "inf") -> None:
    from studies.timing.peer_cost import measure

    torch.set_num_threads(1)
    model, versions = load(model_dir)
    seq = json.loads(Path(cost_file).read_text())[length]
    ids = torch.tensor([seq["ids"]])

    def forward():
        with torch.no_grad():
            return model(input_ids=ids, attention_mask=torch.ones_like(ids))

    result = measure(lambda: all_steps(model, seq["ids"], seq["prompt_length"]), forward, int(rounds),
                     float(long_call_s))
    print(json.dumps({**result, "versions": versions}))


if __name__ == "__main__":
    commands = {"rows": rows, "cost": cost}
    if len(sys.argv) < 2 or sys.argv[1] not in commands:
        raise SystemExit(__doc__)
    commands[sys.argv[1]](*sys.argv[2:])
