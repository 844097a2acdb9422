"""Side by side: peers' attributions for what a causal LM writes (inseq, Captum, LXT's AttnLRP), scored on the SAME
generation steps with the SAME code as normx's own methods, and what all steps of one generation cost against one
plain forward pass (docs/generation.md, "Side by side with inseq, Captum and LXT").

Faithfulness: the prompt set and protocol of ``studies/generation/faithfulness.py`` (16 SST-2 + 12 BLiMP prompts,
6 greedy tokens each, the offline SmolLM2-135M-Instruct, 168 steps). Every peer gives, for every step, a score per
earlier token (studies/generation/peer_rows.py); :func:`normx.evaluation.generation.generation_faithfulness` scores
those rows itself (its ``rows`` argument: the peer's function of the protocol's generations), so deletion, ranking,
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
- ``lxt_attnlrp``: LXT 2.1 AttnLRP (``studies/parity/lxt_attnlrp.py``, run by ``score`` and ``cost`` with the Python
  of its own virtualenv, transformers 4.52, on a plain copy of the same model: ``export``).

The results file (``--out``, default docs/results/generation/peers.json; studies/generation/peer_results.py) is
keyed by method: ``score --methods A B`` and
``cost --methods A B`` add or replace only those entries, so a method added to normx later is scored without
rerunning the others. The steps (the generated ids) and the cost sequences are stored with the results, and a run
whose ids differ from them is refused (``--fresh`` drops every stored entry of that section instead).

    python -m studies.generation.peers export LXT_MODEL_DIR    # once: the model as a plain folder, for LXT
    python -m studies.generation.peers score [--methods NAME ...]  # default: every normx method that runs on the
                                                                   # model, and every peer
    python -m studies.generation.peers cost [--methods NAME ...] [--lengths 64 512]
    python -m studies.generation.peers table                   # the Markdown table of docs/generation.md
    python -m studies.generation.peers steps STEPS.json        # the steps alone (for running LXT by hand)
    LXT_PYTHON -m studies.parity.lxt_attnlrp rows LXT_MODEL_DIR STEPS.json ROWS.json
    python -m studies.generation.peers score --methods lxt_attnlrp --lxt ROWS.json   # rows computed by hand

Data: ``--data DIR`` or ``$NORMX_DATA``. LXT: ``--lxt-python`` / ``--lxt-model`` (or ``$NORMX_LXT_PYTHON`` /
``$NORMX_LXT_MODEL``).

``cost``: ~64 and 512 tokens (a prompt of SST-2 sentences and 32 generated tokens, teacher-forced), torch threads
= 1, each method and length in a fresh process (``studies/timing/peer_cost.py``: peak resident-set growth during
the first call, then interleaved timings against the plain forward pass).
"""


from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from studies.generation.peer_results import OUT, update_report
from studies.generation.peer_results import table as results_table
from studies.generation.peer_rows import (
    BASELINE,
    COST_LENGTHS,
    COST_NEW_TOKENS,
    COST_ROUNDS,
    LONG_CALL_S,
    MODES,
    NEW_TOKENS,
    NORMX_CANDIDATES,
    NORMX_OPTIONS,
    PEERS,
    captum_attribution,
    captum_input,
    inseq_attribute,
    inseq_model,
    lxt_rows,
    normx_methods,
    peer_rows,
)
from studies.settings import (
    INSTRUCTION,
    REPO,
    add_data_option,
    add_lxt_options,
    cpu_model,
    data_folder,
    lxt_command,
    now,
    provenance,
    version,
)


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
    from studies.generation.faithfulness import prompts

    return prompts(data)


def _generate(model, tokenizer, prompts: Sequence[str]):
    import normx

    return normx.explain_generation(model, tokenizer, list(prompts), max_new_tokens=NEW_TOKENS)


def steps(out_file: str, data: str | None = None) -> None:
    import normx

    model, tokenizer = normx.load_model("smollm2")
    prompts = _prompts(data_folder(data))
    generations = _generate(model, tokenizer, prompts)
    sequences = [{"prompt": p, "ids": list(g.token_ids), "prompt_length": g.prompt_length}
                 for p, g in zip(prompts, generations)]
    Path(out_file).write_text(json.dumps({"sequences": sequences}) + "\n")
    print(f"{len(sequences)} sequences, {sum(g.steps for g in generations)} steps -> {out_file}")


