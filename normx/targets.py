"""Resolving user targets (label names, class indices, vocabulary tokens) to output columns."""

from __future__ import annotations

from .errors import UnknownTargetError, UnsupportedModelError

ALL = "all"


class LabelSpace:
    """The output columns of a model's head and their names."""

    def __init__(self, kind: str, config, tokenizer):
        self.kind = kind
        self.config = config
        self.tokenizer = tokenizer
        self.regression = kind == "sequence_classification" and is_regression(config)
        if kind == "sequence_classification":
            n = int(config.num_labels)
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
        return self.kind in ("masked_lm", "causal_lm")

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
    if getattr(config, "problem_type", None) == "regression":
        return True
    return int(getattr(config, "num_labels", 2)) == 1

