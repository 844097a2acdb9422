"""Check normx's DecompX against the official DecompX code (Modarressi et al., ACL 2023; mohsenfayyaz/DecompX).

Not part of the test suite (pytest collects only ``test_*.py``) and not run by CI: a one-off reproducible check
that needs a second virtual environment with the official code's old transformers.

What it checks, on the ``minilm-sst2`` preset (all-MiniLM-L6-v2 + LoRA, merged into a plain
BertForSequenceClassification so both sides run the very same weights) and the first ``--n`` sentences of the
SST-2 dev set:

- the official demo configuration (``DecompX_Colab_Demo.ipynb``: biases "absdot", LN1, FFN "GeLU_ZO", LN2,
  vector aggregation, classifier with pooler, tanh "ZO") against normx's default, and the variants that normx also
  has: ``bias_decomp_type`` "norm" / "equal" (normx ``bias_rule``) and ``include_biases=False``;
- per configuration: each token's contribution to the predicted class at the last layer (what the demo shows,
  ``decompx_last_layer_outputs.classifier``), the contributions to every class, and the [CLS] row of the
  aggregated decomposition vectors at every layer (``decompx_all_layers_outputs.aggregated``; the demo asks for
  their norms, ``output_aggregated="norm"``: here "vector", the same computation, so the vectors can be compared);
- the logits, the predicted class and the token ids of both sides.

Setup (CPU; the official code needs transformers 4.17 / 4.18, whose ``tokenizers<0.13`` has no wheel for Python
3.11, so transformers is installed without it and the official side tokenizes with the slow, pure-Python
BertTokenizer; ``compare`` checks the ids match normx's)::

    python3.11 -m venv /tmp/decompx_check/venv
    /tmp/decompx_check/venv/bin/pip install torch==2.13.0
    /tmp/decompx_check/venv/bin/pip install --no-deps transformers==4.18.0
    /tmp/decompx_check/venv/bin/pip install "numpy<2" huggingface-hub==0.5.1 filelock packaging pyyaml regex \
        requests sacremoses tqdm
    # the official code; only src/ is needed (this check used commit b6bddf0b185f729c029b08d0f37108a5fcc85a4c):
    git clone https://github.com/mohsenfayyaz/DecompX /tmp/decompx_check/official
    git -C /tmp/decompx_check/official checkout b6bddf0b185f729c029b08d0f37108a5fcc85a4c

Run from the repository root (the first and last with the project venv, the second with the one above, the
official checkout on its PYTHONPATH); ``--out`` is the folder for the merged model and the .npz files, ``--data``
the data folder (or ``$NORMX_DATA``; its sst2/dev.tsv is read)::

    .venv/bin/python -m studies.parity.decompx_official normx --out /tmp/decompx_check
    PYTHONPATH=/tmp/decompx_check/official /tmp/decompx_check/venv/bin/python -m studies.parity.decompx_official \
        official --out /tmp/decompx_check --official-dir /tmp/decompx_check/official
    .venv/bin/python -m studies.parity.decompx_official compare --out /tmp/decompx_check

``normx`` writes ``normx.npz`` and the merged model (``minilm-sst2-merged/``, with a ``pytorch_model.bin`` and a
``vocab.txt`` that transformers 4.18 can read); ``official`` writes ``official_bs{batch}.npz`` (``--batch-size``,
default 10, padded batches as in the demo; ``--batch-size 1`` for no padding); ``compare`` prints the table
(``--official-file`` / ``--normx-file`` pick the files). ``normx --fast-ffn`` (writes ``normx_fastffn.npz``) forces
the per-target FFN path that normx takes for "absdot" only on long texts (2 x tokens >= hidden size, 192 tokens for
MiniLM), so that path is compared on the same short sentences. On a shared 2-core CPU: ``normx`` ~10 min,
``normx --fast-ffn`` ~10 min, ``official`` ~3 min (batch 10) / ~6 min (batch 1), ``compare`` seconds.

Result with the commit above, transformers 4.18.0 and torch 2.13.0 (50 sentences, 1207 tokens): every
configuration agrees to float32 rounding (max abs difference <= 6.5e-6 on the class contributions, <= 2.8e-5 on the
[CLS] vectors, same predictions), both batch sizes and both FFN paths.
"""

