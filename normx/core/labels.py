"""A head's label space: its output columns and their names, user targets (label names, class indices, vocabulary
tokens) resolved to columns, the prediction and its probabilities read from the head's logits, and the few
vocabulary columns an LM head is run at."""

from __future__ import annotations

from dataclasses import dataclass

from normx._torch import torch
from normx.core.batch import id_tensor
from normx.core.vocabulary import vocabulary_names
from normx.errors import UnknownTargetError, UnsupportedModelError
from normx.models import HeadKind

ALL = "all"
TOP_TOKENS = 5  # vocabulary heads report the probabilities of this many top tokens


@dataclass(frozen=True)
class HeadColumns:
    """The columns to run a head at for target columns [B, K] and a foil column [B]: ``vocab`` (1-D vocabulary
    ids, each once; ``None``: every output of a classifier head) and where each target / the foil is among the
    head's outputs (``targets`` [B, K], ``foil`` [B] or None)."""

    vocab: torch.Tensor | None
    targets: torch.Tensor
    foil: torch.Tensor | None


@dataclass(frozen=True)
class Read:
    """What :meth:`LabelSpace.read` reads of N rows of a head's logits."""

    labels: list[str | float]  # the top label (the regression score)
    probabilities: list[dict[str, float]]  # the shown labels' probabilities (none for regression)
    best: list[int]  # the top column
    wanted: list[list[float]]  # the probability of each requested column


