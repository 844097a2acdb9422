"""Side by side: peers' attributions for what a causal LM writes (inseq, Captum, LXT's AttnLRP), scored on the SAME
generation steps with the SAME code as normx's own methods, and what all steps of one generation cost against one
plain forward pass (docs/generation.md, "Side by side with inseq, Captum and LXT").

Faithfulness: the prompt set and protocol of ``bench/generation_faithfulness.py`` (16 SST-2 + 12 BLiMP prompts,
6 greedy tokens each, the offline SmolLM2-135M-Instruct, 168 steps). Every peer gives, for every step, a score per
earlier token; :func:`score_rows` feeds those rows to :func:`normx.evaluation.generation.generation_faithfulness`
itself (its call of ``explain_generation`` answered with the given rows for the peers' names), so deletion, ranking,
the probabilities and AOPC are normx's own code, on the ids normx generated (checked against the ids each peer saw).

Peers (all teacher-forced on normx's greedy continuation, each with its own defaults):

- ``inseq_attention``: inseq 0.7.1 ``attention`` (eager attention), its default aggregation (mean over heads, then
  over layers);
- ``inseq_input_x_gradient``: inseq ``input_x_gradient``, its default target (the generated token's probability)
  and aggregation (L2 norm over the embedding dimensions, each step's column normalised to sum 1);
- ``captum_gradient_x_activation``: Captum ``LLMGradientAttribution(LayerGradientXActivation(model, embeddings))``
  (target: the log-probability of the generated token; Captum's signed sum over the embedding dimensions), one call
  per step on the step's prefix so that earlier generated tokens get scores too (one call with the whole
  continuation computes the same gradients but returns the prompt's columns only; checked equal there);
- ``lxt_attnlrp``: LXT 2.1 AttnLRP (``bench/lxt_attnlrp.py``, run by ``score`` and ``cost`` with the Python of its
  own virtualenv, transformers 4.52, on a plain copy of the same model: ``export``).

The results file (docs/results/generation/peers.json) is keyed by method: ``score --methods A B`` and
``cost --methods A B`` add or replace only those entries, so a method added to normx later is scored without
rerunning the others. The steps (the generated ids) and the cost sequences are stored with the results, and a run
whose ids differ from them is refused (``--fresh`` drops every stored entry of that section instead).

    python bench/generation_peers.py export /work/lxt-model        # once: the model as a plain folder, for LXT
    python bench/generation_peers.py score [--methods NAME ...]    # default: every normx method that runs on the
                                                                   # model, and every peer
    python bench/generation_peers.py cost [--methods NAME ...] [--lengths 64 512]
    python bench/generation_peers.py table                         # the Markdown table of docs/generation.md
    python bench/generation_peers.py steps STEPS.json [DATA_DIR]   # the steps alone (for running LXT by hand)
    /work/lxt-venv/bin/python bench/lxt_attnlrp.py rows /work/lxt-model STEPS.json ROWS.json
    python bench/generation_peers.py score --methods lxt_attnlrp --lxt ROWS.json   # rows computed by hand

``cost``: ~64 and 512 tokens (a prompt of SST-2 sentences and 32 generated tokens, teacher-forced), torch threads
= 1, each method and length in a fresh process (``bench/peer_cost.py``: peak resident-set growth during the first
call, then interleaved timings against the plain forward pass).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import fcntl
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from unittest import mock

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "results" / "generation" / "peers.json"
DATA = ROOT.parent / "shared" / "data"
LXT_PYTHON, LXT_MODEL = "/work/lxt-venv/bin/python", "/work/lxt-model"
NEW_TOKENS = 6
COST_NEW_TOKENS = 32
COST_LENGTHS = ("64", "512")  # total tokens (prompt + 32 generated), at most
COST_ROUNDS, LONG_CALL_S = 3, 20.0  # timed rounds after the first call, unless that call took longer than this
# normx's methods, in table order: bench/generation_faithfulness.py's and the decoder methods being added; those not
# registered, or refused by the model (UnsupportedModelError), are left out of a default run
NORMX_CANDIDATES = ("normxlogit", "gradient_x_input", "integrated_gradients", "attention", "norm_attention",
                    "decompx", "alti_logit", "attnlrp", "recency", "random")
NORMX_OPTIONS = {"integrated_gradients": {"n_steps": 16}}  # as bench/generation_faithfulness.py
PEERS = {
    "inseq_attention": "inseq 0.7.1 attention: mean over heads, then layers (its default aggregation)",
    "inseq_input_x_gradient": "inseq 0.7.1 input_x_gradient: target p(token), L2 over the embedding (its defaults)",
    "captum_gradient_x_activation": "Captum LLMGradientAttribution(LayerGradientXActivation(embeddings)): target "
                                    "log p(token), signed sum over the embedding",
    "lxt_attnlrp": "LXT 2.1 AttnLRP (lxt.efficient.monkey_patch, transformers 4.52): target logit, "
                   "relevance = embedding x modified gradient, summed",
}
BASELINE = "recency"
MODES = ("comprehensiveness", "sufficiency")
INSTRUCTION = "Review: {sentence}\nIs this review positive or negative? Answer:"


# ---- scoring external rows with normx's own code -------------------------------------------------------------------
class _Rows:
    """What ``generation_faithfulness`` reads of an explained generation: ``rows()[t]``, step t's scores."""

    def __init__(self, rows: Sequence[np.ndarray]):
        self._rows = [np.asarray(r, dtype=np.float64) for r in rows]

    def rows(self) -> list[np.ndarray]:
        return self._rows


