"""One context manager puts AttnLRP's rules on a decoder's backward pass, for the forward passes this thread runs
inside it, with the model's own modules and nothing patched.

Inside :func:`attnlrp_rules` the model runs with its own attention implementation in eval mode, held exclusively
with its parameters' ``requires_grad`` off (:func:`normx.core.concurrency.frozen_parameters`), and thread-scoped
forward hooks (:func:`normx.core.hooks.hooked`)
replace module outputs by values equal to them in the forward direction whose gradient is the rule's
(:mod:`normx.methods.decoder.lrp.rules`):

- every normalisation (RMSNorm, Gemma's 1 + w RMSNorm, LayerNorm; the final norm and the attention's q_norm /
  k_norm included): its output, recomputed with the scale held constant (identity rule), must equal the module's;
- each self-attention: recomputed from its own projections with the softmax and uniform rules, checked against its
  probabilities and output (:mod:`normx.methods.decoder.lrp.attention`);
- each gated MLP down(act(gate(y)) * up(y)): the activation's output gets the identity rule and, with the up
  projection's output, the uniform rule (gradient / 2 each); checked: the activation reads the gate projection's
  output, the down projection reads act * up, and the MLP returns the down projection's output (the parts named
  in messages as the model names them).

Linear layers, the residual additions, the embeddings and the head keep their own gradient (Gradient×Input there is
LRP's epsilon rule with zero epsilon, biases absorbing their share). A check that fails raises
:class:`~normx.errors.UnsupportedModelError` from inside the forward pass; the hooks and the attention setting are
removed and the parameters restored on the way out. Another thread's passes through the same modules run the hooks
as no-ops: they get the model's plain input gradients (and no parameter gradients while this one holds the model).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from normx._torch import nn, torch
from normx.core.concurrency import frozen_parameters
from normx.core.hooks import hooked, output_tensor
from normx.errors import UnsupportedModelError
from normx.methods.decoder.lrp.attention import attention_with_rules
from normx.methods.decoder.lrp.parts import BlockParts, model_parts
from normx.methods.decoder.lrp.rules import divide_gradient, identity_rule, norm_identity
from normx.methods.numerics import close, off_by
from normx.models import unwrap_model

GATE_FACTOR = 2  # the uniform rule for act(gate) * up


def _input(args: tuple, kwargs: dict) -> torch.Tensor:
    found = args[0] if args else kwargs.get("hidden_states", kwargs.get("input", kwargs.get("x")))
    return output_tensor(found)


def _gated(part: BlockParts) -> str:
    """What the down projection reads, act(gate(y)) * up(y), in the model's names for the parts."""
    return f"{part.name('act')}({part.name('gate')}(y)) * {part.name('up')}(y)"


def _product(part: BlockParts) -> str:
    """The gated MLP as the rules read it, down(act(gate(y)) * up(y)), in the model's names for the parts."""
    return f"{part.name('down')}({_gated(part)})"


