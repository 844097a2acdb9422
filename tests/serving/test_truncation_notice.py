"""The demo's notice for a text it cut names the command that takes the model's whole limit: ``normx generate`` for
a causal LM (the demo continues its text), ``normx explain`` for a classifier (#43 item 10)."""

from __future__ import annotations

import tiny

from normx.serving import server as serving
from normx.serving import session

LONG = "the film was good " * 40  # over the tiny models' 64-token position table


def test_a_cut_text_names_the_command_for_the_models_head():
    cache = serving.ModelCache()
    cache.put("tiny-lm", *tiny.build("LlamaForCausalLM"))
    cache.put("tiny-cls", *tiny.build("BertForSequenceClassification"))
    lm = session.explain_request(cache, "tiny-lm", LONG, steps=1)
    assert lm.notices and "`normx generate` takes the model's whole limit" in lm.notices[0]
    assert "normx explain" not in " ".join(lm.notices)
    classifier = session.explain_request(cache, "tiny-cls", LONG)
    assert classifier.notices and "`normx explain` takes the model's whole limit" in classifier.notices[0]