def score_rows(model, tokenizer, prompts: Sequence[str], external: Mapping[str, Sequence[Sequence[np.ndarray]]],
               continuations: Sequence[Sequence[int]], normx_methods: Sequence[str] = (), *, max_new_tokens: int,
               method_options: Mapping[str, Mapping] | None = None, progress: bool = False):
    """:func:`normx.evaluation.generation.generation_faithfulness` over ``normx_methods`` and the externally computed
    rows: ``external[name][i][t]`` is the score of each of the p tokens before generated token t of prompt i (p =
    its index), computed on ``continuations[i]``. The protocol's own generation must give those continuations (else
    an error); its ``explain_generation`` answers for these names with the given rows, everything else is its own."""
    from normx.errors import InvalidInputError
    from normx.evaluation import generation

    real = generation.explain_generation
    prompt_lengths = [len(tokenizer(p)["input_ids"]) for p in prompts]

    def explain(model, tokenizer, prompts, method="normxlogit", *args, target=None, **kwargs):
        if method not in external:
            return real(model, tokenizer, prompts, method, *args, target=target, **kwargs)
        if [list(t) for t in target] != [list(c) for c in continuations]:
            raise InvalidInputError(f"{method}: the rows were computed on other continuations than the ones the "
                                    "protocol generated")
        out = []
        for i, (rows, cont) in enumerate(zip(external[method], continuations)):
            start = prompt_lengths[i]
            if len(rows) != len(cont) or any(len(r) != start + t for t, r in enumerate(rows)):
                raise InvalidInputError(f"{method}, prompt {i}: give one row per generated token, row t with "
                                        f"{start} + t scores")
            if not all(np.isfinite(np.asarray(r, dtype=np.float64)).all() for r in rows):
                raise InvalidInputError(f"{method}, prompt {i}: the rows hold NaN or infinite scores")
            out.append(_Rows(rows))
        return out

    names = [*normx_methods, *external]
    with mock.patch.object(generation, "explain_generation", explain):
        return generation.generation_faithfulness(model, tokenizer, prompts, names, max_new_tokens=max_new_tokens,
                                                  method_options=method_options, progress=progress)


def paired(values: Sequence[float], baseline: Sequence[float]) -> tuple[float, float]:
    """Mean and standard error of the per-step differences ``values - baseline``."""
    diff = np.asarray(values, dtype=np.float64) - np.asarray(baseline, dtype=np.float64)
    if diff.size < 2:
        return float(diff.mean()), float("nan")
    return float(diff.mean()), float(diff.std(ddof=1) / np.sqrt(diff.size))


# ---- the peers' rows -----------------------------------------------------------------------------------------------
def normx_methods(model, tokenizer, wanted: Sequence[str] = NORMX_CANDIDATES) -> tuple[list[str], dict[str, str]]:
    """Those of ``wanted`` that normx has and that explain a generation of this model (tried on a two-token
    generation), and why each other one was left out."""
    import normx
    from normx.errors import UnsupportedModelError

    usable, left_out = [], {}
    registered = normx.list_methods()
    for method in wanted:
        if method not in registered:
            left_out[method] = "not registered in normx"
            continue
        try:
            normx.explain_generation(model, tokenizer, "The film was", method=method, max_new_tokens=2,
                                     **NORMX_OPTIONS.get(method, {}))
        except UnsupportedModelError as error:
            left_out[method] = f"UnsupportedModelError: {error}"[:300]
            continue
        usable.append(method)
    return usable, left_out