class LabelSpace:
    """The output columns of a model's head and their names."""

    def __init__(self, kind: HeadKind | str, config, tokenizer):
        self.kind = kind = HeadKind(kind)
        self.config = config
        self.tokenizer = tokenizer
        problem = getattr(config, "problem_type", None)  # (a config's attributes are slow to read: once each)
        self.multi_label = problem == "multi_label_classification"
        n = int(config.num_labels) if kind is HeadKind.SEQUENCE_CLASSIFICATION else 0
        self.regression = kind is HeadKind.SEQUENCE_CLASSIFICATION and regression_head(problem, n)
        if kind is HeadKind.SEQUENCE_CLASSIFICATION:
            if self.regression and n != 1:
                raise UnsupportedModelError(
                    f"this model does regression with {n} outputs (problem_type='regression', num_labels={n}); "
                    "normx explains single-output regression (num_labels=1) and classification heads"
                )
            id2label = getattr(config, "id2label", None) or {}
            self.names = ["score"] if self.regression else [str(id2label.get(i, f"LABEL_{i}")) for i in range(n)]
        else:
            self.names = None  # vocabulary: names come from the tokenizer

    @property
    def is_vocabulary(self) -> bool:
        return self.kind.vocabulary

    def head_columns(self, columns: torch.Tensor, foil: torch.Tensor | None = None) -> HeadColumns:
        """Where to run this head for target columns [B, K] (minus a foil column [B]): :func:`head_columns`."""
        return head_columns(columns, foil, self.is_vocabulary and not self.regression)

    def target_columns(self, logits: torch.Tensor, requested: list[int] | None) -> torch.Tensor:
        """The explained columns [B, K]: the ``requested`` ones, else the prediction (the argmax of ``logits``
        [B, C]); regression: its one output."""
        batch = logits.shape[0]
        if self.regression:
            return torch.zeros((batch, 1), dtype=torch.long, device=logits.device)
        if requested is None:
            return logits.argmax(-1, keepdim=True)
        return torch.tensor(requested, device=logits.device).expand(batch, -1)

    def prediction(self, logits: torch.Tensor, columns: list[int]) -> tuple[str | float, dict[str, float]]:
        """``(prediction, probabilities)`` of one text from its head's logits [C]: the regression score and no
        probabilities; else the top label and the probability of every class (sigmoid for multi-label heads,
        softmax otherwise), or of a vocabulary head's top tokens and the explained ``columns``."""
        read = self.read(logits[None], [columns])
        return read.labels[0], read.probabilities[0]

    def read(self, logits: torch.Tensor, columns: list[list[int]], best: list[int] | None = None) -> Read:
        """:meth:`prediction` for each row of ``logits`` [N, C] with its own ``columns``, read off the device in one
        go (one top-k and one copy for all rows, not one per row). A vocabulary head's probabilities are those of
        the shown tokens only, exp(logit - logsumexp) with the row's maximum from the top-k, never a softmax over the
        whole vocabulary kept. ``best``: a classifier's top column of each row, where the caller has it (the argmax
        of these ``logits``: :meth:`target_columns` of no requested column)."""
        if self.regression:
            values = logits[:, 0].tolist()
            return Read(values, [{} for _ in values], [0] * len(values), [[] for _ in values])
        if not self.is_vocabulary:
            probs = (logits.sigmoid() if self.multi_label else logits.softmax(-1)).tolist()
            best = logits.argmax(-1).tolist() if best is None else best
            names = self.names
            return Read([names[b] for b in best], [dict(zip(names, row)) for row in probs], best,
                        [[row[c] for c in wanted] for row, wanted in zip(probs, columns)])
        top = logits.topk(min(TOP_TOKENS + 1, logits.shape[-1]), dim=-1)
        best = top.indices[:, 0]
        if top.values.shape[-1] > 1:  # a tie for the top: the first column, as argmax has it
            tied = top.values[:, 0] == top.values[:, 1]
            if bool(tied.any()):
                best = torch.where(tied, logits.argmax(-1), best)
        shown = top.indices[:, :TOP_TOKENS]  # then each row's own columns (a repeat of a top one adds no entry)
        width = max(len(extra) for extra in columns)
        flat = [c for extra in columns for c in extra + (extra[-1:] or [0]) * (width - len(extra))]
        index = torch.cat([shown, id_tensor(flat, logits.device).reshape(len(columns), width)], 1)
        peak = top.values[:, :1]
        total = (logits - peak).exp().sum(-1, keepdim=True)
        values = ((logits.gather(-1, index) - peak).exp() / total).tolist()
        best = best.tolist()
        names = vocabulary_names(self.tokenizer, index.flatten().tolist() + best)
        probabilities, at, cut = [], 0, shown.shape[1]
        for vals, extra in zip(values, columns):
            row = names[at:at + len(vals)]
            probabilities.append(dict(zip(row[:cut + len(extra)], vals)))
            at += len(vals)
        wanted = [vals[cut:cut + len(extra)] for vals, extra in zip(values, columns)]
        return Read(names[at:], probabilities, best, wanted)

    def name(self, column: int) -> str:
        if self.names is not None:
            return self.names[column]
        return self.tokenizer.convert_ids_to_tokens(int(column))

    def resolve_many(self, target, what: str = "target") -> list[int] | None:
        """``None`` (the prediction), one target, ``"all"`` or a list of targets -> columns (or None)."""
        if target is None:
            return None
        if isinstance(target, str) and target == ALL:
            if self.is_vocabulary:
                raise UnknownTargetError(f"{what}='all' is only for classification heads; an LM head has a whole "
                                         "vocabulary: name the tokens you want")
            return list(range(len(self.names)))
        if isinstance(target, (list, tuple)):
            if not target:
                raise UnknownTargetError(f"{what} is an empty list; give at least one label, or None for the "
                                         "predicted one")
            columns = [self.resolve(t, what) for t in target]
            return list(dict.fromkeys(columns))
        return [self.resolve(target, what)]

    def resolve(self, target, what: str = "target") -> int:
        if self.regression:
            raise UnknownTargetError(
                f"{what}={target!r} was given, but this is a regression model (num_labels=1): it has no labels "
                "to choose from; leave target and foil unset"
            )
        if isinstance(target, bool) or not isinstance(target, (int, str)):
            raise UnknownTargetError(f"{what} must be a label name, a class index or a token; got "
                                     f"{type(target).__name__} {target!r}")
        return self._vocab(target, what) if self.is_vocabulary else self._label(target, what)

    def _label(self, target, what: str) -> int:
        n = len(self.names)
        if isinstance(target, str):
            if target in self.names:
                return self.names.index(target)
            lowered = [name.lower() for name in self.names]
            if target.lower() in lowered:
                return lowered.index(target.lower())
            if target.strip().lstrip("-").isdigit():
                target = int(target)
            else:
                raise UnknownTargetError(f"{what}={target!r} is not a label of this model; its labels are "
                                         f"{self.names} (or indices 0..{n - 1})")
        if not -n <= target < n:
            raise UnknownTargetError(f"{what}={target} is out of range: this model has {n} labels {self.names}")
        return target % n

    def _vocab(self, target, what: str) -> int:
        tok = self.tokenizer
        size = len(tok)
        if isinstance(target, int):
            if not 0 <= target < size:
                raise UnknownTargetError(f"{what}={target} is not a token id: the vocabulary has ids 0..{size - 1}")
            return target
        vocab = tok.get_vocab()
        if target in vocab:
            return vocab[target]
        candidates = [target] if target.startswith(" ") else [target, " " + target]
        for text in candidates:
            ids = tok.encode(text, add_special_tokens=False)
            if len(ids) == 1:
                return ids[0]
        raise UnknownTargetError(
            f"{what}={target!r} is not a single token of this model's vocabulary (it splits into "
            f"{tok.tokenize(target)}); give one vocabulary token or a token id"
        )


def is_regression(config) -> bool:
    return regression_head(getattr(config, "problem_type", None), int(getattr(config, "num_labels", 2)))


def regression_head(problem_type: str | None, num_labels: int) -> bool:
    """Whether a sequence classifier with this ``problem_type`` and ``num_labels`` does regression."""
    return problem_type == "regression" or num_labels == 1


def head_columns(columns: torch.Tensor, foil: torch.Tensor | None, vocabulary: bool) -> HeadColumns:
    """Where to run a head for target columns [B, K] (minus a foil column [B]): a ``vocabulary`` head only at the
    wanted ids (each once: ``torch.unique``), a classifier at all its outputs."""
    if not vocabulary:
        return HeadColumns(None, columns, foil)
    wanted = columns if foil is None else torch.cat([columns, foil[:, None]], dim=1)
    vocab, index = torch.unique(wanted, return_inverse=True)
    return HeadColumns(vocab, index, None) if foil is None else HeadColumns(vocab, index[:, :-1], index[:, -1])

