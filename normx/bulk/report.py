"""``normx show DIR``: one HTML report of a folder written by ``normx attribute``: the run's settings, the corpus
summary (per label, the words with the largest total and mean attribution: :class:`WordSummary`), then every
example, sortable by id, prediction, confidence and length, paged.

The report is ``index.html`` plus the examples' data in chunk files (``rows-00000.js``, 500 rows each) that the page
loads when a page of examples shows, so that 100,000 rows open as quickly as 1,000: the index holds only what
sorting needs (prediction, confidence, length and the start of the text). The highlighted views are drawn by the
page with the colours and scale rule of the Python views (:mod:`normx.explanations.html`). Written into
``DIR/_report/`` by default: the leading underscore keeps Parquet readers of ``DIR`` off it.
"""

from __future__ import annotations

import html
import json
from collections.abc import Iterator
from pathlib import Path

from normx.bulk.read import SUMMARY_COLUMNS, SummaryBuilder, iter_records, manifest, shard_files
from normx.errors import NormxError
from normx.explanations.display import AMOUNT, SPACE_SIGN, WHITESPACE_SIGNS
from normx.explanations.html import NEGATIVE, POSITIVE
from normx.explanations.words import word_units
from normx.methods import get_method
from normx.models.identity import describe

CHUNK = 500
_COLUMNS = ["id", "text", "text_pair", "tokens", "offsets", "scores", "label", "prediction", "probabilities",
            "segments", "special", "error"]


def write_report(folder, out=None, top: int = 20, min_count: int = 5) -> Path:
    """Write the report of ``folder`` into ``out`` (default ``folder/_report``); returns the index file."""
    folder = Path(folder).expanduser()
    shard_files(folder)  # no such folder, or no shards in it: said before anything is written
    target = Path(out).expanduser() if out is not None else folder / "_report"
    target.mkdir(parents=True, exist_ok=True)
    for old in target.glob("rows-*.js"):
        old.unlink()
    index, chunk, number = [], [], 0
    words = WordSummary()
    for record in iter_records(folder, list(dict.fromkeys(_COLUMNS + SUMMARY_COLUMNS))):  # one pass for all
        words.add(record)
        probabilities = {p["label"]: p["probability"] for p in record.get("probabilities") or []}
        prediction = record.get("prediction")
        confidence = probabilities.get(str(prediction)) if prediction is not None else None
        index.append([record["id"], None if prediction is None else str(prediction),
                      None if confidence is None else round(confidence, 4), len(record.get("tokens") or []),
                      (record["text"] or "")[:160], record.get("error")])
        chunk.append(_row(record))
        if len(chunk) == CHUNK:
            _write_chunk(target, number, chunk)
            chunk, number = [], number + 1
    if chunk:
        _write_chunk(target, number, chunk)
    words = words.result()
    page = _PAGE.replace("{{title}}", html.escape(f"normx attributions: {folder.name}"))
    page = page.replace("{{settings}}", _settings(manifest(folder), words))
    page = page.replace("{{summary}}", _summary(words, top, min_count))
    page = page.replace("{{signs}}", json.dumps(WHITESPACE_SIGNS, ensure_ascii=False))
    page = page.replace("{{space}}", SPACE_SIGN)
    page = page.replace("{{index}}", json.dumps(index, ensure_ascii=False).replace("</", "<\\/"))
    page = page.replace("{{chunk}}", str(CHUNK)).replace("{{pos}}", ",".join(map(str, POSITIVE)))
    page = page.replace("{{neg}}", ",".join(map(str, NEGATIVE))).replace("{{amount}}", ",".join(map(str, AMOUNT)))
    reading = _reading(manifest(folder).get("settings", {}))
    page = page.replace("{{reading}}", reading).replace("{{legend}}", _LEGENDS[reading])
    file = target / "index.html"
    file.write_text(page, encoding="utf-8")
    return file


class WordSummary(SummaryBuilder):
    """The report's corpus summary: per label, the words of each row's predicted view (:func:`report_words`: sub-word
    pieces joined by the word boundaries of :mod:`normx.explanations.words`, punctuation-only words left out), their
    total and mean attribution and counts."""

    def __init__(self):
        super().__init__("word")

    def units(self, record: dict) -> list:
        return report_words(record)


def report_words(record: dict) -> Iterator[tuple[str, float]]:
    """(word, score) of one row's main view: its tokens grouped into the words of
    :func:`normx.explanations.words.word_units` (nltk's words over the tokenizer's character offsets, so "un", "fl",
    "in", "ching", "ly" are "unflinchingly" and a comma is a word of its own), their scores summed; special tokens,
    tokens outside any word and words without a letter or digit ("." "," "--") left out."""
    tokens, scores = record["tokens"], record["scores"]
    special = record.get("special") or [False] * len(tokens)
    segments = record.get("segments") or [0] * len(tokens)
    offsets = [tuple(o) for o in record.get("offsets") or []]
    for members, fields in word_units(record["text"], record.get("text_pair"), offsets, segments, special):
        word = fields["token"]
        values = [float(scores[i]) for i in members if scores[i] is not None]
        if word is None or fields["special"] or not values or not any(ch.isalnum() for ch in word):
            continue
        yield word, sum(values)


