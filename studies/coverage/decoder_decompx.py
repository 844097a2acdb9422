"""Which causal-LM architectures decoder DecompX decomposes exactly: every causal LM transformers lists, built tiny and
random from its own default config (tests/architectures.py), explained with ``decompx`` on two texts; a verdict per
class: "exact" (the shares plus the bias share equal the model's own logits: the worst ``decomposition_error`` is
printed), "refused" (normx's reason) or "error" (anything else: a bug to fix).

    python bench/decoder_decompx_coverage.py            # every causal LM of the installed transformers
    python bench/decoder_decompx_coverage.py LlamaForCausalLM GPT2LMHeadModel
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import architectures

import normx
from normx.errors import UnsupportedModelError


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
    torch.set_num_threads(1)
    only = set(sys.argv[1:])
    counts: dict[str, int] = {}
    for _, model_type, name in architectures.architectures("causal_lm"):
        if only and name not in only:
            continue
        kind, why = verdict(model_type, name)
        counts[kind] = counts.get(kind, 0) + 1
        print(f"{name}\t{kind}\t{why}", flush=True)
    print("\n" + ", ".join(f"{kind}: {n}" for kind, n in sorted(counts.items())))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