from __future__ import annotations

import argparse
import csv
import json
from pathlib import Path

import numpy as np

from studies.settings import add_data_option, data_folder

MERGED = "minilm-sst2-merged"
# name: (normx options, the official DecompXConfig fields that differ from the demo's)
CONFIGS = {
    "absdot (default / demo)": ({"include_biases": True, "bias_rule": "absdot"},
                                {"include_biases": True, "bias_decomp_type": "absdot"}),
    "norm": ({"include_biases": True, "bias_rule": "norm"}, {"include_biases": True, "bias_decomp_type": "norm"}),
    "equal": ({"include_biases": True, "bias_rule": "equal"}, {"include_biases": True, "bias_decomp_type": "equal"}),
    "include_biases=False": ({"include_biases": False, "bias_rule": "absdot"},
                             {"include_biases": False, "bias_decomp_type": "absdot"}),
}
DEMO_CONFIG = {  # DecompX_Colab_Demo.ipynb, CONFIGS["DecompX"]; output_aggregated "norm" -> "vector" (see above)
    "include_biases": True, "bias_decomp_type": "absdot", "include_LN1": True, "include_FFN": True,
    "FFN_approx_type": "GeLU_ZO", "include_LN2": True, "aggregation": "vector", "include_classifier_w_pooler": True,
    "tanh_approx_type": "ZO", "output_all_layers": True, "output_attention": None, "output_res1": None,
    "output_LN1": None, "output_FFN": None, "output_res2": None, "output_encoder": None,
    "output_aggregated": "vector", "output_pooler": "norm", "output_classifier": True,
}


def read_sentences(path: Path, n: int) -> list[str]:
    with open(path, newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE))
    return [row["sentence"] for row in rows[:n]]


def key(name: str) -> str:
    return name.split(" ")[0].replace("=", "_")


def _pad(rows: list[np.ndarray], axis_len: int, axis: int) -> np.ndarray:
    """Stack arrays whose ``axis`` has different lengths, NaN-padded to ``axis_len``."""
    out = []
    for r in rows:
        width = [(0, 0)] * r.ndim
        width[axis] = (0, axis_len - r.shape[axis])
        out.append(np.pad(r.astype(np.float32), width, constant_values=np.nan))
    return np.stack(out)


# ---- normx side (project venv) ---------------------------------------------------------------------------------------

def save_merged(model, tok, folder: Path) -> None:
    """The merged model as transformers 5 saves it, plus what transformers 4.18 reads (.bin weights, vocab.txt)."""
    import torch

    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    torch.save({k: v.contiguous() for k, v in model.state_dict().items()}, folder / "pytorch_model.bin")
    vocab = sorted(tok.get_vocab().items(), key=lambda kv: kv[1])
    assert [i for _, i in vocab] == list(range(len(vocab))), "vocabulary ids are not contiguous"
    (folder / "vocab.txt").write_text("".join(t + "\n" for t, _ in vocab), encoding="utf-8")


