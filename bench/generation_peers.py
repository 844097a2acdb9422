"""Side by side, one run: peers' attributions for what a causal LM writes (inseq, Captum, LXT's AttnLRP), scored on
the SAME generation steps with the SAME code as normx's own methods, and what all steps of one prompt cost against
one plain forward pass (docs/generation.md, "Side by side with inseq, Captum and LXT").

Faithfulness: the prompt set and protocol of ``bench/generation_faithfulness.py`` (16 SST-2 + 12 BLiMP prompts,
6 greedy tokens each, the offline SmolLM2-135M-Instruct). Every peer gives, for every step, a score per earlier
token; :func:`score_rows` feeds those rows to :func:`normx.evaluation.generation.generation_faithfulness` itself (its
call of ``explain_generation`` answered with the given rows for the peers' names), so deletion, ranking, the
probabilities and AOPC are normx's own code, on the ids normx generated (checked against the ids each peer saw).

Peers (all teacher-forced on normx's greedy continuation):

- ``inseq_attention``: inseq 0.7.1 ``attention`` (eager attention), its default aggregation (mean over heads, then
  over layers);
- ``inseq_input_x_gradient``: inseq ``input_x_gradient`` with its default target (the generated token's
  probability), L1 over the embedding dimensions (as normx's ``gradient_x_input``);
- ``captum_gradient_x_activation``: Captum ``LLMGradientAttribution(LayerGradientXActivation(model, embeddings))``
  (target: the log-probability of the generated token; Captum's signed sum over the embedding dimensions), one call
  per step on the step's prefix so that earlier generated tokens get scores too (one call with the whole
  continuation computes the same gradients but returns the prompt's columns only);
- ``lxt_attnlrp``: LXT 2.1 AttnLRP (``bench/lxt_attnlrp.py``, its own virtualenv with transformers 4.52).

    python bench/generation_peers.py export /work/lxt-model                 # the model as a plain folder, for LXT
    python bench/generation_peers.py steps /tmp/peer_steps.json [DATA_DIR]  # the prompts' generated ids
    /work/lxt-venv/bin/python bench/lxt_attnlrp.py rows /work/lxt-model /tmp/peer_steps.json /tmp/lxt_rows.json
    python bench/generation_peers.py score --lxt /tmp/lxt_rows.json [--data DATA_DIR]
    python bench/generation_peers.py cost [--lxt-python /work/lxt-venv/bin/python] [--lxt-model /work/lxt-model]

``score`` and ``cost`` write their parts of docs/results/generation/peers.json; ``table`` prints the Markdown
table of docs/generation.md from it. ``cost``: ~64 and ~512 tokens (a
prompt of SST-2 sentences and 32 generated tokens), torch threads = 1, each method in a fresh process
(``bench/peer_cost.py``: peak resident-set growth, interleaved timings).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from unittest import mock

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "results" / "generation" / "peers.json"
NEW_TOKENS = 6
COST_NEW_TOKENS = 32
COST_LENGTHS = {"64": 3, "512": 0}  # total tokens -> timed rounds after the first call (0: the first call)
NORMX_WANTED = ("normxlogit", "gradient_x_input", "attention", "norm_attention", "recency", "random")
PEERS = ("inseq_attention", "inseq_input_x_gradient", "captum_gradient_x_activation", "lxt_attnlrp")
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

    def explain(model, tokenizer, prompts, method="normxlogit", *args, target=None, **kwargs):
        if method not in external:
            return real(model, tokenizer, prompts, method, *args, target=target, **kwargs)
        if [list(t) for t in target] != [list(c) for c in continuations]:
            raise InvalidInputError(f"{method}: the rows were computed on other continuations than the ones the "
                                    "protocol generated")
        out = []
        for i, (rows, cont) in enumerate(zip(external[method], continuations)):
            start = len(real_prompt_ids[i])
            if len(rows) != len(cont) or any(len(r) != start + t for t, r in enumerate(rows)):
                raise InvalidInputError(f"{method}, prompt {i}: give one row per generated token, row t with "
                                        f"{start} + t scores")
            out.append(_Rows(rows))
        return out

    real_prompt_ids = [tokenizer(p)["input_ids"] for p in prompts]
    names = [*normx_methods, *external]
    with mock.patch.object(generation, "explain_generation", explain):
        return generation.generation_faithfulness(model, tokenizer, prompts, names, max_new_tokens=max_new_tokens,
                                                  method_options=method_options, progress=progress)


# ---- the peers' rows -----------------------------------------------------------------------------------------------
def normx_methods() -> list[str]:
    import normx

    return [m for m in NORMX_WANTED if m in normx.list_methods()]


def _sdpa_back(model) -> None:
    model.set_attn_implementation("sdpa")


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

    if method == "attention":
        model.set_attn_implementation("eager")  # inseq reads attention weights from the outputs
    try:
        with mock.patch.object(wrapped, "encode", encode):
            out = wrapped.attribute(prompt, full, show_progress=False, **kwargs)
    finally:
        if method == "attention":
            _sdpa_back(model)
    attribution = out.sequence_attributions[0]
    return attribution, [token.id for token in attribution.target], bool(held)


def inseq_rows(attribution, method: str, prompt_length: int, steps: int) -> list[np.ndarray]:
    if method == "attention":
        matrix = attribution.aggregate().target_attributions  # [T, steps]: inseq's default aggregation
    else:
        matrix = attribution.target_attributions.abs().sum(-1)  # [T, steps, d] -> L1 over the embedding dims
    matrix = matrix.float().numpy()
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
    prompts = _prompts(Path(data) if data else ROOT.parent / "shared" / "data")
    generations = _generate(model, tokenizer, prompts)
    sequences = [{"prompt": p, "ids": list(g.token_ids), "prompt_length": g.prompt_length}
                 for p, g in zip(prompts, generations)]
    Path(out_file).write_text(json.dumps({"sequences": sequences}) + "\n")
    print(f"{len(sequences)} sequences, {sum(g.steps for g in generations)} steps -> {out_file}")


def _write(section: str, value) -> None:
    report = json.loads(OUT.read_text()) if OUT.exists() else {}
    report[section] = value
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(report, indent=1) + "\n")


def _peer_rows(model, tokenizer, generations, lxt_file: str | None) -> tuple[dict, dict]:
    """Every peer's rows for every step, and checks: ids the peers saw, inseq (logit target) vs normx's
    gradient_x_input, Captum per-step rows vs its one call with the whole continuation, LXT's conservation."""
    import torch

    import normx

    external, checks = {}, {}
    for method in ("attention", "input_x_gradient"):
        wrapped = inseq_model(model, tokenizer, method)
        name, rows, mismatched, held = f"inseq_{method}", [], [], []
        started = time.time()
        for i, g in enumerate(generations):
            attribution, seen, was_held = inseq_attribute(wrapped, model, tokenizer, g.token_ids, g.prompt_length,
                                                          method)
            if seen != list(g.token_ids):
                mismatched.append(i)
            if was_held:
                held.append(i)
            rows.append(inseq_rows(attribution, method, g.prompt_length, g.steps))
        if mismatched:
            raise SystemExit(f"{name}: inseq attributed other ids than normx generated for prompts {mismatched}")
        external[name] = rows
        checks[name] = {"prompts_whose_text_retokenises_differently_ids_held": held,
                        "seconds": round(time.time() - started, 1)}
        if method == "input_x_gradient":  # the same method with the logit as target: normx's gradient_x_input
            diffs = []
            for g in generations[:4]:
                attribution, _, _ = inseq_attribute(wrapped, model, tokenizer, g.token_ids, g.prompt_length, method,
                                                    attributed_fn="logit")
                ours = normx.explain_generation(model, tokenizer, g.prompt, method="gradient_x_input",
                                                target=g.token_ids[g.prompt_length:]).rows()
                for mine, theirs in zip(ours, inseq_rows(attribution, method, g.prompt_length, g.steps)):
                    diffs.append(float(np.abs(mine - theirs).max() / np.abs(mine).max()))
            checks[name]["logit_target_vs_normx_gradient_x_input_max_rel_diff"] = max(diffs)
    attribution = captum_attribution(model, tokenizer)
    started = time.time()
    external["captum_gradient_x_activation"] = [captum_rows(attribution, tokenizer, g.token_ids, g.prompt_length)
                                                for g in generations]
    first = generations[0]
    whole = attribution.attribute(captum_input(tokenizer, first.token_ids[:first.prompt_length]),
                                  target=torch.tensor(first.token_ids[first.prompt_length:])).token_attr
    diff = max(float(np.abs(whole[t].numpy() - row[:first.prompt_length]).max())
               for t, row in enumerate(external["captum_gradient_x_activation"][0]))
    checks["captum_gradient_x_activation"] = {"seconds": round(time.time() - started, 1),
                                              "per_step_vs_one_call_max_abs_diff_prompt_columns": diff}
    if lxt_file:
        lxt = json.loads(Path(lxt_file).read_text())
        external["lxt_attnlrp"] = lxt["rows"]
        ratios = np.array([s / logit for sums, logits in zip(lxt["relevance_sums"], lxt["logits"])
                           for s, logit in zip(sums, logits)])
        checks["lxt_attnlrp"] = {"versions": lxt["versions"], "conservation_ratio_mean": float(ratios.mean()),
                                 "conservation_ratio_median": float(np.median(ratios)),
                                 "conservation_ratio_min": float(ratios.min()),
                                 "conservation_ratio_max": float(ratios.max()), "steps": int(ratios.size)}
    return external, checks