class _Rules:
    """The hooks' state for one ``with`` block: each block's captured tensors until its attention / MLP has run."""

    def __init__(self, base: nn.Module, rows: torch.Tensor, method: str):
        self.base, self.rows, self.method = base, rows, method
        parts = model_parts(base, method)
        self.blocks = {part.layer: part for part in parts.blocks}
        self.modules: dict[str, nn.Module] = {f"norm:{path}": norm for path, norm in parts.norms.items()}
        self.norm_roles: dict[str, tuple[int, str]] = {}  # q_norm / k_norm: (layer, "q" / "k")
        paths = {id(module): key for key, module in self.modules.items()}
        for part in parts.blocks:
            for role, norm in (("q", part.q_norm), ("k", part.k_norm)):
                if norm is None:
                    continue
                key = paths.get(id(norm), f"norm:block {part.layer}'s {role}_norm")
                self.modules[key] = norm  # (read as a norm even where its class name does not say so)
                self.norm_roles[key] = (part.layer, role)
            for role in ("q", "k", "v", "attention", "gate", "act", "up", "down", "mlp"):
                self.modules[f"{part.layer}:{role}"] = getattr(part, role)
        self.state: dict[int, dict[str, torch.Tensor]] = {layer: {} for layer in self.blocks}

    def refuse(self, part: BlockParts, what: str) -> UnsupportedModelError:
        return UnsupportedModelError(
            f"{self.method} applies its rules to block {part.layer}'s gated MLP {type(part.mlp).__name__} as "
            f"{_product(part)}, but {what}: this model computes its MLP in a way the rules do not cover")

    def norm(self, key: str, args: tuple, kwargs: dict, output) -> torch.Tensor:
        module = self.modules[key]
        y = output_tensor(output)
        ruled = norm_identity(module, _input(args, kwargs), y)
        if ruled is None:
            raise UnsupportedModelError(
                f"{self.method} applies the identity rule to normalisations it can recompute with their scale held "
                f"constant (RMSNorm w * x / rms(x) or (1 + w) * x / rms(x), LayerNorm), and {key[5:]} "
                f"({type(module).__name__}) computes something else (or has no eps / variance_epsilon)")
        if key in self.norm_roles:  # the attention reads the projection through this norm
            layer, role = self.norm_roles[key]
            self.state[layer][f"{role}_normed"] = self.token_major(layer, role, _input(args, kwargs), ruled)
        return ruled

    def token_major(self, layer: int, role: str, x: torch.Tensor, ruled: torch.Tensor) -> torch.Tensor:
        """A q_norm / k_norm output as [B, T, heads, d] (or [B, T, heads * d]): the norm reads its projection's
        output [B, T, heads * d] as it is, cut into heads, or cut and transposed to [B, heads, T, d] (Gemma 3)."""
        part, raw = self.blocks[layer], self.state[layer].get(role)
        if raw is not None and x.shape == raw.shape and close(x, raw):
            return ruled
        if raw is not None and x.dim() == 4:
            heads = raw.reshape(*raw.shape[:2], -1, part.head_dim)
            if x.shape == heads.shape and close(x, heads):
                return ruled
            if x.shape == heads.transpose(1, 2).shape and close(x, heads.transpose(1, 2)):
                return ruled.transpose(1, 2)
        norm = part.q_norm if role == "q" else part.k_norm
        raise UnsupportedModelError(
            f"{self.method}: block {layer}'s {role}_norm ({type(norm).__name__}) does not read its {role}_proj's "
            "output (as it is, cut into heads, or cut and transposed)")

    def __call__(self, key: str, args: tuple, kwargs: dict, output):
        if key.startswith("norm:"):
            return self.norm(key, args, kwargs, output)
        layer, role = key.split(":")
        part, state = self.blocks[int(layer)], self.state[int(layer)]
        if role in ("q", "k", "v", "gate"):
            state[role] = output_tensor(output)
            return None
        if role == "attention":
            q, k = (state.pop(f"{name}_normed" if norm is not None else name, None)
                    for name, norm in (("q", part.q_norm), ("k", part.k_norm)))
            v = state.pop("v", None)
            for name in ("q", "k"):
                state.pop(name, None)
            if q is None or k is None or v is None:
                raise UnsupportedModelError(f"{self.method}: block {part.layer}'s query, key and value projections "
                                            "(and their norms) did not all run before its attention returned")
            return attention_with_rules(part, q, k, v, args, kwargs, output, self.rows, self.method)
        if role == "act":
            x, y = _input(args, kwargs), output_tensor(output)
            gate = state.pop("gate", None)
            if gate is None or gate.shape != x.shape or not close(x, gate):
                raise self.refuse(part, f"its activation does not read {part.name('gate')}'s output")
            state["act"] = y
            return divide_gradient(identity_rule(x, y), GATE_FACTOR)
        if role == "up":
            up = output_tensor(output)
            state["up"] = up
            return divide_gradient(up, GATE_FACTOR)
        if role == "down":
            act, up = state.pop("act", None), state.pop("up", None)
            x = _input(args, kwargs)
            if act is None or up is None or act.shape != x.shape or not close(x, act * up):
                raise self.refuse(part, f"{part.name('down')} does not read {_gated(part)}")
            state["down"] = output_tensor(output)
            return None
        down, out = state.pop("down", None), output_tensor(output)  # role == "mlp"
        if down is None or down.shape != out.shape or not close(out, down):
            worst = off_by(out, down)[0] if down is not None and down.shape == out.shape else float("nan")
            raise self.refuse(part, f"the MLP's output is not {part.name('down')}'s (off by {worst:.3g})")
        return None


@contextmanager
def attnlrp_rules(model: nn.Module, mask: torch.Tensor, method: str = "attnlrp") -> Iterator[None]:
    """Forward passes of ``model`` run in this thread inside the ``with`` block compute the model's own values, and
    their backward pass is AttnLRP's (input × gradient = relevance). ``mask`` [B, T]: the batch's attention mask,
    whose real tokens are the query rows the attention recomputation is checked at. The model runs in eval mode
    with its own attention implementation (no T x T probabilities unless it is eager), holding the model exclusively
    with its parameters' ``requires_grad`` off (:func:`normx.core.concurrency.frozen_parameters`: relevance is an
    input gradient, and a graph built for weight gradients keeps every linear layer's input: SmolLM2, 512 tokens,
    6 steps: 1,255 MiB peak with them, 870 without). :class:`UnsupportedModelError` for a model whose parts are
    missing or compute differently."""
    base = unwrap_model(model)
    rules = _Rules(base, mask.bool(), method)
    with frozen_parameters(base), hooked(rules.modules, rules):
        yield