def normx_scores(model, tok, sentences: list[str], opts: dict, batch: int) -> dict[str, np.ndarray]:
    """normx on ``sentences``: explain()'s predicted-class scores at every layer, and decompose()'s [CLS] vectors
    and all-class contributions at every layer."""
    import torch

    import normx
    from normx.methods.decompx import decompose

    label2id = model.config.label2id
    ex = normx.explain(model, tok, sentences, method="decompx", layer="all", batch_size=batch, **opts)
    layers = len(ex[0].layers)
    lengths = [len(e.tokens) for e in ex]
    longest = max(lengths)
    vectors, contributions = [], []
    for start in range(0, len(sentences), batch):
        enc = tok(sentences[start:start + batch], return_tensors="pt", padding=True)
        d = decompose(model, dict(enc), list(range(layers)), **opts)
        for b in range(d.vectors.shape[0]):
            real = enc["attention_mask"][b].bool()
            vectors.append(d.vectors[b][:, real].numpy())  # [layers, T, H]
            contributions.append(d.contributions[b][:, real].numpy())  # [layers, T, C]
    with torch.no_grad():
        enc = tok(sentences, return_tensors="pt", padding=True)
        logits = model(**enc).logits.float().numpy()
    return {
        "tokens": np.array(json.dumps([e.tokens for e in ex])),
        "pred": np.array([label2id[e.labels[0]] for e in ex]),
        "layers": np.array(ex[0].layers),
        "scores": _pad([e.scores[0] for e in ex], longest, 1),  # [N, layers, T] (explain, predicted class)
        "vectors": _pad(vectors, longest, 1),  # [N, layers, T, H]
        "contributions": _pad(contributions, longest, 1),  # [N, layers, T, C]
        "logits": logits,
        "error": np.array([float(e.diagnostics["decomposition_error"][0]) for e in ex]),
    }


def run_normx(args) -> None:
    import peft

    import normx
    import normx.methods.decompx.rules

    work = Path(args.work)
    sentences = read_sentences(Path(args.data), args.n)
    model, tok = normx.load_model("minilm-sst2")
    print("loaded:", type(model).__name__, type(tok).__name__)
    out = {"ids": np.array(json.dumps([tok(s)["input_ids"] for s in sentences]))}
    configs = dict(CONFIGS)
    if args.fast_ffn:  # the FFN path normx takes for absdot on long texts (sources * 2 >= hidden), on short ones
        normx.methods.decompx.rules.FAST_FFN_SOURCES = 10**9
        configs = {name: c for name, c in CONFIGS.items() if c[0]["bias_rule"] == "absdot"}
    else:
        peft_default = normx_scores(model, tok, sentences, CONFIGS["absdot (default / demo)"][0], args.batch_size)
        out["peft__scores"] = peft_default["scores"]
    assert isinstance(model, peft.PeftModel), type(model)
    model = model.merge_and_unload()
    print("merged:", type(model).__name__)
    if not args.fast_ffn:
        save_merged(model, tok, work / MERGED)
    for name, (opts, _) in configs.items():
        for field, value in normx_scores(model, tok, sentences, opts, args.batch_size).items():
            out[f"{key(name)}__{field}"] = value
        print(f"normx {name}: max decomposition_error {out[f'{key(name)}__error'].max():.2e}")
    path = work / ("normx_fastffn.npz" if args.fast_ffn else "normx.npz")
    np.savez(path, **out)
    print("wrote", path)


# ---- official side (second venv) -------------------------------------------------------------------------------------

def official_batch(model, enc, config) -> dict[str, np.ndarray]:
    """One padded batch through the official model, read out as the demo does."""
    import torch

    with torch.no_grad():
        model.eval()
        logits, _hidden, last, all_layers = model(**enc, output_attentions=False, return_dict=False,
                                                  output_hidden_states=True, decompx_config=config)
    return {
        "logits": logits.numpy(),
        "classifier": last.classifier.numpy(),  # [B, T, C]
        "pooler_norm": last.pooler[0].numpy(),  # [B, T]
        "vectors": np.stack([a[:, 0].numpy() for a in all_layers.aggregated], axis=1),  # [B, L, T(src), H]
    }


