"""Self-contained HTML views of explanations, for notebooks (``_repr_html_``) and files (``to_html``).

No external assets and no script: inline styles only, so a view shows the same in Jupyter, in a saved notebook, in
an e-mail or in a file opened from disk. The colours follow the demo's (red: the unit pushes toward the label,
purple: away from it; stronger = larger |score|) and the shared scale rule
(:func:`normx.explanations.display.scale_of`: each view is scaled by its largest |score| among the units that are
not special tokens). Every function returns a string. (Explanations are passed in, not imported: the result types
call these functions for their own views.)
"""

from __future__ import annotations

import html
from collections.abc import Sequence

import numpy as np

from normx.explanations.display import scale_of

POSITIVE, NEGATIVE = (239, 68, 60), (128, 90, 213)  # the demo's highlighted-text colours
_BOX = ("font-family:system-ui,-apple-system,'Segoe UI',sans-serif;font-size:14px;line-height:1.9;"
        "margin:6px 0;color:#111")
_TITLE = "font-size:12px;color:#555;margin-top:4px"


def colour(value: float, scale: float) -> str:
    """The CSS background of a score on a scale (transparent for 0, NaN or a zero scale)."""
    if not np.isfinite(value) or scale <= 0 or value == 0:
        return "transparent"
    rgb = POSITIVE if value > 0 else NEGATIVE
    return f"rgba({rgb[0]},{rgb[1]},{rgb[2]},{min(abs(value) / scale, 1.0):.3f})"


def span(text: str, value: float, scale: float, special: bool = False, tip: str = "") -> str:
    """One unit as a span coloured by ``value`` on ``scale``, ``tip`` as its tooltip (special tokens small and
    dashed)."""
    style = f"background:{colour(value, scale)};border-radius:3px;padding:1px 1px"
    if special:
        style += ";font-size:11px;color:#666;border:1px dashed #bbb"
    return f'<span class="normx-unit" style="{style}" title="{html.escape(tip)}">{html.escape(text)}</span>'


def highlighted(view, row: np.ndarray, scale: float | None = None) -> str:
    """The units of ``view`` as highlighted spans in reading order, with the text between them kept (a pair's
    second text after a separator); each span's tooltip gives its token and score."""
    scale = scale_of(view, [row]) if scale is None else scale
    texts = {0: view.text, 1: view.text_pair or ""}
    out, cursor = [], {0: 0, 1: 0}
    for i, token in enumerate(view.tokens):
        start, end = view.offsets[i]
        segment = view.segments[i] if view.segments[i] in texts else -1
        value = float(row[i])
        tip = f"{token}: {value:+.4g}"
        if segment >= 0 and end > start and not view.special[i]:
            if segment == 1 and cursor[1] == 0 and out:
                out.append(' <span style="color:#999">‖</span> ')
            out.append(html.escape(texts[segment][cursor[segment]:start]))
            out.append(span(texts[segment][start:end], value, scale, False, tip))
            cursor[segment] = end
        else:
            out.append(span(token, value, scale, True, tip))
    return "".join(out)


def legend(scale: float | None = None) -> str:
    """The colour key; ``scale``: the |score| of full colour (None: each view or row has its own)."""
    full = "each view at full colour at its own largest |score|" if scale is None else \
        f"full colour at |score| = {scale:.4g}"
    return (f'<div style="{_TITLE}"><span style="background:{colour(1, 1)};padding:0 6px">&nbsp;</span> toward the '
            f'label &nbsp; <span style="background:{colour(-1, 1)};padding:0 6px">&nbsp;</span> away from it '
            f"&nbsp; {full}; hover a unit for its score</div>")


def _heading(e) -> str:
    if e.regression:
        what = f"predicted score <b>{float(e.prediction):.4f}</b>"
    else:
        p = e.probabilities.get(e.prediction)
        what = f"prediction <b>{html.escape(str(e.prediction))}</b>" + ("" if p is None else f" (p = {p:.3f})")
    return (f'<div style="{_TITLE}">{what} · {html.escape(e.method)} · {html.escape(e.family or e.kind)} · '
            f"{e.unit}s</div>")


