"""``calibrated_attention``: a context method whose weights over normx's attention readings were fitted, per model,
to what removing sources does to the response (``normx calibrate``; :mod:`~normx.methods.calibrated.fit`): AT2's
idea (Cohen-Wang et al. 2025) fitted by a closed-form ridge on normx's own removal operator.

For the response token y_t, read at the position q_t that predicts it, step t's row is

    row_t[i] = sum_(f, l, h) theta^f_(l,h) R^(f,l,h)_(q_t, i)  +  sum_(per-source f) theta^f s^f_(j(i), t) / |j(i)|

over the per-head readings R of :mod:`~normx.methods.calibrated.readings` (``attention``: alpha^(l,h)_(q_t,i);
``norm``: alpha * ||W_O^h v_i||; ``logit``: alpha * <W_O^h v_i, g_t>; ``knockout`` / ``knockout_abs``: the
gradient of the response's log-probability with respect to a bias on that attention score, and its size) and the
per-source readings s of the source j(i) holding token i (``tokens``: its size; ``source_knockout``: the exact drop
in log p(y_t) when the response's rows cannot read it; ``query_knockout``: the same when the query's rows after the
context cannot read it either, within a row budget; ``reread``: its effect in a per-context surrogate of balanced
re-read ablations, :mod:`~normx.methods.calibrated.surrogate`; ``presence``: the slope of the response's
log-probability in the source's log-presence with every source half present to the last rows,
:mod:`normx.methods.decoder.presence`, a whole-response reading whose steps share it evenly, as ``tokens``'s do), so
that a source's score (its tokens' entries summed
over the steps) is theta^T F_j, the fitted prediction of the drop in the response's log-probability when the source is
removed. The weights decide the cost: the per-head attention families one eager forward pass (``logit``: and one
backward through the final norm and head), the knockout families one pass over the prompt and one forward and
backward pass over the response's rows, ``source_knockout`` one pass over the prompt and one over the response's
rows per source (batched), ``query_knockout`` one pass over the prompt up to its first hidden row and one over the
hidden rows per source (at most :data:`~normx.methods.calibrated.readings.QUERY_BUDGET` rows per token in all),
``reread`` one pass over the prompt up to its first re-read row and one over the re-read rows per mask (at most
:data:`~normx.methods.calibrated.readings.REREAD_BUDGET` rows per token in all), ``presence`` one forward pass and
its last rows again with a backward pass through them (within :data:`~normx.methods.calibrated.readings.
PRESENCE_BUDGET` forward passes), ``tokens`` nothing but the sources. The sources: the ``sources`` option, as the
ablation methods take it (the prompt's sentences by default); when the method splits the prompt itself and the prompt
has more than one paragraph, the last the shorter, ``presence`` reads the sources of its last paragraph (the
question after the documents, as in ``"Context: ...\\n\\nQuery: ..."``) at full presence and the others at half
(:func:`~normx.methods.ablation.last_paragraph`); spans given are all the context's, all read at half. The weights:
the file ``weights=`` names, else the ones stored for the model's fingerprint (:mod:`~normx.methods.calibrated.
weights`; the smollm2 preset ships its own); none is an error that names ``normx calibrate``.
"""

from __future__ import annotations

import numpy as np

from normx._torch import torch
from normx.errors import InvalidInputError
from normx.methods.ablation import (
    BATCH_OPTION,
    SOURCES_OPTION,
    _refuse,
    _spans,
    _supports,
    last_paragraph,
    prompt_sources,
)
from normx.methods.ablation.forwards import outcomes
from normx.methods.calibrated import weights as stored
from normx.methods.calibrated.readings import PRESENCE_BUDGET, SCALAR, head_readings, shape, source_readings
from normx.methods.registry import Method, Option, register_method
from normx.methods.response import ResponseContext, ResponseRows

NAME = "calibrated_attention"


def load_weights(model, adapter, path: str | None) -> tuple[dict, str]:
    """The weights record for ``model`` (from ``path``, or stored for its fingerprint), checked against the
    model's shape; and where it came from."""
    record, where = _weights_record(model, path)
    if tuple(record["shape"]) != shape(model, adapter):
        raise InvalidInputError(f"{where} holds weights for {record['shape'][0]} blocks x {record['shape'][1]} heads; "
                                f"this model has {shape(model, adapter)[0]} x {shape(model, adapter)[1]}")
    return record, where


