"""explain_generation's response level: a method's ``Method.response`` computation run once per sequence for the
whole response (``scope="response"``, and always for ``Method.response_only`` methods: the ablations), its rows
becoming the Generation's per-step rows (NaN at and after each step's own position, as every Generation's)."""

from __future__ import annotations

import numpy as np

from normx.core.inputs import Encoded
from normx.errors import InvalidInputError
from normx.explanations.generation_reading import mask_after, step_readings
from normx.methods import list_methods
from normx.methods.registry import get_method
from normx.methods.response import ResponseContext

SCOPES = ("step", "response")


def at_response_level(plan, scope: str | None) -> bool:
    """Whether ``scope`` (None: the method's own) runs ``plan.method`` at the response level; refuses a scope the
    method does not have."""
    method = plan.method
    if scope is not None and scope not in SCOPES:
        raise InvalidInputError(f"scope={scope!r} is not allowed; use one of {SCOPES} (or None: the method's own)")
    if method.response_only:
        if scope == "step":
            raise InvalidInputError(f"{method.name} scores the whole response from its own forward passes; it has "
                                    "no per-step computation (leave scope unset)")
        return True
    if scope == "response" and method.response is None:
        having = [name for name in list_methods(experimental=True, response_only=True)
                  if get_method(name).response is not None]
        raise InvalidInputError(f"{method.name} has no response-level computation; scope='response' is for "
                                f"{', '.join(having)}")
    return scope == "response"


def response_level(plan, tokenizer, prompts: list[str], items: list[Encoded], lengths: list[int], batch_size: int,
                   steps: bool = False):
    """Each sequence's rows from the method's response computation (``steps``: its per-step computation from one
    forward pass, ``Method.steps``, whose rows are the steps' own): (scores, probabilities, predictions, shown
    alternatives, diagnostics, settings added per sequence), as explain_generation's other ways."""
    compute = plan.method.steps if steps else plan.method.response
    scope = {} if steps else {"scope": "response"}
    scores, probabilities, predictions, shown, diagnostics, added = [], [], [], [], [], []
    for prompt, item, length in zip(prompts, items, lengths):
        n = len(item.ids) - length
        if n == 0 or length == 0:
            scores.append(np.full((1, n, len(item.ids)), np.nan, np.float32))
            probabilities.append(np.zeros(n, np.float32))
            predictions.append([])
            shown.append([])
            diagnostics.append({})
            added.append(dict(scope))
            continue
        ctx = ResponseContext(plan.handle, tokenizer, prompt, item, length, dict(plan.options), batch_size)
        out = compute(ctx)
        matrix = np.asarray(out.rows, np.float32).copy()
        if matrix.shape != (n, len(item.ids)):
            raise RuntimeError(f"method {plan.method.name!r} gave response rows of shape {matrix.shape}, expected "
                               f"{(n, len(item.ids))}")
        mask_after(matrix, length)
        probs, best, alternatives = step_readings(plan.labels, out.logits, item.ids[length:])
        probabilities.append(probs)
        predictions.append(best)
        shown.append(alternatives)
        scores.append(matrix[None])
        diagnostics.append({name: list(values) for name, values in out.diagnostics.items()})
        added.append(dict(out.settings))
    return scores, probabilities, predictions, shown, diagnostics, added
