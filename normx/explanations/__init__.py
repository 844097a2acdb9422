"""What ``normx.explain`` makes: the pipeline that checks the arguments, encodes and batches the texts and runs a
registered method on each batch (:mod:`~normx.explanations.explain`), the typed result
(:class:`~normx.explanations.result.Explanation`), its word view (:mod:`~normx.explanations.words`) and the one
colour-scale rule every display shares (:mod:`~normx.explanations.display`).

Layer 4: imports ``normx.methods``, ``normx.core`` and ``normx.models``.
"""