@contextlib.contextmanager
def _attention_implementation(model, name: str):
    before = model.config._attn_implementation
    model.set_attn_implementation(name)
    try:
        yield
    finally:
        model.set_attn_implementation(before)


def inseq_model(model, tokenizer, method: str):
    import inseq

    return inseq.load_model(model, method, tokenizer=tokenizer)


def inseq_attribute(wrapped, model, tokenizer, ids: Sequence[int], prompt_length: int, method: str, **kwargs):
    """inseq's attribution of every generated token of ``ids`` (teacher forcing: ``attribute(prompt text, prompt +
    continuation text)``): the raw sequence attribution, the ids inseq attributed, and whether the text had to be
    held to ``ids``. inseq takes texts only and re-tokenises them; where the decoded text reads back as other ids
    (e.g. two generated "\\n" tokens as one "\\n\\n"), its ``encode`` of that text is given ``ids`` instead (its own
    baseline rule applied to them), so that it attributes the same steps; everything else is inseq's own."""
    import torch

    prompt = tokenizer.decode(ids[:prompt_length])
    full = tokenizer.decode(ids)
    real = wrapped.encode
    held = []

    def encode(texts, *args, **options):
        batch = real(texts, *args, **options)
        if texts in (full, [full]) and batch.input_ids[0].tolist() != list(ids):  # inseq's BatchEncoding
            held.append(True)
            exact = torch.tensor([list(ids)], device=batch.input_ids.device)
            batch.input_ids, batch.attention_mask = exact, torch.ones_like(exact)
            batch.input_tokens = [wrapped._convert_ids_to_tokens(exact[0], skip_special_tokens=False)]
            if batch.baseline_ids is not None:  # inseq's rule: unk, eos kept
                eos = wrapped.eos_token_id
                batch.baseline_ids = torch.where(exact.eq(eos), eos, wrapped.tokenizer.unk_token_id)
        return batch

    implementation = "eager" if method == "attention" else model.config._attn_implementation  # inseq reads weights
    with _attention_implementation(model, implementation), mock.patch.object(wrapped, "encode", encode):
        out = wrapped.attribute(prompt, full, show_progress=False, **kwargs)
    attribution = out.sequence_attributions[0]
    return attribution, [token.id for token in attribution.target], bool(held)


def inseq_rows(attribution, prompt_length: int, steps: int, raw_l1: bool = False) -> list[np.ndarray]:
    """Step t's row: column t of inseq's token x step matrix at the p + t positions before the token. inseq's
    default aggregation (``aggregate()``), or (``raw_l1``, for comparing with normx) the L1 norm of the raw
    per-dimension attributions."""
    if raw_l1:
        matrix = attribution.target_attributions.abs().sum(-1)
    else:
        matrix = attribution.aggregate().target_attributions
    matrix = matrix.float().numpy()
    if matrix.shape[1] != steps:
        raise ValueError(f"inseq gave {matrix.shape[1]} steps, not {steps}")
    return [matrix[:prompt_length + t, t].astype(np.float64) for t in range(steps)]


def captum_attribution(model, tokenizer):
    from captum.attr import LayerGradientXActivation, LLMGradientAttribution

    return LLMGradientAttribution(LayerGradientXActivation(model, model.get_input_embeddings()), tokenizer)


def captum_input(tokenizer, ids: Sequence[int]):
    """Captum's ``TextTokenInput`` holding exactly ``ids`` (not a re-tokenisation of their text)."""
    import torch
    from captum.attr import TextTokenInput

    inp = TextTokenInput(tokenizer.decode(ids), tokenizer)
    inp.inp_tensor = inp.itp_tensor = torch.tensor([list(ids)])
    inp.values = tokenizer.convert_ids_to_tokens(list(ids))
    inp.n_itp_features = len(ids)
    return inp


def captum_rows(attribution, tokenizer, ids: Sequence[int], prompt_length: int) -> list[np.ndarray]:
    import torch

    rows = []
    for p in range(prompt_length, len(ids)):
        out = attribution.attribute(captum_input(tokenizer, ids[:p]), target=torch.tensor([ids[p]]))
        rows.append(out.token_attr[0].float().numpy().astype(np.float64))
    return rows