def _weights_record(model, path: str | None) -> tuple[dict, str]:
    """The weights record in ``path``, else the one stored or shipped for ``model``; and where it came from."""
    if path is None:
        record, where = stored.find(model, NAME)
        return record, str(where)
    return stored.read(path), str(path)


def _state(model, options) -> dict:
    """The weights a call with ``options`` would read for ``model``: their file and sha256 (``Method.state``)."""
    record, where = _weights_record(model, options.get("weights"))
    return {"weights_file": where, "weights_sha256": record["sha256"]}


def calibrated(ctx: ResponseContext, prefix=None) -> ResponseRows:
    """The method's rows; ``prefix``: a pass already run over the whole sequence that the presence reading continues
    from (:class:`normx.methods.ablation.prefix.Prefix`, with value vectors; ``budgeted``'s prior)."""
    record, where = load_weights(ctx.model, ctx.adapter, ctx.options["weights"])
    families = record["families"]
    heads = [f for f in families if f not in SCALAR]
    scalar = [f for f in families if f in SCALAR]
    rows = np.zeros((ctx.steps, len(ctx.ids)), np.float64)
    logits = None
    if heads:
        theta = torch.tensor(np.array([record["weights"][f] for f in heads]), dtype=torch.float32,
                             device=ctx.handle.device)  # [F, L, H]

        def weighted(layer, block):  # [F, H, Q, T] -> [Q, T]
            return torch.einsum("fhqt,fh->qt", block, theta[:, layer - 1])

        per_block, logits = head_readings(ctx.handle, ctx.ids, ctx.prompt_length, heads, weighted, NAME)
        rows += sum(per_block.values()).double().cpu().numpy()
    spans = None
    if scalar:
        sources = prompt_sources(ctx)
        values, found = source_readings(ctx.handle, ctx.ids, ctx.prompt_length, sources, scalar, NAME,
                                        ctx.options["internal_batch_size"] or ctx.batch_size,
                                        whole=last_paragraph(ctx, sources), prefix=prefix)
        for family in scalar:  # each step's row over the tokens (a source: its tokens' entries summed)
            rows += record["weights"][family][0][0] * values[family]
        spans = _spans(sources)
        if logits is None:
            # only `tokens`: the model's logits from one plain pass, as the ablation methods take them
            logits = found if found is not None else outcomes(ctx, sources, np.ones((1, len(sources)), bool))[2]
    settings = {
        "scope": "response", "weights_file": where, "weights_sha256": record["sha256"], "families": list(families),
        "rows": "step t: sum over the weighted families (per block and head: the readings from the position that "
                "predicts token t; per source: its share of step t, spread evenly over its tokens); a source's score "
                "(its tokens summed over the steps) is the fitted prediction of the drop in the response's "
                "log-probability when it is removed"}
    if spans is not None:
        settings["source_spans"] = spans
    return ResponseRows(rows.astype(np.float32), logits, {}, settings)


register_method(Method(
    NAME, _refuse,
    "Calibrated attention: weights over normx's attention readings from the response's rows (per head: attention, "
    "norm-weighted, direct-logit, knockout gradients; per source: its size, the exact drop when the response "
    "(and the query) cannot read it, its effect in a surrogate of re-read ablations, the response's slope in its "
    "presence with every source half present, the norm-based attention of the response's rows read in that same "
    "pass), fitted per model by `normx calibrate` to the response's "
    "log-probability under random source removals; one to two forward passes",
    display="Calibrated attention", response=calibrated, response_only=True, label_dependent=True, layered=False,
    predicts=True, exclusive=True, reading="signed", supports=_supports, state=_state,
    options=[Option("sources", "sentences", SOURCES_OPTION.help.replace("auto (", "auto (as the ablation methods: ")
                    + "; the shipped weights were fitted on sentences"), BATCH_OPTION,
             Option("weights", None, "a calibrated weights file (None: the ones stored for the model's fingerprint by "
                    "`normx calibrate --store`, or shipped with its preset)", str, none=True)],
    # the shipped weights' cost (tokens + presence + response_norm): one forward pass and its last rows again with a
    # backward pass
    cost=lambda tokens, targets, options: PRESENCE_BUDGET))
