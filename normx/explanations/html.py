"""Self-contained HTML views of explanations, for notebooks (``_repr_html_``) and files (``to_html``).

No external assets and no script: inline styles only, so a view shows the same in Jupyter, in a saved notebook, in
an e-mail or in a file opened from disk. The colours, scales and legends are the shared colour language of
:mod:`normx.explanations.display` (signed scores on a red / purple diverging scale, relative and unsigned ones on
one colour; each view says which). Every function returns a string. (Explanations are passed in, not imported: the
result types call these functions for their own views.)
"""

from __future__ import annotations

import html
from collections.abc import Sequence

import numpy as np

from normx.explanations.display import (
    AMOUNT,
    AWAY,
    READING_NOTES,
    TOWARD,
    Scale,
    contrast_reading,
    contrast_sides,
    contrast_title,
    default_contrast,
    reading_of,
    scale_for,
    visible_whitespace,
)

POSITIVE, NEGATIVE = TOWARD, AWAY  # (the names the report page reads)
_BOX = ("font-family:system-ui,-apple-system,'Segoe UI',sans-serif;font-size:14px;line-height:1.9;"
        "margin:6px 0;color:#111")
_TITLE = "font-size:13px;color:#333;margin-top:4px"


def span(text: str, value: float, scale: Scale, special: bool = False, tip: str = "") -> str:
    """One unit as a span coloured by ``value`` on ``scale``, ``tip`` as its tooltip (special tokens small and
    dashed; a white-space unit as visible signs: :func:`~normx.explanations.display.visible_whitespace`)."""
    style = f"background:{scale.css(value)};border-radius:3px;padding:1px 1px"
    if special:
        style += ";font-size:11px;color:#666;border:1px dashed #bbb"
    shown = html.escape(visible_whitespace(text))
    return f'<span class="normx-unit" style="{style}" title="{html.escape(tip)}">{shown}</span>'


def highlighted(view, row: np.ndarray, scale: Scale | None = None) -> str:
    """The units of ``view`` as highlighted spans in reading order, with the text between them kept (a pair's
    second text after a separator); each span's tooltip gives its token and score."""
    scale = scale_for(view, [row]) if scale is None else scale
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


def swatch(reading: str, sides: tuple[str, str] | None = None) -> str:
    """The colour key of a reading: the two colours of a signed scale (``sides``: what red and purple stand for, a
    contrast's :func:`~normx.explanations.display.contrast_sides`), the one colour of the others."""
    def box(rgb) -> str:
        return f'<span style="background:rgba({rgb[0]},{rgb[1]},{rgb[2]},0.85);padding:0 6px">&nbsp;</span>'
    if reading == "signed":
        toward, away = sides or ("toward the label", "away from it")
        return f"{box(TOWARD)} {html.escape(toward)} &nbsp; {box(AWAY)} {html.escape(away)}"
    return f"{box(AMOUNT)} " + ("darker = higher score" if reading == "relative" else "darker = larger")


def legend(reading: str = "signed", sides: tuple[str, str] | None = None,
           hover: str = "each view on its own range (in its title); hover a unit for its score") -> str:
    """The colour key under a group of views: what the colours mean for this reading (``sides``: what red and purple
    stand for, by default toward / away from the label), said once; ``hover``: how to read a score."""
    return (f'<div style="{_TITLE}">{swatch(reading, sides)} &nbsp; {html.escape(READING_NOTES[reading])}; '
            f"{html.escape(hover)}</div>")


def _heading(e) -> str:
    if e.regression:
        what = f"predicted score <b>{float(e.prediction):.4f}</b>"
    else:
        p = e.probabilities.get(e.prediction)
        what = f"prediction <b>{html.escape(str(e.prediction))}</b>" + ("" if p is None else f" (p = {p:.3f})")
    return (f'<div style="{_TITLE}">{what} · {html.escape(e.method)} · {html.escape(e.family or e.kind)} · '
            f"{e.unit}s</div>")


def _view(title: str, view, row: np.ndarray, reading: str | None = None, scale: Scale | None = None,
          key: str = "") -> str:
    scale = scale or scale_for(view, [row], reading)
    return (f'<div style="{_TITLE}">{html.escape(title)} <span style="color:#555">({html.escape(scale.range_text())})'
            f'</span>{key}</div><div class="normx-view">{highlighted(view, row, scale)}</div>')


