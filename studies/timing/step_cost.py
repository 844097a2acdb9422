"""What every step of one generation costs a per-step method, with the method's options, against one plain forward
pass over the same tokens: the peers study's cost sequence (``studies/generation/peers.py cost``: SST-2 dev sentences
in the instruction prompt, SmolLM2's 32 greedy tokens, teacher-forced; 64 or 512 tokens) measured as that study
measures (``studies/timing/peer_cost.py``: peak resident-set growth during the first call over what it was just
before, time against the plain forward pass), one method per fresh process. For options the peers study does not
run, e.g. Integrated Gradients at 512 tokens with few points (its memory does not grow with the points: one point per
forward pass there; its time grows linearly with them):

    python -m studies.timing.step_cost integrated_gradients --length 512 --option n_steps=2 --out ig512.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from studies.settings import add_data_option, add_out_option, data_folder

REPO = Path(__file__).resolve().parents[2]
LONG_CALL_S, ROUNDS = 20.0, 3  # as the peers study: a first call over 20 s is the timing itself


def _option(text: str) -> tuple[str, object]:
    name, _, value = text.partition("=")
    try:
        return name, json.loads(value)
    except json.JSONDecodeError:
        return name, value


def worker(method: str, options: dict, cost_file: str, length: str) -> dict:
    import torch

    import normx
    from studies.timing.peer_cost import measure

    torch.set_num_threads(1)
    model, tokenizer = normx.load_model("smollm2")
    seq = json.loads(Path(cost_file).read_text())[length]
    ids, p = seq["ids"], seq["prompt_length"]
    tensor = torch.tensor([ids])

    def forward():
        with torch.no_grad():
            return model(input_ids=tensor, attention_mask=torch.ones_like(tensor))

    def all_steps():
        return normx.explain_generation(model, tokenizer, seq["prompt"], method=method, target=ids[p:], **options)

    return {"method": method, "options": options, "tokens": len(ids), "prompt_tokens": p,
            **measure(all_steps, forward, ROUNDS, LONG_CALL_S)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("method")
    parser.add_argument("--length", default="512", choices=("64", "512"))
    parser.add_argument("--option", action="append", default=[], metavar="NAME=VALUE", help="a method option")
    parser.add_argument("--worker", default=None, metavar="COST_FILE", help=argparse.SUPPRESS)
    add_data_option(parser)
    add_out_option(parser, "the result (JSON), also printed")
    args = parser.parse_args()
    options = dict(_option(text) for text in args.option)
    if args.worker:
        print(json.dumps(worker(args.method, options, args.worker, args.length)))
        return 0
    import normx
    from studies.generation.peers import cost_sequences

    model, tokenizer = normx.load_model("smollm2")
    sequences = cost_sequences(model, tokenizer, data_folder(args.data))
    del model
    with tempfile.TemporaryDirectory() as tmp:
        cost_file = Path(tmp) / "cost_sequences.json"
        cost_file.write_text(json.dumps(sequences) + "\n")
        command = [sys.executable, "-m", "studies.timing.step_cost", args.method, "--length", args.length,
                   "--worker", str(cost_file), *(f"--option={text}" for text in args.option)]
        done = subprocess.run(command, capture_output=True, text=True, cwd=REPO,
                              env={**os.environ, "OMP_NUM_THREADS": "1"})
    if done.returncode:
        print(done.stderr[-3000:], file=sys.stderr)
        return done.returncode
    result = json.loads(done.stdout.strip().splitlines()[-1])
    text = json.dumps(result, indent=1)
    print(text)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
