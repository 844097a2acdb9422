"""``calibrated_attention``: a one-pass context method whose per-(family, block, head) weights were fitted, per
model, to what removing sources does to the response (``normx calibrate``; :mod:`~normx.methods.calibrated.fit`),
AT2's idea (Cohen-Wang et al. 2025) fitted by a closed-form ridge on normx's own removal operator.

For the response token y_t, read at the position q_t that predicts it, step t's row is

    row_t[i] = sum_(f, l, h) theta^f_(l,h) R^(f,l,h)_(q_t, i)

over the readings R of :mod:`~normx.methods.calibrated.readings` (``attention``: alpha^(l,h)_(q_t,i); ``norm``:
alpha * ||W_O^h v_i||; ``logit``: alpha * <W_O^h v_i, g_t>) the stored weights use, so a source's score (its
tokens' entries summed over the steps) is theta^T F_j, the fitted prediction of the drop in the response's
log-probability when the source is removed. One forward pass with eager attention (and, for ``logit``, one
backward through the final norm and head at the response positions). The weights: the file ``weights=`` names,
else the ones stored for the model's fingerprint (:mod:`~normx.methods.calibrated.weights`); none is an error that
names ``normx calibrate``.
"""

from __future__ import annotations

import numpy as np

from normx._torch import torch
from normx.errors import InvalidInputError
from normx.methods.ablation import SOURCES_OPTION, _refuse, _supports
from normx.methods.calibrated import weights as stored
from normx.methods.calibrated.readings import head_readings, shape
from normx.methods.registry import Method, Option, register_method
from normx.methods.response import ResponseContext, ResponseRows

NAME = "calibrated_attention"


def load_weights(model, adapter, path: str | None) -> tuple[dict, str]:
    """The weights record for ``model`` (from ``path``, or stored for its fingerprint), checked against the
    model's shape; and where it came from."""
    if path is None:
        record, where = stored.find(model, NAME)
    else:
        record, where = stored.read(path), path
    if tuple(record["shape"]) != shape(model, adapter):
        raise InvalidInputError(f"{where} holds weights for {record['shape'][0]} blocks x {record['shape'][1]} heads; "
                                f"this model has {shape(model, adapter)[0]} x {shape(model, adapter)[1]}")
    return record, str(where)


def calibrated(ctx: ResponseContext) -> ResponseRows:
    record, where = load_weights(ctx.model, ctx.adapter, ctx.options["weights"])
    families = record["families"]
    theta = torch.tensor(np.array([record["weights"][f] for f in families]), dtype=torch.float32,
                         device=ctx.handle.device)  # [F, L, H]

    def weighted(layer, block):  # [F, H, Q, T] -> [Q, T]
        return torch.einsum("fhqt,fh->qt", block, theta[:, layer - 1])

    per_block, logits = head_readings(ctx.handle, ctx.ids, ctx.prompt_length, families, weighted, NAME)
    rows = sum(per_block.values()).cpu().numpy().astype(np.float32)  # [n, T]
    return ResponseRows(rows, logits, {}, {
        "scope": "response", "weights_file": where, "sources": "every token (rows are per token)",
        "families": list(families),
        "rows": "step t: sum over the weighted families, blocks and heads of the readings from the position that "
                "predicts token t; a source's score (its tokens summed over the steps) is the fitted prediction of "
                "the drop in the response's log-probability when it is removed"})


register_method(Method(
    NAME, _refuse,
    "Calibrated attention: per-(block, head) weights over the attention from each response token's predicting "
    "position (and, where the fit chose them, norm-weighted and direct-logit readings), fitted per model by "
    "`normx calibrate` to the response's log-probability under random source removals; one forward pass",
    display="Calibrated attention", response=calibrated, response_only=True, label_dependent=True, layered=False,
    predicts=True, exclusive=True, reading="signed", supports=_supports,
    options=[SOURCES_OPTION, Option("weights", None, "a calibrated weights file (None: the ones stored for the model's "
                    "fingerprint by `normx calibrate --store`, or shipped with its preset)", str, none=True)],
    cost=lambda tokens, targets, options: 1.2))