def _view(title: str, view, row: np.ndarray) -> str:
    scale = scale_of(view, [row])
    return (f'<div style="{_TITLE}">{html.escape(title)} <span style="color:#999">(full colour at |score| = '
            f'{scale:.4g})</span></div><div class="normx-view">{highlighted(view, row, scale)}</div>')


def explanation_html(e, layer: int | None = None, words: bool = True) -> str:
    """One explanation: the heading, a view per label at ``layer`` (default: the last computed), the contrast of
    the first two labels, and (collapsed) the word view and every layer of the first label."""
    j = e.layer_index(layer)
    parts = [_heading(e)]
    for k, label in enumerate(e.labels):
        parts.append(_view(f"label {label} · layer {e.layers[j]}", e, e.scores[k, j]))
    if len(e.labels) > 1 and not e.regression:
        parts.append(_view(f"contrast: {e.labels[0]} − {e.labels[1]} · layer {e.layers[j]}", e,
                           e.scores[0, j] - e.scores[1, j]))
    if words and e.unit == "token":
        w = e.words()
        parts.append(_details("words (sum of their tokens)", _view(f"label {w.labels[0]} · layer {w.layers[j]}", w,
                                                                  w.scores[0, j])))
    if len(e.layers) > 1:
        rows = [_view(f"layer {layer_}", e, e.scores[0, i]) for i, layer_ in enumerate(e.layers)]
        parts.append(_details(f"every layer (label {e.labels[0]})", "".join(rows)))
    return f'<div class="normx-explanation" style="{_BOX}">{"".join(parts)}{legend()}</div>'


def _details(summary: str, body: str) -> str:
    return f'<details style="margin-top:4px"><summary style="{_TITLE};cursor:pointer">{html.escape(summary)}' \
           f"</summary>{body}</details>"


def explanations_html(items: Sequence) -> str:
    """Several explanations, one after the other, each under its text's number."""
    return "".join(f'<div style="{_TITLE};font-weight:600">#{i}</div>{explanation_html(e)}'
                   for i, e in enumerate(items))


def generation_html(g) -> str:
    """A generation (:class:`~normx.explanations.generation_result.Generation`): the prompt and the continuation,
    then a matrix with one row per generated token and one column per token of the sequence, each row scaled by
    its own largest |score| (the row of the token at index p has p cells)."""
    head = (f'<div style="{_TITLE}">{html.escape(g.method)} · layer {g.layers[-1]} · {g.steps} generated tokens'
            f'</div><div>{html.escape(g.text[:g.offsets[g.prompt_length][0]] if g.steps else g.text)}'
            f'<b style="background:#eef">{html.escape(g.continuation)}</b></div>')
    cell = "padding:2px 4px;font-size:11px;white-space:pre;border:1px solid #eee"
    header = "".join(f'<th style="{cell};font-weight:400;color:#555">{html.escape(t)}</th>' for t in g.tokens[:-1])
    rows = []
    for t, p in enumerate(g.generated):
        row = g.rows()[t]
        finite = np.abs(row[np.isfinite(row)])
        scale = float(finite.max()) if finite.size else 0.0
        cells = "".join(f'<td style="{cell};background:{colour(float(v), scale)}" '
                        f'title="{html.escape(g.tokens[i])}: {float(v):+.4g}"></td>' for i, v in enumerate(row))
        cells += f'<td style="{cell}"></td>' * (len(g.tokens) - 1 - p)
        rows.append(f'<tr><th style="{cell};text-align:right">{html.escape(g.tokens[p])} '
                    f'<span style="color:#888">p={g.probabilities[t]:.2f}</span></th>{cells}</tr>')
    table = (f'<div style="overflow-x:auto"><table style="border-collapse:collapse;margin-top:6px">'
             f'<tr><th style="{cell}"></th>{header}</tr>{"".join(rows)}</table></div>')
    return f'<div class="normx-generation" style="{_BOX}">{head}{table}{legend(None)}</div>'


def page(body: str, title: str = "normx") -> str:
    """A whole HTML document around views (for files: ``normx explain --html``)."""
    return (f'<!doctype html><html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title></head>'
            f'<body style="margin:20px">{body}</body></html>\n')
