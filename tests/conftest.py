"""Shared test fixtures."""

from __future__ import annotations

import pytest
from leaks import model_state


@pytest.fixture
def unchanged():
    """``watch(model)``: at the end of the test, the model must be exactly as it was when watched (no hook left,
    attention implementation, requires_grad, .grad and training flags as they were)."""
    watched = []

    def watch(model):
        watched.append((model, model_state(model)))
        return model

    yield watch
    for model, before in watched:
        assert model_state(model) == before, "the model was left changed"
