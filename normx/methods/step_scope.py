"""Which registered methods compute every generation step from one forward pass (``Method.steps``,
:mod:`normx.methods.step_gradients`): Gradient Norm, Gradient×Input, Integrated Gradients and AttnLRP. Imported
after the methods it extends (:mod:`normx.methods`), it registers each again with its ``steps`` computation;
everything else about the method is as registered."""

from __future__ import annotations

from dataclasses import replace

from normx.methods.decoder.lrp.context import attnlrp_rules
from normx.methods.decoder.lrp.method import NAME as ATTNLRP
from normx.methods.decoder.lrp.method import check_model as attnlrp_check
from normx.methods.registry import get_method, register_method
from normx.methods.step_gradients import gradient_steps, integrated_gradients_steps

STEP_METHODS = {
    "gradient_norm": gradient_steps(False),
    "gradient_x_input": gradient_steps(True),
    "integrated_gradients": integrated_gradients_steps,
    ATTNLRP: gradient_steps(True, rules=lambda model, mask: attnlrp_rules(model, mask, ATTNLRP),
                            check=lambda ctx: attnlrp_check(ctx.model, ctx.adapter), relevance=True),
}

for _name, _compute in STEP_METHODS.items():
    register_method(replace(get_method(_name), steps=_compute), overwrite=True)
