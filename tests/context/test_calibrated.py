"""calibrated_attention (#46 part 3): the ridge against its closed form, known head weights recovered from outcomes
they generate, the weights file's round trip and its refusals, the method's rows against weighted attention computed
by hand on a tiny Llama, and ``normx calibrate`` end to end."""

from __future__ import annotations

import json

import locations
import numpy as np
import pytest
import tiny

import normx
from normx._torch import torch
from normx.cli.main import main
from normx.core.handle import model_handle
from normx.errors import InvalidInputError, ModelLoadError
from normx.methods.calibrated import fit, training
from normx.methods.calibrated import weights as stored
from normx.methods.calibrated.readings import QUERY_BUDGET, SCALAR, presence_first_row, query_first_row, shape
from normx.methods.decoder.presence import presence_gradients
from normx.models import get_adapter
from normx.models.identity import model_identity

SHARED = locations.SHARED


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("NORMX_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture(scope="module")
def llama():
    return tiny.build("LlamaForCausalLM")


def instances(rng, theta: dict, count=12, sources=6, masks=24, layers=2, heads=3, noise=0.0):
    """Instances whose outcomes are an offset plus the kept sources' theta . features (and noise)."""
    made = []
    for i in range(count):
        features = {f: rng.gamma(2.0, 1.0, (sources, layers, heads)) for f in ("attention", "logit")}
        kept = rng.random((masks, sources)) < 0.5
        per_source = sum((features[f] * theta[f]).sum((1, 2)) for f in theta)
        y = rng.normal() * 10 + kept @ per_source + noise * rng.normal(size=masks)
        made.append(fit.Instance(features, kept, y, f"i{i}"))
    return made


def test_ridge_is_its_closed_form():
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(40, 5)) * [1, 10, 0.1, 3, 1], rng.normal(size=40)
    x[:, 4] = 0.0  # a dead column gets weight 0
    lam = 0.3
    s = np.sqrt((x[:, :4] ** 2).mean(0))
    xs = x[:, :4] / s
    gram = xs.T @ xs
    want = np.linalg.solve(gram + lam * np.trace(gram) / 4 * np.eye(4), xs.T @ y) / s
    np.testing.assert_allclose(fit.ridge(x, y, lam), [*want, 0.0], rtol=1e-10)
    # the per-instance centring: the same as the ridge on each instance's centred rows stacked
    made = instances(rng, {"attention": rng.normal(size=(2, 3))}, count=3)
    xc = np.vstack([i.design(["attention"]) - i.design(["attention"]).mean(0) for i in made])
    yc = np.concatenate([i.y - i.y.mean() for i in made])
    np.testing.assert_allclose(fit.centred_ridge(made, ["attention"], lam), fit.ridge(xc, yc, lam), rtol=1e-10)
    with pytest.raises(InvalidInputError, match="penalty"):
        fit.ridge(x, y, 0.0)


def test_the_nats_factor_undoes_the_shrinkage_and_changes_no_lds():
    rng = np.random.default_rng(5)
    true = {"attention": np.full((2, 3), 0.7)}  # one weight when tied "all"
    made = instances(rng, true, count=6)
    shrunk = fit.centred_ridge(made, ["attention"], 100.0, "spread", "all")
    assert 0 < shrunk[0] < 0.1 * 0.7  # the ridge at lambda 100 keeps a small part of the weight
    theta, factor = fit.in_nats(made, ["attention"], shrunk, "all")
    np.testing.assert_allclose(theta, [0.7], rtol=1e-9)  # noise-free: the drops themselves, in nats
    assert factor == pytest.approx(0.7 / shrunk[0])
    for inst in made:
        assert fit.instance_lds(inst, ["attention"], theta, "all") == fit.instance_lds(inst, ["attention"], shrunk,
                                                                                       "all")
    same, one = fit.in_nats(made, ["attention"], -shrunk, "all")  # predictions against the outcomes: left alone
    assert one == 1.0 and (same == -shrunk).all()