def lxt_rows(generations, lxt_file: str | None, lxt_python: str, lxt_model: str) -> dict:
    """LXT's rows for the generations: read from ``lxt_file``, or computed by ``bench/lxt_attnlrp.py rows`` with
    ``lxt_python`` (LXT's own virtualenv) on ``lxt_model``; checked to be for the same ids."""
    ids = [list(g.token_ids) for g in generations]
    if lxt_file is None:
        if not Path(lxt_python).exists() or not Path(lxt_model).exists():
            raise SystemExit(f"lxt_attnlrp needs LXT's Python ({lxt_python}) and the exported model ({lxt_model}): "
                             "see bench/lxt_attnlrp.py, or give --lxt ROWS.json")
        with tempfile.TemporaryDirectory() as tmp:
            steps_file, rows_file = Path(tmp) / "steps.json", Path(tmp) / "rows.json"
            steps_file.write_text(json.dumps({"sequences": [{"ids": i, "prompt_length": g.prompt_length}
                                                            for i, g in zip(ids, generations)]}) + "\n")
            subprocess.run([lxt_python, str(Path(__file__).with_name("lxt_attnlrp.py")), "rows", lxt_model,
                            str(steps_file), str(rows_file)], check=True)
            lxt = json.loads(rows_file.read_text())
    else:
        lxt = json.loads(Path(lxt_file).read_text())
    if lxt["ids"] != ids:
        raise SystemExit("the LXT rows were computed on other ids than this run generated")
    return lxt


def peer_rows(name: str, model, tokenizer, generations, lxt: Mapping | None = None) -> tuple[list, dict]:
    """A peer's rows for every step of ``generations``, and checks: the ids it saw, inseq against normx's own
    computations, Captum's per-step rows against its one call, LXT's conservation."""
    import torch

    import normx

    checks: dict = {}
    if name.startswith("inseq_"):
        method = name.removeprefix("inseq_")
        wrapped = inseq_model(model, tokenizer, method)
        rows, mismatched, held = [], [], []
        for i, g in enumerate(generations):
            attribution, seen, was_held = inseq_attribute(wrapped, model, tokenizer, g.token_ids, g.prompt_length,
                                                          method)
            mismatched += [i] if seen != list(g.token_ids) else []
            held += [i] if was_held else []
            rows.append(inseq_rows(attribution, g.prompt_length, g.steps))
        if mismatched:
            raise SystemExit(f"{name}: inseq attributed other ids than normx generated for prompts {mismatched}")
        checks["prompts_whose_text_retokenises_differently_ids_held"] = held
        continuations = [g.token_ids[g.prompt_length:] for g in generations]
        if method == "attention":  # the same reading as normx's attention (mean over heads and blocks)
            ours = normx.explain_generation(model, tokenizer, [g.prompt for g in generations], method="attention",
                                            target=continuations)
            checks["max_abs_diff_vs_normx_attention"] = max(
                float(np.abs(mine - theirs).max()) for o, r in zip(ours, rows) for mine, theirs in zip(o.rows(), r))
        else:  # with the logit as target and L1: normx's gradient_x_input
            diffs = []
            for g in generations[:4]:
                attribution, _, _ = inseq_attribute(wrapped, model, tokenizer, g.token_ids, g.prompt_length, method,
                                                    attributed_fn="logit")
                ours = normx.explain_generation(model, tokenizer, g.prompt, method="gradient_x_input",
                                                target=g.token_ids[g.prompt_length:]).rows()
                theirs = inseq_rows(attribution, g.prompt_length, g.steps, raw_l1=True)
                diffs += [float(np.abs(m - t).max() / np.abs(m).max()) for m, t in zip(ours, theirs)]
            checks["logit_target_l1_vs_normx_gradient_x_input_max_rel_diff_first_4_prompts"] = max(diffs)
        return rows, checks
    if name == "captum_gradient_x_activation":
        attribution = captum_attribution(model, tokenizer)
        rows = [captum_rows(attribution, tokenizer, g.token_ids, g.prompt_length) for g in generations]
        first = generations[0]
        whole = attribution.attribute(captum_input(tokenizer, first.token_ids[:first.prompt_length]),
                                      target=torch.tensor(first.token_ids[first.prompt_length:])).token_attr
        checks["per_step_vs_one_call_max_abs_diff_prompt_columns_first_prompt"] = max(
            float(np.abs(whole[t].numpy() - row[:first.prompt_length]).max()) for t, row in enumerate(rows[0]))
        return rows, checks
    if name == "lxt_attnlrp":
        if lxt is None:
            raise SystemExit("lxt_attnlrp: no LXT rows given")
        ratios = np.array([s / logit for sums, logits in zip(lxt["relevance_sums"], lxt["logits"])
                           for s, logit in zip(sums, logits)])
        checks = {"versions": lxt["versions"], "relevance_sum_over_target_logit": {
            "mean": float(ratios.mean()), "median": float(np.median(ratios)), "min": float(ratios.min()),
            "max": float(ratios.max()), "steps": int(ratios.size)}}
        return lxt["rows"], checks
    raise SystemExit(f"unknown peer {name!r}; peers: {', '.join(PEERS)}")


