"""What a call could leave changed on a shared model, as one comparable value (the ``unchanged`` fixture)."""

from __future__ import annotations

import torch


def model_state(model: torch.nn.Module) -> dict:
    """Everything a call could leave changed on a model: hooks, attention implementation, requires_grad, .grad,
    training flags."""
    configs = {id(m.config): m.config for m in model.modules() if getattr(m, "config", None) is not None}
    return {
        # transformers' own output-recording hooks are left out: transformers installs them once per model, for
        # good, the first time hidden states are asked for (normx's first-use check asks), and they stay inactive
        # unless a caller asks for hidden states
        "hooks": {name: (sum(map(_ours, m._forward_hooks.values())), sum(map(_ours, m._forward_pre_hooks.values())),
                         len(m._backward_hooks)) for name, m in model.named_modules()},
        "attention": sorted(str(c._attn_implementation) for c in configs.values()),
        "requires_grad": {name: p.requires_grad for name, p in model.named_parameters()},
        "grad": [name for name, p in model.named_parameters() if p.grad is not None],
        "training": {name: m.training for name, m in model.named_modules()},
    }


def _ours(hook) -> bool:
    """Not transformers' own output-capturing hooks, which it installs for good on a model that was once run with
    output_attentions / output_hidden_states (shared tiny models are, by other tests)."""
    return not getattr(hook, "__module__", "").startswith("transformers.")


def assert_no_hooks(model: torch.nn.Module) -> None:
    """No forward hook of normx's (or a test's) is left on any module of ``model``."""
    leaked = {name or "<root>": [h for h in [*m._forward_hooks.values(), *m._forward_pre_hooks.values()] if _ours(h)]
              for name, m in model.named_modules()}
    leaked = {name: hooks for name, hooks in leaked.items() if hooks}
    assert not leaked, f"hooks left on modules: {leaked}"