def test_known_head_weights_are_recovered_and_their_family_chosen():
    rng = np.random.default_rng(1)
    true = {"logit": rng.normal(size=(2, 3))}
    made = instances(rng, true, noise=0.01)
    theta = fit.centred_ridge(made, ["logit"], 1e-8)
    np.testing.assert_allclose(theta.reshape(2, 3), true["logit"], atol=2e-3)
    choice = fit.choose(made, ["attention", "logit"], lambdas=(1e-6, 1.0), folds=3)
    assert choice.families == ("logit",) and choice.lam == 1e-6 and choice.cv_lds > 0.99
    assert {tuple(r["families"]) for r in choice.table} == {("attention",), ("logit",), ("attention", "logit")}
    # outcomes that no feature explains: chance LDS
    noise = [fit.Instance(i.features, i.masks, rng.normal(size=len(i.y)), i.id) for i in made]
    assert abs(fit.cross_validate(noise, ["attention"], 1.0, "logprob", 3)) < 0.2


def record_for(model, theta, families=("attention",)):
    return stored.make_record("calibrated_attention", model_identity(model), families, theta,
                              theta[families[0]].shape, 0.1, "logprob", 0.5, {"contexts": 3})


def test_weights_round_trip_and_refusals(llama, cache, tmp_path):
    model, _ = llama
    blocks, heads = shape(model, get_adapter(model))
    with pytest.raises(InvalidInputError, match="normx calibrate"):
        stored.find(model, "calibrated_attention")
    record = record_for(model, {"attention": np.arange(blocks * heads, dtype=float).reshape(blocks, heads)})
    path = stored.store(record)
    assert path.parent == cache / "calibrated" and not list(path.parent.glob(".*.tmp"))
    found, where = stored.find(model, "calibrated_attention")
    assert found == record and where == path
    text = path.read_text()
    changed = json.loads(text)
    changed["weights"]["attention"][0][0] = 99.0  # tampered: the hash no longer matches
    path.write_text(json.dumps(changed))
    with pytest.raises(ModelLoadError, match="sha256"):
        stored.find(model, "calibrated_attention")
    path.write_text(text[: len(text) // 2])  # cut short
    with pytest.raises(ModelLoadError, match="not UTF-8 JSON"):
        stored.find(model, "calibrated_attention")
    forged = dict(changed, sha256=stored.digest(changed))  # rehashed, but NaN is no weight
    forged["weights"] = {"attention": [[float("nan")] * heads] * blocks}
    forged["sha256"] = stored.digest(forged)
    path.write_text(json.dumps(forged))
    with pytest.raises(ModelLoadError, match="finite"):
        stored.find(model, "calibrated_attention")
    path.unlink()
    elsewhere = stored.write(record, tmp_path / "real.json")
    path.symlink_to(elsewhere)  # a link is never followed
    with pytest.raises(ModelLoadError, match="not a regular file"):
        stored.find(model, "calibrated_attention")
    path.unlink()
    other = dict(record, model=dict(record["model"], weights="0" * 24))
    other["sha256"] = stored.digest(other)
    stored.write(other, path)  # another model's weights under this model's key
    with pytest.raises(ModelLoadError, match="not to this model"):
        stored.find(model, "calibrated_attention")


def test_the_method_is_weighted_attention_from_the_predicting_positions(llama):
    model, tok = llama
    blocks, heads = shape(model, get_adapter(model))
    theta = np.random.default_rng(2).normal(size=(blocks, heads))
    stored.store(record_for(model, {"attention": theta}))
    prompt, response = "the film was good. a dull plot!", [17, 23, 5]
    g = normx.explain_generation(model, tok, prompt, method="calibrated_attention", target=response)
    ids = list(g.token_ids)
    length = len(ids) - len(response)
    before = model.config._attn_implementation
    with torch.no_grad():
        model.config._attn_implementation = "eager"
        try:
            attentions = model(torch.tensor([ids]), output_attentions=True).attentions
        finally:
            model.config._attn_implementation = before
    for t, row in enumerate(g.rows()):
        q = length - 1 + t
        want = sum(theta[b, h] * attentions[b][0, h, q, : length + t].double().numpy()
                   for b in range(blocks) for h in range(heads))
        np.testing.assert_allclose(row[: length + t], want, rtol=1e-4, atol=1e-6)
    with pytest.raises(InvalidInputError, match="whole response"):  # a response-only method
        normx.explain(model, tok, "the film", method="calibrated_attention")


@pytest.mark.parametrize("families", [("attention", "norm", "logit"), ("knockout", "knockout_abs"), ("tokens",),
                                      ("tokens", "source_knockout"), ("norm", "knockout", "source_knockout"),
                                      ("tokens", "query_knockout"), ("tokens", "presence"),
                                      ("tokens", "presence", "response_norm")])
def test_every_family_sums_to_theta_times_the_training_features(llama, tmp_path, families):
    model, tok = llama
    blocks, heads = shape(model, get_adapter(model))
    ids = tok("the film was good. a dull plot! it was long. and so on")["input_ids"]
    length, spans = len(ids) - 3, [(1, 5), (5, 9), (9, len(ids) - 3)]
    rng = np.random.default_rng(3)
    theta = {f: rng.normal(size=(1, 1) if f in SCALAR else (blocks, heads)) for f in families}
    record = stored.make_record("calibrated_attention", model_identity(model), families, theta, (blocks, heads),
                                0.1, "logprob", 0.5, {"contexts": 3})
    path = stored.write(record, tmp_path / "w.json")
    g = normx.explain_generation(model, tok, tok.decode(ids[1:length]), method="calibrated_attention",
                                 target=ids[length:], weights=str(path), sources=spans)
    assert list(g.token_ids) == ids
    scores = [sum(float(np.nansum(row[a:b])) for row in g.rows()) for a, b in spans]
    features = training.source_features(model, ids, length, spans, families)
    want = [sum(float((features[f][j] * theta[f]).sum()) for f in families) for j in range(len(spans))]
    np.testing.assert_allclose(scores, want, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize(("prompt", "whole"), [
    ("Context: the film was good. a dull plot! it was long.\n\nQuery: was it good? say yes or no.", [3, 4]),
    ("Context: the film was good. a dull plot! it was long. Query: was it good? say yes or no.", []),
    ("Query: was it good? say yes or no.\n\nContext: the film was good. a dull plot! it was long.", []),
])
def test_read_without_sources_presence_is_per_token_and_reads_the_last_paragraph_whole(llama, tmp_path, prompt,
                                                                                         whole):
    """As a user reads it (no sources): the prompt's sentences, each token's row its own presence gradient (a part
    of a sentence sums to its own share), the question after a blank line at full presence, the rest at half (not
    the last paragraph when it is the longer: documents after the question)."""
    model, tok = llama
    blocks, heads = shape(model, get_adapter(model))
    record = stored.make_record("calibrated_attention", model_identity(model), ("tokens", "presence"),
                                {"tokens": np.zeros((1, 1)), "presence": np.ones((1, 1))}, (blocks, heads), 0.1,
                                "logprob", 0.5, {"contexts": 3})
    path = stored.write(record, tmp_path / "w.json")
    g = normx.explain_generation(model, tok, prompt, method="calibrated_attention", target=[5, 6, 7],
                                 weights=str(path))
    spans = g.settings["source_spans"]
    assert len(spans) == 5  # three sentences of context, two of the query
    sources = [list(range(a, b)) for a, b in spans]
    length, ids = g.prompt_length, list(g.token_ids)
    presence = [1.0 if j in whole else 0.5 for j in range(len(sources))]
    first_row = presence_first_row(len(ids), length, sources)
    per_token = presence_gradients(model_handle(model), ids, length, sources, "test", first_row, presence).gradients
    summed = sum(np.nan_to_num(np.asarray(row[:length], np.float64)) for row in g.rows())
    np.testing.assert_allclose(summed, per_token, rtol=1e-4, atol=1e-7)
    assert np.abs(per_token[sources[0]] - per_token[sources[0]].mean()).max() > 1e-7  # not spread evenly


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """A tiny Qwen2 causal LM with a chat template (prompts of a few hundred tokens)."""
    return tiny.chat_qwen2_folder(tmp_path_factory.mktemp("qwen2-chat"))


@pytest.mark.skipif(not (SHARED / "qnli").is_dir(), reason="the shared GLUE data folder is not here")
def test_calibrate_command_end_to_end(folder, cache, tmp_path, capsys):
    out = tmp_path / "w.json"
    argv = ["calibrate", folder, "--data", str(SHARED), "--kinds", "qa", "--contexts", "3", "--length", "120",
            "--masks", "6", "--folds", "3", "--max-new-tokens", "3", "--families", "attention,logit",
            "--out", str(out), "--store", "--keep", str(tmp_path / "keep")]
    assert main(argv) == 0
    assert "chosen:" in capsys.readouterr().out
    record = stored.read(out)
    assert record["training"]["contexts"] == 3 and record["training"]["split"] == "train"
    assert set(record["families"]) <= {"attention", "logit"} and len(list((tmp_path / "keep").glob("*.npz"))) == 3
    model, tok = normx.load_model(folder)
    assert stored.find(model, "calibrated_attention")[0] == record  # stored under the model's fingerprint
    g = normx.explain_generation(model, tok, "the film was good.", method="calibrated_attention", target=[5, 6])
    assert np.isfinite(g.rows()[1][:-1]).all()
    assert main(argv) == 0  # again from the kept features and outcomes: the same fit
    assert stored.read(out) == record
    capsys.readouterr()
    assert main(["calibrate", folder, "--data", str(SHARED), "--contexts", "3"]) == 2  # nowhere to write
    assert "--store" in capsys.readouterr().err
    assert main(["calibrate", folder, "--data", str(SHARED), "--store", "--families", "attention,nope"]) == 2
    assert "nope" in capsys.readouterr().err


@pytest.mark.skipif(not (SHARED / "qnli").is_dir(), reason="the shared GLUE data folder is not here")
def test_calibrate_under_torchrun_collects_what_one_process_does(folder, cache, tmp_path, monkeypatch, capsys):
    """Two torchrun processes each collect every other context's ablations into the shared --keep folder and rank 0
    fits them all: the weights one process fits. Without --keep the processes have nowhere to share them."""
    import os
    import subprocess
    import sys

    args = ["calibrate", folder, "--data", str(SHARED), "--kinds", "qa", "--contexts", "3", "--length", "120",
            "--masks", "6", "--folds", "3", "--max-new-tokens", "3", "--families", "attention,logit"]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    one = subprocess.run([sys.executable, "-m", "normx.cli.main", *args, "--out", str(tmp_path / "one.json"),
                          "--keep", str(tmp_path / "k1")], env=env, capture_output=True, text=True, timeout=600)
    assert one.returncode == 0, one.stderr[-2000:]
    two = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                          "-m", "normx.cli.main", *args, "--out", str(tmp_path / "two.json"), "--keep",
                          str(tmp_path / "k2")], env=env, capture_output=True, text=True, timeout=600)
    assert two.returncode == 0, two.stderr[-3000:]
    assert "rank 1 of 2" in two.stderr and two.stdout.count("chosen:") == 1  # rank 0 alone fits
    assert len(list((tmp_path / "k2").glob("*.npz"))) == 3
    single, double = stored.read(tmp_path / "one.json"), stored.read(tmp_path / "two.json")
    assert single["families"] == double["families"] and single["training"] == double["training"]
    for family in single["families"]:  # (float32 sums in another order: 1 thread per process under torchrun)
        np.testing.assert_allclose(single["weights"][family], double["weights"][family], rtol=1e-4, atol=1e-6)
    from normx.bulk import processes

    monkeypatch.setattr(processes, "rank_and_world", lambda: (0, 2))
    assert main([*args, "--out", str(tmp_path / "three.json")]) == 2
    assert "--keep DIR" in capsys.readouterr().err


def test_the_fingerprint_is_kept_until_a_weight_changes():
    model, _ = tiny.build("LlamaForCausalLM", fresh=True)
    first = stored._identity(model)
    assert stored._identity(model) is first  # paid once per model object
    with torch.no_grad():
        next(model.parameters()).add_(1.0)  # changed in place: fingerprinted again
    assert stored._identity(model)["weights"] != first["weights"] == model_identity(tiny.build(
        "LlamaForCausalLM", fresh=True)[0])["weights"]


def test_per_source_families_are_their_closed_forms(llama):
    model, tok = llama
    ids = tok("the film was good. a dull plot! it was long. and so on")["input_ids"]
    length, spans = len(ids) - 3, [(1, 5), (5, 9), (9, len(ids) - 3)]
    features = training.source_features(model, ids, length, spans, ("tokens", "source_knockout"))
    np.testing.assert_allclose(features["tokens"][:, 0, 0], [4, 4, len(ids) - 12], rtol=1e-12)
    tensor = torch.tensor([ids])
    with torch.no_grad():
        full = torch.log_softmax(model(tensor).logits[0, length - 1:-1].double(), -1)
        whole = float(full.gather(1, tensor[0, length:, None]).sum())
        for j, (a, b) in enumerate(spans):  # hidden from the response's rows only: a 4D mask on one whole pass
            allowed = torch.ones(len(ids), len(ids)).tril().bool()
            allowed[length - 1:len(ids) - 1, a:b] = False
            mask = torch.where(allowed, torch.zeros(()), torch.finfo(torch.float32).min)[None, None]
            hidden = torch.log_softmax(model(tensor, attention_mask=mask).logits[0, length - 1:-1].double(), -1)
            drop = whole - float(hidden.gather(1, tensor[0, length:, None]).sum())
            assert features["source_knockout"][j, 0, 0] == pytest.approx(drop, rel=1e-4, abs=1e-5)


def test_query_knockout_hides_each_source_from_the_rows_after_the_context_within_its_budget(llama):
    model, tok = llama
    ids = tok("the film was good. a dull plot! it was long. and so on and on")["input_ids"]
    length, spans = len(ids) - 3, [(1, 5), (5, 8)]  # the query: tokens 8 .. length - 1; the budget: from 2
    sources = [list(range(a, b)) for a, b in spans]
    # budget: the rows after the context (here all of them) while cache + 3 x rows <= 1.6 x T
    first = query_first_row(len(ids), length, sources)
    rows = int(((QUERY_BUDGET - 1) * len(ids) + 1) / 2)
    assert first == max(2, len(ids) - 1 - rows) and first <= length - 1
    assert query_first_row(1000, 990, sources) == 699  # 300 rows: the budget
    assert query_first_row(1000, 990, [[i] for i in range(100)]) == 989  # the response's rows at least
    assert query_first_row(12, 9, [list(range(4, 8))]) == 5  # never before the first source's second token
    features = training.source_features(model, ids, length, spans, ("source_knockout", "query_knockout"))
    tensor = torch.tensor([ids])
    with torch.no_grad():
        full = torch.log_softmax(model(tensor).logits[0, length - 1:-1].double(), -1)
        whole = float(full.gather(1, tensor[0, length:, None]).sum())
        for j, (a, b) in enumerate(spans):
            allowed = torch.ones(len(ids), len(ids)).tril().bool()
            allowed[max(first, b):len(ids) - 1, a:b] = False  # the re-read rows after the source
            mask = torch.where(allowed, torch.zeros(()), torch.finfo(torch.float32).min)[None, None]
            hidden = torch.log_softmax(model(tensor, attention_mask=mask).logits[0, length - 1:-1].double(), -1)
            drop = whole - float(hidden.gather(1, tensor[0, length:, None]).sum())
            assert features["query_knockout"][j, 0, 0] == pytest.approx(drop, rel=1e-4, abs=1e-5)
    assert not np.allclose(features["query_knockout"], features["source_knockout"])


def test_tied_and_per_source_weights_expand_to_their_tables():
    theta = np.array([0.5, 1.0, 2.0, 3.0, 4.0])
    tables = fit.expand(theta, ("attention", "tokens", "norm"), "block", (2, 3), scalar=("tokens",))
    assert tables["attention"].tolist() == [[0.5] * 3, [1.0] * 3]
    assert tables["tokens"].tolist() == [[2.0]] and tables["norm"].tolist() == [[3.0] * 3, [4.0] * 3]
    tables = fit.expand(np.array([0.5, 2.0, 3.0]), ("attention", "tokens", "norm"), "all", (2, 3), scalar=("tokens",))
    assert tables["attention"].tolist() == [[0.5] * 3] * 2 and tables["tokens"].tolist() == [[2.0]]
    assert tables["norm"].tolist() == [[3.0] * 3] * 2
    rng = np.random.default_rng(5)
    made = instances(rng, {"attention": np.full((2, 3), 0.7)}, count=10)
    assert fit.cross_validate(made, ["attention"], 1e-3, "logprob", 5, "all") > 0.99  # one shared weight suffices


def test_kept_outcomes_are_reused_and_only_missing_families_computed(llama, tmp_path, monkeypatch):
    model, tok = llama
    ids = tok("the film was good. a dull plot! it was long. and so on")["input_ids"]
    context = {"id": "c0", "ids": ids, "prompt_length": len(ids) - 3, "spans": [(1, 5), (5, 9), (9, len(ids) - 3)]}
    first = training.instances_for(model, tok, [context], masks=4, seed=7, families=("attention",), keep=tmp_path,
                                   progress=False)
    calls = []
    real = training.source_features
    monkeypatch.setattr(training, "masked_outcomes", lambda *a, **k: pytest.fail("outcomes computed again"))
    monkeypatch.setattr(training, "source_features", lambda *a, **k: calls.append(a[4]) or real(*a, **k))
    again = training.instances_for(model, tok, [context], masks=4, seed=7, families=("attention", "tokens"),
                                   keep=tmp_path, progress=False)
    assert calls == [["tokens"]] and np.array_equal(again[0].y, first[0].y)
    assert np.array_equal(again[0].features["attention"], first[0].features["attention"])
    kept = training.kept_instances(tmp_path, ["c0"], masks=4, seed=7, families=("tokens",))
    assert len(kept) == 1 and set(kept[0].features) == {"tokens"}
    assert training.kept_instances(tmp_path, ["c0"], masks=4, seed=8, families=("tokens",)) == []  # other masks


def test_a_damaged_weights_file_is_refused_in_one_line(llama, cache, tmp_path):
    for name, text in (("deep", "[" * 100_000), ("digits", '{"format": ' + "9" * 5000 + "}")):
        path = tmp_path / f"{name}.json"
        path.write_text(text)
        with pytest.raises(ModelLoadError, match="not a calibrated weights file"):
            stored.read(path)


@pytest.mark.skipif(not (SHARED / "qnli").is_dir(), reason="the shared GLUE data folder is not here")
def test_store_never_puts_weights_before_shipped_ones_silently(folder, cache, tmp_path, capsys, monkeypatch):
    model, _ = normx.load_model(folder)
    shipped = stored.write(record_for(model, {"attention": np.ones(shape(model, get_adapter(model)))}),
                           tmp_path / "shipped.json")
    monkeypatch.setattr(stored, "shipped", lambda _model: shipped)
    monkeypatch.setattr(training, "instances_for", lambda *a, **k: pytest.fail("fitted before refusing"))
    argv = ["calibrate", folder, "--data", str(SHARED), "--kinds", "qa", "--contexts", "3", "--folds", "3", "--store"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "ships calibrated weights" in err and "--replace-shipped" in err and str(shipped) in err
    assert main(["calibrate", folder, "--data", str(SHARED), "--replace-shipped", "--out", "x.json"]) == 2
    assert "--replace-shipped is for --store" in capsys.readouterr().err
    g = normx.explain_generation(model, normx.load_model(folder)[1], "the film was good.",
                                 method="calibrated_attention", target=[5, 6], weights=str(shipped))
    assert g.settings["weights_file"] == str(shipped)  # every result says which weights it read
    assert g.settings["weights_sha256"] == stored.read(shipped)["sha256"]


@pytest.mark.skipif(not (SHARED / "qnli").is_dir(), reason="the shared GLUE data folder is not here")
def test_calibrate_a_peft_adapter_folder(folder, cache, tmp_path, capsys):
    """A LoRA adapter saved on the tiny model (a model no preset ships weights for, wrapped by PEFT): calibrated from
    its folder, stored under the fingerprint the method reads it by (the transformers model inside the wrapper,
    adapter included), and read back by calibrated_attention and by budgeted's prior."""
    from peft import LoraConfig, get_peft_model

    base, _ = normx.load_model(folder)
    torch.manual_seed(5)
    wrapped = get_peft_model(base, LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj", "v_proj"],
                                              task_type="CAUSAL_LM", init_lora_weights=False))
    adapter = tmp_path / "lora"
    wrapped.save_pretrained(adapter)
    settings = json.loads((adapter / "adapter_config.json").read_text())
    (adapter / "adapter_config.json").write_text(json.dumps({**settings, "base_model_name_or_path": str(folder)}))
    argv = ["calibrate", str(adapter), "--data", str(SHARED), "--kinds", "qa", "--contexts", "3", "--length", "120",
            "--masks", "6", "--folds", "3", "--max-new-tokens", "3", "--families", "tokens,presence", "--store"]
    assert main(argv) == 0
    assert "chosen:" in capsys.readouterr().out
    model, tok = normx.load_model(str(adapter))
    assert type(model).__name__.startswith("Peft")
    record, _ = stored.find(model, "calibrated_attention")
    assert record["model"]["adapter"] is not None and record["model"] == model_identity(model_handle(model).base)
    g = normx.explain_generation(model, tok, "the film was good. a dull plot!", method="calibrated_attention",
                                 target=[5, 6])
    assert g.settings["weights_sha256"] == record["sha256"]
    fast = normx.explain_generation(model, tok, "the film was good. a dull plot!", method="budgeted", target=[5, 6],
                                    budget="fast")
    assert fast.settings["prior"] == "calibrated_attention"