def score(methods: Sequence[str] | None, data: str | None, lxt_file: str | None, lxt_python: str | None,
          lxt_model: str | None, out: Path = OUT, fresh: bool = False) -> None:
    """Score each method on the protocol's steps and store its entry (see the module docstring)."""
    import torch

    import normx
    from normx.evaluation.generation import generation_faithfulness

    torch.manual_seed(0)
    torch.set_num_threads(1)
    model, tokenizer = normx.load_model("smollm2")
    prompts = _prompts(data_folder(data))
    generations = _generate(model, tokenizer, prompts)
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
    versions = {name: version(name) for name in ("normx", "torch", "transformers", "inseq", "captum")}
    update_report(out, "faithfulness", "setup", setup, {}, fresh=fresh)  # refuses other steps before any work
    for name in wanted:
        started = time.time()
        checks: dict = {}
        rows = {}
        if name in PEERS:
            lxt = lxt_rows(generations, lxt_file, lxt_python, lxt_model) if name == "lxt_attnlrp" else None

            def computed(protocol, name=name, lxt=lxt, checks=checks):  # the protocol's own generations
                found, seen = peer_rows(name, model, tokenizer, protocol, lxt)
                checks.update(seen)
                return found

            rows[name] = computed
        options = {} if name in PEERS else NORMX_OPTIONS.get(name, {})
        report = generation_faithfulness(model, tokenizer, prompts, [] if name in PEERS else [name],
                                         max_new_tokens=NEW_TOKENS, method_options={} if name in PEERS else
                                         {name: options}, progress=False, rows=rows)
        seconds = round(time.time() - started, 1)
        entry = {"kind": "peer" if name in PEERS else "normx", "about": PEERS.get(name, f"normx {name}"),
                 "options": options, "steps": report.steps, "ks": list(report.ks),
                 "aopc": report.aopc[name], "standard_error": {m: report.standard_error(name, m) for m in MODES},
                 "per_step": report.per_step[name], "curves": report.curves[name], "checks": checks,
                 "seconds": seconds, "versions": versions, "date": now(), "source": provenance(),
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
    """One method, one length, in this fresh process: JSON on stdout (studies/timing/peer_cost.py)."""
    import torch

    import normx
    from studies.timing.peer_cost import measure

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


def cost(methods: Sequence[str] | None, lengths: Sequence[str] | None, data: str | None, lxt_python: str | None,
         lxt_model: str | None, out: Path = OUT, fresh: bool = False) -> None:
    import normx

    model, tokenizer = normx.load_model("smollm2")
    sequences = cost_sequences(model, tokenizer, data_folder(data))
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
                    command = lxt_command(lxt_python, lxt_model, "cost", str(cost_file), length, str(COST_ROUNDS),
                                          str(LONG_CALL_S))
                else:
                    command = [sys.executable, "-m", "studies.generation.peers", "cost-worker", method, length,
                               str(cost_file)]
                done = subprocess.run(command, capture_output=True, text=True, cwd=REPO)
                if done.returncode:
                    print(done.stderr[-3000:], file=sys.stderr)
                    raise SystemExit(f"{method} at {length} tokens failed (exit {done.returncode})")
                result = {**json.loads(done.stdout.strip().splitlines()[-1]), "date": now(), "threads": 1,
                          "cpu": cpu_model(), "cpus": os.cpu_count(), "source": provenance()}
                update_report(out, "cost", "sequences", shared, {method: {length: result}}, merge=True)
                print(length, method, {k: result.get(k) for k in ("seconds", "forward_seconds", "ratio", "rounds",
                                                                 "peak_mib", "forward_peak_mib")}, flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("export").add_argument("directory")
    p = sub.add_parser("steps")
    p.add_argument("out_file")
    add_data_option(p)
    for name in ("score", "cost"):
        p = sub.add_parser(name)
        p.add_argument("--methods", nargs="+", help="only these (default: every normx method that runs on the "
                                                    "model, and every peer)")
        add_data_option(p)
        add_lxt_options(p)
        p.add_argument("--out", type=Path, default=OUT, help="the results file (JSON)")
        p.add_argument("--fresh", action="store_true", help="drop every stored entry of this section first")
    sub.choices["score"].add_argument("--lxt", help="LXT rows computed by hand "
                                                    "(python -m studies.parity.lxt_attnlrp rows)")
    sub.choices["cost"].add_argument("--lengths", nargs="+", choices=COST_LENGTHS)
    sub.add_parser("table").add_argument("--out", type=Path, default=OUT)
    p = sub.add_parser("cost-worker")
    for name in ("method", "length", "cost_file"):
        p.add_argument(name)
    args = parser.parse_args()
    if args.command == "table":
        print(results_table(args.out))
        return 0
    if args.command == "export":
        export(args.directory)
    elif args.command == "steps":
        steps(args.out_file, args.data)
    elif args.command == "score":
        score(args.methods, args.data, args.lxt, args.lxt_python, args.lxt_model, args.out, args.fresh)
    elif args.command == "cost":
        cost(args.methods, args.lengths, args.data, args.lxt_python, args.lxt_model, args.out, args.fresh)
    elif args.command == "table":
        print(results_table(args.out))
    else:
        cost_worker(args.method, args.length, args.cost_file)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
