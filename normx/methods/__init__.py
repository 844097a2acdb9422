"""Attribution methods: the registry (:mod:`~normx.methods.registry`: what a method is, its options, the context it
computes from) and the built-in methods, which register themselves on import: the head-on-top methods (NormXLogit,
LogAt, ℓ2; :mod:`~normx.methods.headontop`) and their experimental variants (:mod:`~normx.methods.variants`), the
gradient methods, the random baselines (random, recency), DecompX (BERT-style encoders and, as decoder DecompX,
causal decoders), the context-mixing methods (GlobEnc, ALTI, Value Zeroing) and the decoder methods
(:mod:`~normx.methods.decoder`: attention, norm-based attention, ALTI-Logit, AttnLRP and the experimental
Attention-Logit). The numerics they share are :mod:`~normx.methods.numerics`'s. The ablations over a response's sources
(leave-one-out, ContextCite; :mod:`~normx.methods.ablation`); the gradient methods' response level
(:mod:`~normx.methods.response`) and every generation step from one forward pass
(:mod:`~normx.methods.step_gradients`), which each method's own registration names.

Layer 3: imports ``normx.core`` and ``normx.models``; ``normx.explanations`` runs the methods by name.
"""

from normx.methods import (  # noqa: F401 (registration)
    ablation,
    baselines,
    calibrated,
    decoder,
    decompx,
    gradients,
    headontop,
    mixing,
    variants,
)
from normx.methods.ablation import budgeted  # noqa: F401 (registration: built on the ablation methods)
from normx.methods.registry import (
    RESERVED_OPTIONS,
    Context,
    Method,
    Option,
    describe_methods,
    display_name,
    get_method,
    list_methods,
    methods_for,
    register_method,
)

__all__ = ["RESERVED_OPTIONS", "Context", "Method", "Option", "describe_methods", "display_name", "get_method",
           "list_methods", "methods_for", "register_method"]