def run_official(args) -> None:
    work, official = Path(args.work), Path(args.official_dir).resolve()
    import torch
    import transformers

    try:
        import src.decompx_utils as official_utils  # the official code, on PYTHONPATH
    except ImportError:
        raise SystemExit(f"the official code is not importable: run with PYTHONPATH={official}") from None
    if official not in Path(official_utils.__file__).resolve().parents:
        raise SystemExit(f"src.decompx_utils comes from {official_utils.__file__}, not from {official}")
    from src.decompx_utils import DecompXConfig
    from src.modeling_bert import BertForSequenceClassification
    from transformers import BertTokenizer  # AutoTokenizer of 4.18 needs the tokenizers package

    print("transformers", transformers.__version__, "torch", torch.__version__, "official code at", official)
    sentences = read_sentences(Path(args.data), args.n)
    tok = BertTokenizer.from_pretrained(work / MERGED)
    model, info = BertForSequenceClassification.from_pretrained(work / MERGED, output_loading_info=True)
    print("tokenizer:", type(tok).__name__, "loading info:", info)
    assert not info["unexpected_keys"] and not info["mismatched_keys"], info
    assert set(info["missing_keys"]) <= {"bert.embeddings.position_ids"}, info
    out = {"ids": np.array(json.dumps([tok(s)["input_ids"] for s in sentences]))}
    for name, (_, fields) in CONFIGS.items():
        config = DecompXConfig(**{**DEMO_CONFIG, **fields})
        rows: dict[str, list[np.ndarray]] = {}
        for start in range(0, len(sentences), args.batch_size):
            enc = tok(sentences[start:start + args.batch_size], return_tensors="pt", padding=True)
            lengths = enc["attention_mask"].sum(-1).tolist()
            got = official_batch(model, enc, config)
            for b, n in enumerate(lengths):
                rows.setdefault("logits", []).append(got["logits"][b])
                rows.setdefault("classifier", []).append(got["classifier"][b, :n])
                rows.setdefault("pooler_norm", []).append(got["pooler_norm"][b, :n])
                rows.setdefault("vectors", []).append(got["vectors"][b, :, :n])
        longest = max(len(r) for r in rows["classifier"])
        out[f"{key(name)}__logits"] = np.stack(rows["logits"])
        out[f"{key(name)}__classifier"] = _pad(rows["classifier"], longest, 0)
        out[f"{key(name)}__pooler_norm"] = _pad(rows["pooler_norm"], longest, 0)
        out[f"{key(name)}__vectors"] = _pad(rows["vectors"], longest, 1)
        print("official", name, "done")
    path = work / f"official_bs{args.batch_size}.npz"
    np.savez(path, **out)
    print("wrote", path)


# ---- comparison (either venv: numpy only) ----------------------------------------------------------------------------

def _maxabs(a: np.ndarray, b: np.ndarray) -> float:
    assert a.shape == b.shape, (a.shape, b.shape)
    assert np.array_equal(np.isnan(a), np.isnan(b)), "the padding differs: token positions do not align"
    return float(np.nanmax(np.abs(a - b)))


def compare_config(nx, of, k: str) -> dict:
    """The differences for one configuration (official - normx)."""
    pred = nx[f"{k}__pred"]
    off = of[f"{k}__classifier"]  # [N, T, C]
    off_pred = np.take_along_axis(off, pred[:, None, None], axis=2)[..., 0]  # [N, T]
    mine = nx[f"{k}__scores"][:, -1]  # explain(), predicted class, last layer
    contributions = nx[f"{k}__contributions"][:, -1]  # decompose(), every class, last layer
    vec_n, vec_o = nx[f"{k}__vectors"][:, 1:], of[f"{k}__vectors"]  # layers 1..L
    per_layer = [_maxabs(vec_n[:, i], vec_o[:, i]) for i in range(vec_o.shape[1])]
    norms = [_maxabs(np.linalg.norm(vec_n[:, i], axis=-1), np.linalg.norm(vec_o[:, i], axis=-1))
             for i in range(vec_o.shape[1])]
    return {
        "pred_agree": int((of[f"{k}__logits"].argmax(-1) == pred).sum()),
        "logits": _maxabs(nx[f"{k}__logits"], of[f"{k}__logits"]),
        "pred_class": _maxabs(mine, off_pred),
        "pred_scale": float(np.nanmax(np.abs(off_pred))),
        "all_classes": _maxabs(contributions, off),
        "explain_vs_decompose": _maxabs(mine, np.take_along_axis(contributions, pred[:, None, None], 2)[..., 0]),
        "sum_official_minus_logit": float(np.abs(np.nansum(off, 1) - of[f"{k}__logits"]).max()),
        "vectors_per_layer": per_layer,
        "vector_scale": float(np.nanmax(np.abs(vec_o))),
        "cls_norms_per_layer": norms,
        "tokens": int((~np.isnan(mine)).sum()),
        # how far this configuration is from the default on the official side: what the check must resolve
        "official_vs_default": _maxabs(off_pred, np.take_along_axis(of["absdot__classifier"], pred[:, None, None],
                                                                    axis=2)[..., 0]),
    }


