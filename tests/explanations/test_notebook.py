"""A real notebook, executed headless (nbclient with this environment's ipykernel, its native python3 kernel):
a cell that ends with normx.explain(...) shows the highlighted HTML view, and one that ends with a list of
explanations shows them all."""

from __future__ import annotations

from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat", reason="pip install nbformat nbclient ipykernel (the test extra)")
nbclient = pytest.importorskip("nbclient", reason="pip install nbformat nbclient ipykernel (the test extra)")
pytest.importorskip("ipykernel", reason="pip install ipykernel (the test extra)")

TESTS = Path(__file__).resolve().parents[1]


def test_a_notebook_cell_shows_the_highlighted_view(tmp_path):
    cells = [
        f"import sys\nsys.path.insert(0, {str(TESTS)!r})\nimport tiny, normx\n"
        "model, tokenizer = tiny.build('BertForSequenceClassification')",
        "normx.explain(model, tokenizer, 'a gripping, beautifully acted film')",
        "normx.explain(model, tokenizer, ['a gripping film', 'a dull plot'], layer='all')",
    ]
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    notebook.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    client = nbclient.NotebookClient(notebook, timeout=300, kernel_name="python3",
                                     resources={"metadata": {"path": str(tmp_path)}})
    client.execute()
    single, several = (cell.outputs[0]["data"] for cell in notebook.cells[1:])
    assert "text/html" in single and 'class="normx-unit"' in single["text/html"]
    for word in ("gripping", "beautifully", "acted", "film"):
        assert f">{word}</span>" in single["text/html"]
    assert several["text/html"].count('class="normx-explanation"') == 2