def score(lxt_file: str | None, data: str | None) -> None:
    import torch

    import normx

    torch.manual_seed(0)
    model, tokenizer = normx.load_model("smollm2")
    prompts = _prompts(Path(data) if data else ROOT.parent / "shared" / "data")
    started = time.time()
    generations = _generate(model, tokenizer, prompts)
    if lxt_file and json.loads(Path(lxt_file).read_text())["ids"] != [list(g.token_ids) for g in generations]:
        raise SystemExit("the LXT rows were computed on other ids than this run generated")
    external, checks = _peer_rows(model, tokenizer, generations, lxt_file)
    ours = normx_methods()
    continuations = [g.token_ids[g.prompt_length:] for g in generations]
    report = score_rows(model, tokenizer, prompts, external, continuations, ours, max_new_tokens=NEW_TOKENS,
                        progress=True)
    seconds = round(time.time() - started)
    print(report.table())
    print(f"\n{report.prompts} prompts, {report.steps} steps, {seconds} s")
    print(json.dumps(checks, indent=1))
    versions = {name: _version(name) for name in ("normx", "torch", "transformers", "inseq", "captum")}
    _write("faithfulness", {**report.to_dict(), "checks": checks, "seconds": seconds, "versions": versions,
                            "standard_errors": {m: {mode: report.standard_error(m, mode)
                                                    for mode in ("comprehensiveness", "sufficiency")}
                                                for m in report.methods},
                            "prompts_used": prompts})


