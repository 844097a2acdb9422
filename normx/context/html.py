"""A context attribution as HTML in normx's colour language (:mod:`normx.explanations.display`): the response, then
the context with every source highlighted by its score for the whole response (hover a source for its score).
Rendering returns the markup; it prints nothing."""

from __future__ import annotations

import html

from normx.explanations.display import scale_for
from normx.explanations.html import legend, span

_BOX = ("font-family:system-ui,-apple-system,'Segoe UI',sans-serif;font-size:14px;line-height:1.9;margin:6px 0;"
        "color:#111")
_TITLE = "font-size:13px;color:#333;margin-top:4px"


class _Sources:
    """The sources as a view for the shared scale (none is a special token)."""

    def __init__(self, count: int):
        self.tokens, self.special = [""] * count, [False] * count


def context_html(result) -> str:
    scores = result.scores
    reading = result.reading
    scale = scale_for(_Sources(len(scores)), [scores], reading)
    parts, cursor = [], 0
    for k, (source, score) in enumerate(zip(result.sources, scores)):
        parts.append(html.escape(result.context[cursor:source.start]).replace("\n", "<br>"))
        parts.append(span(source.text, float(score), scale, False, f"source {k}: {float(score):+.4g}"))
        cursor = source.end
    parts.append(html.escape(result.context[cursor:]).replace("\n", "<br>"))
    query = f'<div style="{_TITLE}">query: {html.escape(result.query)}</div>' if result.query else ""
    return (f'<div class="normx-context" style="{_BOX}">'
            f'<div style="{_TITLE}">{html.escape(result.method)}: which part of the context the response came from '
            f"({len(scores)} sources; {html.escape(scale.range_text())})</div>{query}"
            f'<div><b>response:</b> {html.escape(result.response)}</div>'
            f'<div style="white-space:normal">{"".join(parts)}</div>'
            f'{legend(reading, ("toward the response", "away from it"), "hover a source for its score")}</div>')