def run_compare(args) -> None:
    work = Path(args.work)
    nx = np.load(Path(args.normx_file) if args.normx_file else work / "normx.npz")
    of = np.load(Path(args.official_file) if args.official_file else work / "official_bs10.npz")
    ids_n, ids_o = json.loads(str(nx["ids"])), json.loads(str(of["ids"]))
    assert ids_n == ids_o, "the two tokenizers give different ids"
    print(f"{len(ids_n)} sentences, token ids identical on both sides, {sum(map(len, ids_n))} tokens in all "
          "([CLS] and [SEP] included on both sides)")
    results = {}
    print("\n| configuration | pred. agree | max abs diff: logits | predicted class, last layer (max abs score) | "
          "all classes, last layer | [CLS] vectors, layers 1..L (max over layers) | ||[CLS] vectors||, worst layer "
          "| official: this config vs default, predicted class |")
    print("|---|---|---|---|---|---|---|---|")
    for name in CONFIGS:
        if f"{key(name)}__scores" not in nx:
            continue
        r = results[name] = compare_config(nx, of, key(name))
        print(f"| {name} | {r['pred_agree']}/{len(ids_n)} | {r['logits']:.2e} | {r['pred_class']:.2e} "
              f"({r['pred_scale']:.2f}) | {r['all_classes']:.2e} | {max(r['vectors_per_layer']):.2e} "
              f"(max abs {r['vector_scale']:.1f}) | {max(r['cls_norms_per_layer']):.2e} "
              f"| {r['official_vs_default']:.2e} |")
    if "peft__scores" in nx:
        peft = _maxabs(nx["peft__scores"][:, -1], nx["absdot__scores"][:, -1])
        print(f"\nnormx on the PEFT-wrapped model vs on the merged model (default config, predicted class, last "
              f"layer): max abs diff {peft:.2e}")
    for name, r in results.items():
        print(f"{name}: per-layer [CLS] vector max abs diff {[f'{v:.1e}' for v in r['vectors_per_layer']]}; "
              f"explain vs decompose {r['explain_vs_decompose']:.1e}; official |sum - logit| "
              f"{r['sum_official_minus_logit']:.1e}; tokens compared {r['tokens']}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1), encoding="utf-8")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("normx", "official", "compare"):
        p = sub.add_parser(name)
        p.add_argument("--out", dest="work", required=True, help="folder for the merged model and the .npz files")
        add_data_option(p)
        p.add_argument("--n", type=int, default=50, help="first N sentences")
        p.add_argument("--batch-size", type=int, default=10)
    sub.choices["official"].add_argument("--official-dir", required=True, help="a checkout of mohsenfayyaz/DecompX")
    sub.choices["normx"].add_argument("--fast-ffn", action="store_true", help="force normx's per-target FFN "
                                      "path (long texts) on the absdot configurations; writes normx_fastffn.npz")
    sub.choices["compare"].add_argument("--normx-file", help="default: WORK/normx.npz")
    sub.choices["compare"].add_argument("--official-file", help="default: WORK/official_bs10.npz")
    sub.choices["compare"].add_argument("--json", help="also write the numbers here")
    args = parser.parse_args(argv)
    if args.command != "compare":
        args.data = data_folder(args.data) / "sst2" / "dev.tsv"
    {"normx": run_normx, "official": run_official, "compare": run_compare}[args.command](args)


if __name__ == "__main__":
    main()