_LEGENDS = {
    "signed": "Red: the unit pushes toward the label, purple: away from it; each row at full colour at its own largest "
              "|score|.",
    "relative": "The scores are relative (a logit times a norm: their zero means nothing), so each row is drawn in "
                "one colour from its lowest score (none) to its highest (full): compare tokens, not signs.",
    "magnitude": "The scores are unsigned magnitudes: darker = larger, each row at full colour at its own largest.",
}


def _reading(settings: dict) -> str:
    """How the run's scores read (its method's ``reading``; relative for a method this normx does not know)."""
    try:
        method = get_method(settings.get("method"))
        return method.reading_for(settings.get("options") or {})
    except NormxError:
        return "relative"


def _row(record: dict) -> list:
    """What the page draws one example from: text(s), and per token its span, segment, special flag and score."""
    units = [[a, b, seg, int(bool(sp)), None if s is None else round(float(s), 5), tok]
             for (a, b), seg, sp, s, tok in zip(record.get("offsets") or [], record.get("segments") or [],
                                                  record.get("special") or [], record.get("scores") or [],
                                                  record.get("tokens") or [])]
    return [record["id"], record["text"], record.get("text_pair"), record.get("label"), units]


def _write_chunk(target: Path, number: int, rows: list) -> None:
    data = json.dumps(rows, ensure_ascii=False).replace("</", "<\\/")
    (target / f"rows-{number:05d}.js").write_text(f"normxChunk({number}, {data});\n", encoding="utf-8")


def _settings(data: dict, summary) -> str:
    settings = data.get("settings", {})
    model = settings.get("model")
    shown = {"model": None if model is None else describe(model), "method": settings.get("method"),
             "data": settings.get("source"),
             "rows": data.get("rows", summary.rows), "rows that could not be explained": summary.skipped,
             "normx": data.get("normx")}
    return "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(str(v))}</td></tr>" for k, v in shown.items()
                   if v is not None)


def _summary(summary, top: int, min_count: int) -> str:
    parts = []
    for label in summary.labels:
        for by, title in (("total", "largest total"), ("mean", f"largest mean (at least {min_count} occurrences)")):
            items = summary.top(label, top, by, min_count if by == "mean" else 1)
            rows = "".join(f"<tr><td>{html.escape(s.unit)}</td><td>{s.total:.3f}</td><td>{s.mean:.3f}</td>"
                           f"<td>{s.count}</td></tr>" for s in items)
            parts.append(f'<div class="box"><h3>{html.escape(label)}: {summary.unit}s, {title}</h3>'
                         f"<table><tr><th>{summary.unit}</th><th>total</th><th>mean</th><th>count</th></tr>{rows}"
                         "</table></div>")
    return f'<div class="boxes">{"".join(parts)}</div>'