def explanation_html(e, layer: int | None = None, words: bool = True) -> str:
    """One explanation: the heading, a view per label at ``layer`` (default: the last computed), the contrast of
    the predicted label and the most probable other one (``A − B``, as every view draws it:
    :func:`~normx.explanations.display.default_contrast`), and (collapsed) the word view and every layer of the first
    label."""
    j = e.layer_index(layer)
    reading = reading_of(e)
    parts = [_heading(e)]
    shared = scale_for(e, [e.scores[k, j] for k in range(len(e.labels))], reading)  # the labels on one scale
    for k, label in enumerate(e.labels):
        parts.append(_view(f"label {label} · layer {e.layers[j]}", e, e.scores[k, j], scale=shared))
    a, b = default_contrast(e, e.labels)
    if a is not None:
        row = e.scores[e.labels.index(a), j] - e.scores[e.labels.index(b), j]
        parts.append(_view(f"{contrast_title(a, b)} · layer {e.layers[j]}", e, row, contrast_reading(e),
                           key=f" &nbsp; {swatch('signed', contrast_sides(a, b))}"))
    if words and e.unit == "token":
        w = e.words()
        parts.append(_details("words (sum of their tokens)", _view(f"label {w.labels[0]} · layer {w.layers[j]}", w,
                                                                  w.scores[0, j], reading)))
    if len(e.layers) > 1:
        rows = [_view(f"layer {layer_}", e, e.scores[0, i], reading) for i, layer_ in enumerate(e.layers)]
        parts.append(_details(f"every layer (label {e.labels[0]})", "".join(rows)))
    return f'<div class="normx-explanation" style="{_BOX}">{"".join(parts)}{legend(reading)}</div>'


def _details(summary: str, body: str) -> str:
    return f'<details style="margin-top:4px"><summary style="{_TITLE};cursor:pointer">{html.escape(summary)}' \
           f"</summary>{body}</details>"


def explanations_html(items: Sequence) -> str:
    """Several explanations, one after the other, each under its text's number."""
    return "".join(f'<div style="{_TITLE};font-weight:600">#{i}</div>{explanation_html(e)}'
                   for i, e in enumerate(items))


def generation_html(g) -> str:
    """A generation (:class:`~normx.explanations.generation_result.Generation`): the prompt and the continuation,
    then a matrix with one row per generated token and one column per token of the sequence, each row on its own
    scale (:func:`~normx.explanations.display.scale_for`; the row of the token at index p has p cells)."""
    prompt = g.text[:g.offsets[g.prompt_length][0]] if g.steps else g.text
    head = (f'<div style="{_TITLE}">{html.escape(g.method)} · layer {g.layers[-1]} · {g.steps} generated tokens'
            f'</div><div>{html.escape(visible_whitespace(prompt))}'
            f'<b style="background:#eef">{html.escape(visible_whitespace(g.continuation))}</b></div>')
    reading = reading_of(g)
    cell = "padding:2px 4px;font-size:11px;white-space:pre;border:1px solid #eee"
    texts = [visible_whitespace(t) for t in g.texts]  # tokens as the text they stand for, white space visible
    header = "".join(f'<th style="{cell};font-weight:400;color:#555">{html.escape(t)}</th>' for t in texts[:-1])
    rows = []
    for t, p in enumerate(g.generated):
        row = g.rows()[t]
        scale = scale_for(_Units(g.special[:p]), [row], reading)
        cells = "".join(f'<td style="{cell};background:{scale.css(float(v))}" '
                        f'title="{html.escape(texts[i])}: {float(v):+.4g}"></td>' for i, v in enumerate(row))
        cells += f'<td style="{cell}"></td>' * (len(g.tokens) - 1 - p)
        rows.append(f'<tr><th style="{cell};text-align:right">{html.escape(texts[p])} '
                    f'<span style="color:#888">p={g.probabilities[t]:.2f}</span></th>{cells}</tr>')
    table = (f'<div style="overflow-x:auto"><table style="border-collapse:collapse;margin-top:6px">'
             f'<tr><th style="{cell}"></th>{header}</tr>{"".join(rows)}</table></div>')
    return f'<div class="normx-generation" style="{_BOX}">{head}{table}{legend(reading)}</div>'


class _Units:
    """The units a row of a generation scores (what the scale rule reads of a view)."""

    def __init__(self, special: Sequence[bool]):
        self.special, self.tokens = list(special), list(special)


def page(body: str, title: str = "normx") -> str:
    """A whole HTML document around views (for files: ``normx explain --html``)."""
    return (f'<!doctype html><html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title></head>'
            f'<body style="margin:20px">{body}</body></html>\n')
