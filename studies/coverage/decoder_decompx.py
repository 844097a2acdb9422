"""Which causal-LM architectures decoder DecompX decomposes exactly: every causal LM transformers lists, built tiny and
random from its own default config (tests/architectures.py), explained with ``decompx`` on two texts; a verdict per
class: "exact" (the shares plus the bias share equal the model's own logits: the worst ``decomposition_error`` is
printed), "refused" (normx's reason) or "error" (anything else: a bug to fix).

    python -m studies.coverage.decoder_decompx            # every causal LM of the installed transformers
    python -m studies.coverage.decoder_decompx LlamaForCausalLM GPT2LMHeadModel
    python -m studies.coverage.decoder_decompx --out decompx.tsv   # the lines also written there

The tiny models are the tests' own builder (tests/architectures.py).
"""

from __future__ import annotations

import argparse

import torch

import normx
from normx.errors import UnsupportedModelError
from studies.settings import Printed, add_out_option
from tests import architectures


def verdict(model_type: str, name: str) -> tuple[str, str]:
    try:
        model = architectures.build(model_type, name, "causal_lm")
    except Exception as exc:  # transformers cannot build its own shrunk config
        return "not built", str(exc).splitlines()[0][:100]
    tok = architectures.word_tokenizer(model, "causal_lm")
    texts = architectures.reference_texts(model, "causal_lm")[:2]
    try:
        explained = normx.explain(model, tok, texts, method="decompx")
    except UnsupportedModelError as exc:
        return "refused", str(exc)[:200]
    except Exception as exc:
        return "error", f"{type(exc).__name__}: {str(exc)[:200]}"
    scale = 0.0
    for text in texts:
        with torch.no_grad():
            scale = max(scale, float(model(**tok(text, return_tensors="pt")).logits[0, -1].abs().max()))
    worst = max(max(e.diagnostics["decomposition_error"]) for e in explained)
    return "exact", f"decomposition error {worst:.1e} (logits up to {scale:.2g})"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("classes", nargs="*", help="only these classes")
    add_out_option(parser, "the printed lines, also written to this file")
    args = parser.parse_args()
    say = Printed(args.out)
    torch.set_num_threads(1)
    only = set(args.classes)
    counts: dict[str, int] = {}
    for _, model_type, name in architectures.architectures("causal_lm"):
        if only and name not in only:
            continue
        kind, why = verdict(model_type, name)
        counts[kind] = counts.get(kind, 0) + 1
        say(f"{name}\t{kind}\t{why}")
    say("\n" + ", ".join(f"{kind}: {n}" for kind, n in sorted(counts.items())))
    say.save()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