# ---- the results file ----------------------------------------------------------------------------------------------
@contextlib.contextmanager
def _locked(path: Path):
    """Exclusive access to the results file while an entry is read, merged and written (other sessions add their
    methods' entries with the same commands)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(Path(tempfile.gettempdir()) / "normx_generation_peers.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def read_report(path: Path = OUT) -> dict:
    return json.loads(path.read_text()) if path.exists() else {}


def update_report(path: Path, section: str, shared_key: str, shared, entries: Mapping[str, dict],
                  fresh: bool = False, merge: bool = False) -> None:
    """Store ``entries`` (method -> entry) in ``report[section]["methods"]``, leaving every other method's entry
    as it is (``merge``: update the method's stored entry with the given keys instead of replacing it).
    ``report[section][shared_key]`` (the steps, or the cost sequences) must equal ``shared``: entries measured on
    other inputs are not mixed (``fresh``: drop the section's stored entries instead)."""
    with _locked(path):
        report = read_report(path)
        part = report.setdefault(section, {})
        if fresh:
            part.clear()
        if part.get(shared_key) is not None and part[shared_key] != shared:
            raise SystemExit(f"{path}: the stored {section} entries were measured on other {shared_key} than this "
                             "run's; rerun every method with --fresh, or find why the ids changed")
        part[shared_key] = shared
        stored = part.setdefault("methods", {})
        for name, entry in entries.items():
            stored[name] = {**stored.get(name, {}), **entry} if merge else entry
        temporary = path.with_suffix(".json.tmp")
        temporary.write_text(json.dumps(report, indent=1) + "\n")
        os.replace(temporary, path)


def _version(name: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return None


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


def provenance() -> dict:
    """The commit normx ran from, and the files under normx/ that differed from it (others edit the tree)."""
    def git(*args: str) -> str:
        done = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True)
        return done.stdout if done.returncode == 0 else ""

    return {"commit": git("rev-parse", "HEAD").strip(),
            "uncommitted_normx_files": sorted(line[3:] for line in git("status", "--porcelain", "--", "normx")
                                              .splitlines())}


def cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "unknown"


# ---- commands ------------------------------------------------------------------------------------------------------
def export(directory: str) -> None:
    """The offline SmolLM2 as a plain float32 folder (``save_pretrained`` + tokenizer) for LXT's transformers 4.52:
    the GGUF-loaded model refuses ``save_pretrained`` (marked quantized), so its weights go into a fresh
    LlamaForCausalLM first; ``rope_theta`` is written the 4.x way as well."""
    import torch
    import transformers

    import normx

    model, tokenizer = normx.load_model("smollm2")
    config = model.config.to_dict()
    config.pop("quantization_config", None)
    plain = transformers.LlamaForCausalLM(transformers.LlamaConfig.from_dict(config)).eval()
    plain.load_state_dict(model.state_dict(), strict=True)
    ids = torch.tensor([tokenizer("The capital of France is")["input_ids"]])
    with torch.no_grad():
        assert torch.equal(plain(ids).logits, model(ids).logits)
    plain.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    path = Path(directory) / "config.json"
    saved = json.loads(path.read_text())
    saved["rope_theta"] = (saved.get("rope_parameters") or {}).get("rope_theta", saved.get("rope_theta"))
    path.write_text(json.dumps(saved, indent=2) + "\n")
    print(f"saved to {directory}")


def _prompts(data: Path) -> list[str]:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from generation_faithfulness import prompts

    return prompts(data)


def _generate(model, tokenizer, prompts: Sequence[str]):
    import normx

    return normx.explain_generation(model, tokenizer, list(prompts), max_new_tokens=NEW_TOKENS)


def steps(out_file: str, data: str | None = None) -> None:
    import normx

    model, tokenizer = normx.load_model("smollm2")
    prompts = _prompts(Path(data) if data else DATA)
    generations = _generate(model, tokenizer, prompts)
    sequences = [{"prompt": p, "ids": list(g.token_ids), "prompt_length": g.prompt_length}
                 for p, g in zip(prompts, generations)]
    Path(out_file).write_text(json.dumps({"sequences": sequences}) + "\n")
    print(f"{len(sequences)} sequences, {sum(g.steps for g in generations)} steps -> {out_file}")


def score(methods: Sequence[str] | None, data: str | None, lxt_file: str | None, lxt_python: str, lxt_model: str,
          out: Path = OUT, fresh: bool = False) -> None:
    """Score each method on the protocol's steps and store its entry (see the module docstring)."""
    import torch

    import normx

    torch.manual_seed(0)
    torch.set_num_threads(1)
    model, tokenizer = normx.load_model("smollm2")
    prompts = _prompts(Path(data) if data else DATA)
    generations = _generate(model, tokenizer, prompts)
    continuations = [g.token_ids[g.prompt_length:] for g in generations]
    setup = {"prompts": prompts, "ids": [list(g.token_ids) for g in generations],
             "prompt_lengths": [g.prompt_length for g in generations], "max_new_tokens": NEW_TOKENS,
             "model": "smollm2 (SmolLM2-135M-Instruct, GGUF Q4_1 dequantised to float32)"}
    if methods:
        ours = [m for m in methods if m not in PEERS]
        usable, left_out = normx_methods(model, tokenizer, ours)
        if left_out:
            raise SystemExit(f"cannot score {left_out}")
        wanted = [*usable, *[m for m in methods if m in PEERS]]
    else:
        usable, left_out = normx_methods(model, tokenizer)
        for method, why in left_out.items():
            print(f"left out {method}: {why}", flush=True)
        core = [m for m in usable if m in NORMX_CANDIDATES[:5] or m in (BASELINE, "random")]
        wanted = [*core, *PEERS, *[m for m in usable if m not in core]]  # the methods being added last
    versions = {name: _version(name) for name in ("normx", "torch", "transformers", "inseq", "captum")}
    update_report(out, "faithfulness", "setup", setup, {}, fresh=fresh)  # refuses other steps before any work
    for name in wanted:
        started = time.time()
        external, checks = {}, {}
        if name in PEERS:
            lxt = lxt_rows(generations, lxt_file, lxt_python, lxt_model) if name == "lxt_attnlrp" else None
            external[name], checks = peer_rows(name, model, tokenizer, generations, lxt)
        options = {} if name in PEERS else NORMX_OPTIONS.get(name, {})
        report = score_rows(model, tokenizer, prompts, external, continuations, [] if name in PEERS else [name],
                            max_new_tokens=NEW_TOKENS, method_options={name: options}, progress=False)
        seconds = round(time.time() - started, 1)
        entry = {"kind": "peer" if name in PEERS else "normx", "about": PEERS.get(name, f"normx {name}"),
                 "options": options, "steps": report.steps, "ks": list(report.ks),
                 "aopc": report.aopc[name], "standard_error": {m: report.standard_error(name, m) for m in MODES},
                 "per_step": report.per_step[name], "curves": report.curves[name], "checks": checks,
                 "seconds": seconds, "versions": versions, "date": _now(), "source": provenance(),
                 "threads": torch.get_num_threads(), "cpu": cpu_model()}
        update_report(out, "faithfulness", "setup", setup, {name: entry})
        cells = ", ".join(f"{m} {entry['aopc'][m]:.3f} ± {entry['standard_error'][m]:.3f}" for m in MODES)
        print(f"{name}: {cells} ({report.steps} steps, {seconds} s) {json.dumps(checks)}", flush=True)


# ---- cost ----------------------------------------------------------------------------------------------------------
def cost_sequences(model, tokenizer, data: Path) -> dict:
    """For each length L: a prompt of SST-2 dev sentences (instruction-wrapped; in file order, each added while
    the prompt stays within L - 32 tokens, until it has at least L - 36), and the model's 32 greedy tokens after
    it."""
    import normx
    from normx.data import glue

    sentences = [e.text.strip() for e in glue.load("sst2", "dev", data)]
    out = {}
    for length in COST_LENGTHS:
        chosen, prompt, most = [], "", int(length) - COST_NEW_TOKENS
        for sentence in sentences:
            trial = INSTRUCTION.format(sentence=" ".join([*chosen, sentence]))
            size = len(tokenizer(trial)["input_ids"])
            if size <= most:
                chosen, prompt = [*chosen, sentence], trial
                if size >= most - 4:
                    break
        g = normx.explain_generation(model, tokenizer, prompt, max_new_tokens=COST_NEW_TOKENS,
                                     gen_args={"min_new_tokens": COST_NEW_TOKENS})
        out[length] = {"prompt": prompt, "ids": list(g.token_ids), "prompt_length": g.prompt_length}
    return out


def cost_worker(method: str, length: str, cost_file: str) -> None:
    """One method, one length, in this fresh process: JSON on stdout (bench/peer_cost.py)."""
    import torch

    import normx

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from peer_cost import measure

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model, tokenizer = normx.load_model("smollm2")
    seq = json.loads(Path(cost_file).read_text())[length]
    ids, p = seq["ids"], seq["prompt_length"]
    tensor = torch.tensor([ids])

    def forward():
        with torch.no_grad():
            return model(input_ids=tensor, attention_mask=torch.ones_like(tensor))

    if method.startswith("inseq_"):
        inner = method.removeprefix("inseq_")
        wrapped = inseq_model(model, tokenizer, inner)

        def all_steps():
            return inseq_attribute(wrapped, model, tokenizer, ids, p, inner)
    elif method == "captum_gradient_x_activation":
        attribution = captum_attribution(model, tokenizer)

        def all_steps():  # Captum's own call: the whole continuation as target, one attribution per token
            return attribution.attribute(captum_input(tokenizer, ids[:p]), target=torch.tensor(ids[p:]))
    elif method in normx.list_methods():
        options = NORMX_OPTIONS.get(method, {})

        def all_steps():
            return normx.explain_generation(model, tokenizer, seq["prompt"], method=method, target=ids[p:],
                                            **options)
    else:
        raise SystemExit(f"unknown method {method!r}")
    print(json.dumps(measure(all_steps, forward, COST_ROUNDS, LONG_CALL_S)))


def cost(methods: Sequence[str] | None, lengths: Sequence[str] | None, data: str | None, lxt_python: str,
         lxt_model: str, out: Path = OUT, fresh: bool = False) -> None:
    import normx

    model, tokenizer = normx.load_model("smollm2")
    sequences = cost_sequences(model, tokenizer, Path(data) if data else DATA)
    wanted = list(methods) if methods else [*normx_methods(model, tokenizer)[0], *PEERS]
    del model
    shared = {k: {"tokens": len(v["ids"]), "prompt_tokens": v["prompt_length"], "ids": v["ids"]}
              for k, v in sequences.items()}
    update_report(out, "cost", "sequences", shared, {}, fresh=fresh)  # refuses other sequences before any work
    with tempfile.TemporaryDirectory() as tmp:
        cost_file = Path(tmp) / "cost_sequences.json"
        cost_file.write_text(json.dumps(sequences) + "\n")
        for method in wanted:
            for length in lengths or COST_LENGTHS:
                if method == "lxt_attnlrp":
                    command = [lxt_python, str(Path(__file__).with_name("lxt_attnlrp.py")), "cost", lxt_model,
                               str(cost_file), length, str(COST_ROUNDS), str(LONG_CALL_S)]
                else:
                    command = [sys.executable, __file__, "cost-worker", method, length, str(cost_file)]
                done = subprocess.run(command, capture_output=True, text=True)
                if done.returncode:
                    print(done.stderr[-3000:], file=sys.stderr)
                    raise SystemExit(f"{method} at {length} tokens failed (exit {done.returncode})")
                result = {**json.loads(done.stdout.strip().splitlines()[-1]), "date": _now(), "threads": 1,
                          "cpu": cpu_model(), "cpus": os.cpu_count(), "source": provenance()}
                update_report(out, "cost", "sequences", shared, {method: {length: result}}, merge=True)
                print(length, method, {k: result.get(k) for k in ("seconds", "forward_seconds", "ratio", "rounds",
                                                                 "peak_mib", "forward_peak_mib")}, flush=True)


# ---- the table -----------------------------------------------------------------------------------------------------
def _order(names) -> list[str]:
    known = [*NORMX_CANDIDATES, *PEERS]
    return sorted(names, key=lambda n: (known.index(n) if n in known else len(known), n))


def _figure(value: float) -> str:
    return f"{value:.2f}" if value < 10 else f"{value:.1f}" if value < 100 else f"{value:.0f}"


def table(path: Path = OUT) -> str:
    """The Markdown table of docs/generation.md from the results file: AOPC (± standard error over the steps),
    the paired per-step difference from recency, and what all steps cost at each length."""
    report = read_report(path)
    faith = report.get("faithfulness", {}).get("methods", {})
    cost = report.get("cost", {})
    results = cost.get("methods", {})
    lengths = [length for length in COST_LENGTHS if any(length in r for r in results.values())]
    head = ["method", "comprehensiveness ↑", "sufficiency ↓", f"comp. − {BASELINE}", f"suff. − {BASELINE}"]
    for length in lengths:
        tokens = cost["sequences"][length]["tokens"]
        head += [f"{tokens} tok: × forward (s)", f"{tokens} tok: peak MiB"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    base = faith.get(BASELINE)
    for method in _order(set(faith) | set(results)):
        entry = faith.get(method)
        cells = [f"`{method}`"]
        if entry is None:
            cells += ["—"] * 4
        else:
            cells += [f"{entry['aopc'][m]:.3f} ± {entry['standard_error'][m]:.3f}" for m in MODES]
            for mode in MODES:
                if base is None or method == BASELINE:
                    cells.append("—")
                else:
                    mean, se = paired(entry["per_step"][mode], base["per_step"][mode])
                    cells.append(f"{mean:+.3f} ± {se:.3f}".replace("-", "−"))
        for length in lengths:
            r = results.get(method, {}).get(length)
            cells += ["—", "—"] if r is None else [f"{_figure(r['ratio'])} ({_figure(r['seconds'])})",
                                                   f"{r['peak_mib']:.0f}"]
        lines.append("| " + " | ".join(cells) + " |")
    if faith:
        steps = {e["steps"] for e in faith.values()}
        lines += ["", f"AOPC ± standard error over the {'/'.join(map(str, sorted(steps)))} steps; "
                     f"comp. / suff. − {BASELINE}: the mean per-step difference from {BASELINE} ± its standard "
                     "error (comprehensiveness: positive is better; sufficiency: negative is better)."]
    for length in lengths:
        measured = [r[length] for r in results.values() if length in r]
        seconds = [r["forward_seconds"] for r in measured]
        peaks = [r["forward_peak_mib"] for r in measured]
        lines.append(f"{cost['sequences'][length]['tokens']} tokens ({cost['sequences'][length]['prompt_tokens']} "
                     f"prompt + {COST_NEW_TOKENS} generated): one plain forward pass {min(seconds):.3f}–"
                     f"{max(seconds):.3f} s, peak {min(peaks):.0f}–{max(peaks):.0f} MiB across the methods' "
                     "processes.")
    machines = sorted({(r["cpu"], r["cpus"], r["threads"]) for by in results.values() for r in by.values()
                       if "cpu" in r})
    dates = sorted({r["date"][:10] for by in results.values() for r in by.values() if "date" in r}
                   | {e["date"][:10] for e in faith.values() if "date" in e})
    for cpu, cpus, threads in machines:
        lines.append(f"Cost measured on {cpu} ({cpus} CPUs), torch threads = {threads}.")
    if dates:
        lines.append(f"Measured {' – '.join(dict.fromkeys([dates[0], dates[-1]]))}.")
    import textwrap

    return "\n".join(line if line.startswith("|") else textwrap.fill(line, 120, break_on_hyphens=False)
                     for line in lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("export").add_argument("directory")
    p = sub.add_parser("steps")
    p.add_argument("out_file")
    p.add_argument("data", nargs="?")
    for name in ("score", "cost"):
        p = sub.add_parser(name)
        p.add_argument("--methods", nargs="+", help="only these (default: every normx method that runs on the "
                                                    "model, and every peer)")
        p.add_argument("--data", help=f"data folder (default {DATA})")
        p.add_argument("--lxt-python", default=LXT_PYTHON)
        p.add_argument("--lxt-model", default=LXT_MODEL)
        p.add_argument("--out", type=Path, default=OUT)
        p.add_argument("--fresh", action="store_true", help="drop every stored entry of this section first")
    sub.choices["score"].add_argument("--lxt", help="LXT rows computed by hand (bench/lxt_attnlrp.py rows)")
    sub.choices["cost"].add_argument("--lengths", nargs="+", choices=COST_LENGTHS)
    sub.add_parser("table").add_argument("--out", type=Path, default=OUT)
    p = sub.add_parser("cost-worker")
    for name in ("method", "length", "cost_file"):
        p.add_argument(name)
    args = parser.parse_args()
    if args.command == "export":
        export(args.directory)
    elif args.command == "steps":
        steps(args.out_file, args.data)
    elif args.command == "score":
        score(args.methods, args.data, args.lxt, args.lxt_python, args.lxt_model, args.out, args.fresh)
    elif args.command == "cost":
        cost(args.methods, args.lengths, args.data, args.lxt_python, args.lxt_model, args.out, args.fresh)
    elif args.command == "table":
        print(table(args.out))
    else:
        cost_worker(args.method, args.length, args.cost_file)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