_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{{title}}</title>
<style>
body{font-family:system-ui,-apple-system,'Segoe UI',sans-serif;font-size:14px;margin:20px;color:#111}
table{border-collapse:collapse}td,th{padding:3px 8px;border-bottom:1px solid #eee;text-align:left;vertical-align:top}
.boxes{display:flex;flex-wrap:wrap;gap:16px}.box h3{font-size:13px;margin:8px 0}
.u{border-radius:3px;padding:1px 1px}.sp{font-size:11px;color:#666;border:1px dashed #bbb}
#examples td.text{max-width:900px;line-height:1.9}button{margin-right:4px}th.sort{cursor:pointer;color:#225}
</style></head><body>
<h1 style="font-size:18px">{{title}}</h1>
<table>{{settings}}</table>
<h2 style="font-size:16px">What the corpus says</h2>
<p style="color:#333">Per explained label: the words with the largest total and mean attribution over every row
(each row's predicted view; a word's sub-word tokens summed; special tokens and punctuation left out).</p>
{{summary}}
<h2 style="font-size:16px">Examples</h2>
<p style="color:#555">Click a column to sort. {{legend}}</p>
<div id="pager"></div>
<table id="examples"><thead><tr><th class="sort" data-key="0">id</th><th class="sort" data-key="1">prediction</th>
<th class="sort" data-key="2">confidence</th><th class="sort" data-key="3">length</th><th>text</th></tr></thead>
<tbody></tbody></table>
<script>
const INDEX = {{index}};
const CHUNK = {{chunk}}, PER_PAGE = 50, POS = [{{pos}}], NEG = [{{neg}}], AMOUNT = [{{amount}}];
const READING = '{{reading}}';
const chunks = {}, waiting = {};
let order = INDEX.map((_, i) => i), page = 0, sortKey = 0, ascending = true;
function normxChunk(n, rows) { chunks[n] = rows; (waiting[n] || []).forEach(f => f()); delete waiting[n]; }
function load(n, then) {
  if (chunks[n]) return then();
  (waiting[n] = waiting[n] || []).push(then);
  if (waiting[n].length > 1) return;
  const s = document.createElement('script'); s.src = 'rows-' + String(n).padStart(5, '0') + '.js';
  document.head.appendChild(s);
}
const ESCAPES = {'&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;'};
function esc(t) { return String(t).replace(/[&<>"]/g, c => ESCAPES[c]); }
const SIGNS = {{signs}}, SPACE = '{{space}}';
function shown(t) {  // normx.explanations.display.visible_whitespace: a white-space unit as visible signs
  const blank = t.length > 0 && t.trim() === '';
  for (const [sign, mark] of Object.entries(SIGNS)) t = t.split(sign).join(mark);
  return blank ? t.replace(/\\s/g, SPACE) : t;
}
function colour(v, scale) {
  const [low, high] = scale;
  if (v === null || !isFinite(v) || high - low <= 0) return 'transparent';
  const signed = READING === 'signed';
  const k = signed ? Math.min(Math.abs(v) / high, 1) : Math.max(0, Math.min(1, (v - low) / (high - low)));
  if (k === 0) return 'transparent';
  const c = signed ? (v > 0 ? POS : NEG) : AMOUNT;
  return 'rgba(' + c.join(',') + ',' + k.toFixed(3) + ')';
}
function scaleOf(units) {  // normx.explanations.display.scale_for: over the units that are not special tokens
  const v = units.filter(u => !u[3] && u[4] !== null && isFinite(u[4])).map(u => u[4]);
  if (!v.length) return [0, 0];
  if (READING === 'relative') return [Math.min(...v), Math.max(...v)];
  return [0, Math.max(...v.map(Math.abs))];
}
function view(row) {
  const [id, text, pair, label, units] = row, texts = [text, pair || ''], cursor = [0, 0];
  const scale = scaleOf(units);
  let out = '';
  units.forEach(u => {
    const [a, b, seg, special, v, tok] = u, tip = esc(tok + ': ' + (v === null ? '' : v));
    if (!special && b > a && (seg === 0 || seg === 1)) {
      if (seg === 1 && cursor[1] === 0 && out) out += ' <span style="color:#999">‖</span> ';
      out += esc(texts[seg].slice(cursor[seg], a)) + '<span class="u" style="background:' + colour(v, scale) +
        '" title="' + tip + '">' + esc(shown(texts[seg].slice(a, b))) + '</span>';
      cursor[seg] = b;
    } else {
      out += '<span class="u sp" style="background:' + colour(v, scale) + '" title="' + tip + '">' + esc(tok) +
        '</span>';
    }
  });
  return '<div style="font-size:11px;color:#777">label ' + esc(label) + '</div>' + out;
}
function render() {
  const body = document.querySelector('#examples tbody'), pages = Math.max(1, Math.ceil(order.length / PER_PAGE));
  page = Math.min(Math.max(page, 0), pages - 1);
  const shown = order.slice(page * PER_PAGE, (page + 1) * PER_PAGE);
  document.getElementById('pager').innerHTML = '<button onclick="page=0;render()">first</button>' +
    '<button onclick="page--;render()">previous</button> page ' + (page + 1) + ' of ' + pages + ' (' +
    order.length + ' examples) <button onclick="page++;render()">next</button>' +
    '<button onclick="page=' + (pages - 1) + ';render()">last</button>';
  body.innerHTML = shown.map(i => { const r = INDEX[i];
    return '<tr data-row="' + i + '"><td>' + r[0] + '</td><td>' + esc(r[1] === null ? '—' : r[1]) + '</td><td>' +
      (r[2] === null ? '' : r[2].toFixed(3)) + '</td><td>' + r[3] + '</td><td class="text">' +
      (r[5] ? '<i style="color:#a00">' + esc(r[5]) + '</i>' : esc(r[4])) + '</td></tr>'; }).join('');
  shown.forEach(i => { if (INDEX[i][5]) return; const n = Math.floor(i / CHUNK);
    load(n, () => { const cell = body.querySelector('tr[data-row="' + i + '"] td.text');
      if (cell) cell.innerHTML = view(chunks[n][i % CHUNK]); }); });
}
document.querySelectorAll('th.sort').forEach(th => th.addEventListener('click', () => {
  const key = +th.dataset.key; ascending = key === sortKey ? !ascending : key === 0;
  sortKey = key; const sign = ascending ? 1 : -1;
  order.sort((a, b) => { const x = INDEX[a][key], y = INDEX[b][key];
    if (x === y) return INDEX[a][0] - INDEX[b][0]; if (x === null) return 1; if (y === null) return -1;
    return (x < y ? -1 : 1) * sign; });
  page = 0; render(); }));
render();
</script></body></html>
"""
