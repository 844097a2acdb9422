"""Context attribution: which part of a context a causal LM's response came from (:func:`explain_context`, its
result :class:`ContextAttribution`).

A context's sources (sentences, paragraphs, lines, words, or texts the user gives) are scored by any method that
explains a generation, through :func:`normx.explain_generation`: the ablations (``leave_one_out``, ``contextcite``)
score the sources themselves; every other method's token-level rows are summed over the response's steps and each
source's tokens (:func:`~normx.context.result.source_scores`); the gradient methods run at the response level (one
backward pass of the response's log-probability).

Layer: above ``normx.explanations`` (imports it, ``methods``, ``core`` and ``models``); ``cli``, ``serving`` and
``evaluation`` may import it.
"""

from normx.context.explain import DEFAULT_TEMPLATE, explain_context
from normx.context.result import ContextAttribution, Source, source_scores

__all__ = ["DEFAULT_TEMPLATE", "ContextAttribution", "Source", "explain_context", "source_scores"]