def _version(name: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return None


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


def cost_worker(method: str, length: str, rounds: str, cost_file: str) -> None:
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

    if method in NORMX_WANTED:
        def all_steps():
            return normx.explain_generation(model, tokenizer, seq["prompt"], method=method, target=ids[p:])
    elif method.startswith("inseq_"):
        inner = method.removeprefix("inseq_")
        wrapped = inseq_model(model, tokenizer, inner)

        def all_steps():
            return inseq_attribute(wrapped, model, tokenizer, ids, p, inner)
    elif method == "captum_gradient_x_activation":
        attribution = captum_attribution(model, tokenizer)

        def all_steps():  # Captum's own call: the whole continuation as target, one attribution per token
            return attribution.attribute(captum_input(tokenizer, ids[:p]), target=torch.tensor(ids[p:]))
    else:
        raise SystemExit(f"unknown method {method!r}")
    print(json.dumps(measure(all_steps, forward, int(rounds))))


def cost(lxt_python: str | None, lxt_model: str, data: str | None, methods: Sequence[str] | None,
         lengths: Sequence[str] | None) -> None:
    import normx

    model, tokenizer = normx.load_model("smollm2")
    sequences = cost_sequences(model, tokenizer, Path(data) if data else ROOT.parent / "shared" / "data")
    del model
    cost_file = Path("/tmp/normx_peer_cost.json")
    cost_file.write_text(json.dumps(sequences) + "\n")
    report = json.loads(OUT.read_text()).get("cost", {}) if OUT.exists() else {}
    report.setdefault("results", {})
    report["sequences"] = {k: {"tokens": len(v["ids"]), "prompt_tokens": v["prompt_length"],
                               "steps": len(v["ids"]) - v["prompt_length"]} for k, v in sequences.items()}
    report["threads"] = 1
    wanted = list(methods or [*normx_methods(), *PEERS])
    for length in lengths or COST_LENGTHS:
        rounds = str(COST_LENGTHS[length])
        for method in wanted:
            if method == "lxt_attnlrp":
                if not lxt_python:
                    continue
                command = [lxt_python, str(Path(__file__).with_name("lxt_attnlrp.py")), "cost", lxt_model,
                           str(cost_file), length, rounds]
            else:
                command = [sys.executable, __file__, "cost-worker", method, length, rounds, str(cost_file)]
            done = subprocess.run(command, capture_output=True, text=True)
            if done.returncode:
                result = {"error": done.stderr.strip().splitlines()[-1:]}
            else:
                result = json.loads(done.stdout.strip().splitlines()[-1])
            report["results"].setdefault(length, {})[method] = result
            print(length, method, {k: result.get(k) for k in ("seconds", "forward_seconds", "ratio", "peak_mib",
                                                             "forward_peak_mib", "error")}, flush=True)
            _write("cost", report)


def table() -> str:
    """The Markdown table of docs/generation.md from peers.json: AOPC (± standard error over the steps) and cost."""
    report = json.loads(OUT.read_text())
    faith, cost = report.get("faithfulness", {}), report.get("cost", {})
    results = cost.get("results", {})
    lengths = [length for length in COST_LENGTHS if length in results]
    head = ["method", "comprehensiveness AOPC ↑", "sufficiency AOPC ↓"]
    for length in lengths:
        tokens = cost["sequences"][length]["tokens"]
        head += [f"all steps ÷ 1 forward, {tokens} tokens", f"peak MiB, {tokens} tokens"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for method in faith.get("methods", []):
        cells = [method] + [f"{faith['aopc'][method][mode]:.3f} ± {faith['standard_errors'][method][mode]:.3f}"
                            for mode in ("comprehensiveness", "sufficiency")]
        for length in lengths:
            r = results[length].get(method, {})
            cells += ["—", "—"] if "ratio" not in r else [f"{r['ratio']:.1f} ({r['seconds']:.2f} s)",
                                                          f"{r['peak_mib']:.0f}"]
        lines.append("| " + " | ".join(cells) + " |")
    for length in lengths:
        forwards = [r["forward_peak_mib"] for r in results[length].values() if "forward_peak_mib" in r]
        seconds = [r["forward_seconds"] for r in results[length].values() if "forward_seconds" in r]
        lines.append(f"\n{cost['sequences'][length]['tokens']} tokens: one plain forward pass "
                     f"{min(seconds):.3f}–{max(seconds):.3f} s, peak {min(forwards):.0f}–{max(forwards):.0f} MiB "
                     "across the methods' processes")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("export").add_argument("directory")
    p = sub.add_parser("steps")
    p.add_argument("out_file")
    p.add_argument("data", nargs="?")
    p = sub.add_parser("score")
    p.add_argument("--lxt", help="LXT rows (bench/lxt_attnlrp.py rows)")
    p.add_argument("--data")
    p = sub.add_parser("cost")
    p.add_argument("--lxt-python", default="/work/lxt-venv/bin/python")
    p.add_argument("--lxt-model", default="/work/lxt-model")
    p.add_argument("--data")
    p.add_argument("--methods", nargs="*")
    p.add_argument("--lengths", nargs="*", choices=list(COST_LENGTHS))
    sub.add_parser("table")
    p = sub.add_parser("cost-worker")
    for name in ("method", "length", "rounds", "cost_file"):
        p.add_argument(name)
    args = parser.parse_args()
    if args.command == "export":
        export(args.directory)
    elif args.command == "steps":
        steps(args.out_file, args.data)
    elif args.command == "score":
        score(args.lxt, args.data)
    elif args.command == "cost":
        cost(args.lxt_python if Path(args.lxt_python).exists() else None, args.lxt_model, args.data, args.methods,
             args.lengths)
    elif args.command == "table":
        print(table())
    else:
        cost_worker(args.method, args.length, args.rounds, args.cost_file)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
