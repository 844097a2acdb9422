"""Which registered methods also run at the response level (``Method.response``), and how: the gradient methods
with ONE backward pass of the response's total log-probability (:func:`normx.methods.response.gradient_response`)
instead of one backward pass per generated token. Imported after the methods it extends (:mod:`normx.methods`), it
registers each again with its ``response`` computation; everything else about the method is as registered.

- ``gradient_norm``: the gradient of sum_t log p(y_t | y_<t) w.r.t. each word embedding, aggregated as the method's
  ``aggregation`` option says (l1 by default);
- ``gradient_x_input``: that gradient times the word embedding, aggregated the same way;
- ``attnlrp``: input embedding x gradient summed over the dimensions, the gradient taken through AttnLRP's rules
  (:func:`normx.methods.decoder.lrp.context.attnlrp_rules`). Differentiating the log-probability starts the relevance
  at each step's logits as d log p / d z = onehot(y) - softmax(z): the token's logit against the expected logit.

Left for later: integrated_gradients (its path integral over the response objective), the decoder DecompX and
ALTI-Logit (a response row from their per-position decompositions).
"""

from __future__ import annotations

from dataclasses import replace

from normx.methods.decoder.lrp.context import attnlrp_rules
from normx.methods.decoder.lrp.method import NAME as ATTNLRP
from normx.methods.decoder.lrp.method import check_model as attnlrp_check
from normx.methods.gradients import aggregate
from normx.methods.registry import get_method, register_method
from normx.methods.response import gradient_response


def _aggregated(vectors, options):
    return aggregate(vectors, options.get("aggregation", "sum"))


RESPONSE_LEVEL = {
    "gradient_norm": gradient_response(False, aggregate=_aggregated),
    "gradient_x_input": gradient_response(True, aggregate=_aggregated),
    ATTNLRP: gradient_response(True, rules=lambda model, mask: attnlrp_rules(model, mask, ATTNLRP),
                               check=lambda ctx: attnlrp_check(ctx.model, ctx.adapter)),
}

for _name, _compute in RESPONSE_LEVEL.items():
    register_method(replace(get_method(_name), response=_compute), overwrite=True)
