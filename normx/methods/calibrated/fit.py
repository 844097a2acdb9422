"""Fitting a calibrated context method: per-(family, block, head) weights theta over the one-pass readings
(:mod:`~normx.methods.calibrated.readings`) fitted to what removing sources does to the response.

Training data, per (context, response) instance: sources (token spans of the prompt), and M random masks, each
keeping every source with probability ``keep`` (0.5); the outcome y_m is the response's log-probability with the
removed sources' tokens left out of the ids (the ablation methods' and the evaluation's own removal,
:func:`normx.methods.ablation.forwards.outcomes`). A source j's features F_j [D] are its tokens' readings summed
over the response's steps and over the tokens, from ONE unablated pass. The model is AT2's linear form

    y_m ~ b_instance + sum_j m_j theta^T F_j,

so a source's score is theta^T F_j, in log-probability units: the predicted drop when it is removed.

Tying (``"head"``, ``"block"``, ``"all"``): one weight per (family, block, head), per (family, block) (the heads'
features summed) or per family (summed over blocks and heads: a few inspectable numbers, the least data-hungry);
the stored table is always [blocks, heads], a tied weight repeated.

Fit (:func:`centred_ridge`): per instance, the design rows X_m = sum_j m_j F_j and the outcomes are centred over
its masks (the instance's intercept drops out), optionally divided by the instance's outcome spread (``"spread"``:
every instance weighs the same, as AT2's per-instance Pearson objective, without Adam); the columns are scaled by
their root mean square over every centred row; theta solves the ridge normal equations (X^T X + lambda * trace/D *
I) theta = X^T y in float64 (closed form, deterministic), and is scaled back. Choice (:func:`choose`): the feature
families, the tying, lambda and the outcome scaling by K-fold cross-validation over instances (folds by instance,
never by mask), scored by the mean over the left-out instances of the Spearman correlation between predicted and actual
outcomes over their masks (the LDS on training masks). The chosen theta is then multiplied by one factor fitted by
least squares to the outcomes in nats (:func:`in_nats`: the ridge's shrinkage, strong at a large lambda, leaves the
predictions smaller than the drops they predict), which changes no LDS.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import combinations

import numpy as np

from normx.errors import InvalidInputError

LAMBDAS = (1e-3, 1e-2, 1e-1, 1.0, 10.0, 100.0, 1000.0)
SCALINGS = ("logprob", "spread")
TYINGS = ("all", "block", "head")  # fewest weights first


@dataclass
class Instance:
    """One training context: ``features`` {family: [sources, blocks, heads]} and the outcomes ``y`` [M] under
    ``masks`` (bool [M, sources], True = kept)."""

    features: dict[str, np.ndarray]
    masks: np.ndarray
    y: np.ndarray
    id: str = ""

    def design(self, families: Sequence[str], tying: str = "head") -> np.ndarray:
        """X [M, D]: the kept sources' features summed, ``families`` (tied by ``tying``) flattened in order."""
        sources = len(self.masks[0])
        f = np.concatenate([tied(self.features[name], tying).reshape(sources, -1) for name in families], axis=1)
        return self.masks.astype(np.float64) @ f.astype(np.float64)


def tied(features: np.ndarray, tying: str) -> np.ndarray:
    """Features [sources, blocks, heads] as the tying weighs them: as they are, summed over the heads, or over both."""
    if tying not in TYINGS:
        raise InvalidInputError(f"tying={tying!r} is not allowed; use one of {TYINGS}")
    return features if tying == "head" else features.sum(2) if tying == "block" else features.sum((1, 2))


def expand(theta: np.ndarray, families: Sequence[str], tying: str, shape: tuple[int, int],
           scalar: Sequence[str] = ()) -> dict[str, np.ndarray]:
    """{family: [blocks, heads]} weights from a fitted theta (a tied weight repeated over its blocks / heads); the
    families in ``scalar`` (one feature per source) get a 1 x 1 table."""
    blocks, heads = shape
    size = {"head": blocks * heads, "block": blocks, "all": 1}[tying]
    tables, at = {}, 0
    for family in families:
        if family in scalar:
            tables[family] = np.array([[float(theta[at])]])
            at += 1
            continue
        part = np.asarray(theta[at:at + size], np.float64)
        at += size
        tables[family] = (part.reshape(blocks, heads) if tying == "head" else
                          np.repeat(part[:, None], heads, 1) if tying == "block" else np.full((blocks, heads), part[0]))
    return tables


@dataclass
class Choice:
    """The chosen fit and the cross-validation table it was chosen from."""

    families: tuple[str, ...]
    lam: float
    scaling: str
    cv_lds: float
    tying: str = "head"
    table: list[dict] = field(default_factory=list)


def _centred(instances: Sequence[Instance], families: Sequence[str], scaling: str, tying: str = "head"
             ) -> tuple[np.ndarray, np.ndarray]:
    xs, ys = [], []
    for inst in instances:
        x = inst.design(families, tying)
        y = np.asarray(inst.y, np.float64)
        x, y = x - x.mean(0), y - y.mean()
        if scaling == "spread":
            spread = y.std()
            if spread <= 0:
                continue
            x, y = x / spread, y / spread
        xs.append(x)
        ys.append(y)
    if not xs:
        raise InvalidInputError("no training instance has outcomes that vary over its masks")
    return np.vstack(xs), np.concatenate(ys)


def ridge(x: np.ndarray, y: np.ndarray, lam: float) -> np.ndarray:
    """theta [D] solving (Xs^T Xs + lam * trace(Xs^T Xs) / D * I) theta_s = Xs^T y for the column-scaled Xs = X / s
    (s: each column's root mean square; a constant-zero column gets weight 0), returned as theta = theta_s / s."""
    if lam <= 0:
        raise InvalidInputError(f"the ridge penalty must be > 0, got {lam}")
    x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
    scale = np.sqrt((x ** 2).mean(0))
    live = scale > 0
    xs = x[:, live] / scale[live]
    gram = xs.T @ xs
    d = gram.shape[0]
    penalty = lam * (np.trace(gram) / d if d else 0.0)
    theta = np.zeros(x.shape[1])
    theta[live] = np.linalg.solve(gram + penalty * np.eye(d), xs.T @ y) / scale[live]
    return theta


def centred_ridge(instances: Sequence[Instance], families: Sequence[str], lam: float, scaling: str = "logprob",
                  tying: str = "head") -> np.ndarray:
    """theta [D] fitted on ``instances`` (see the module's docstring)."""
    if scaling not in SCALINGS:
        raise InvalidInputError(f"scaling={scaling!r} is not allowed; use one of {SCALINGS}")
    return ridge(*_centred(instances, families, scaling, tying), lam)


def in_nats(instances: Sequence[Instance], families: Sequence[str], theta: np.ndarray, tying: str = "head"
            ) -> tuple[np.ndarray, float]:
    """``(c * theta, c)``: ``theta`` times the one factor c > 0 that best fits the instances' centred outcomes in
    log-probability units by least squares (c = <X theta, y> / <X theta, X theta> over every centred row), so that
    a source's score is a drop in nats again after the ridge's shrinkage or a per-instance scaling (no LDS changes:
    each instance's predictions are only multiplied by c); ``theta`` as it is (c = 1) where c would not be
    positive."""
    x, y = _centred(instances, families, "logprob", tying)
    predicted = x @ theta
    size = float(predicted @ predicted)
    c = float(predicted @ y) / size if size > 0 else 1.0
    return (theta * c, c) if c > 0 else (theta, 1.0)


def spearman(a: np.ndarray, b: np.ndarray) -> float:
    """Spearman's rank correlation with mean ranks for ties; 0 when either side is constant."""
    def ranks(v):
        order = np.argsort(v, kind="stable")
        r = np.empty(len(v))
        r[order] = np.arange(len(v), dtype=np.float64)
        for value in np.unique(v):  # ties: their mean rank
            same = v == value
            r[same] = r[same].mean()
        return r - r.mean()
    ra, rb = ranks(np.asarray(a, np.float64)), ranks(np.asarray(b, np.float64))
    scale = np.sqrt((ra ** 2).sum() * (rb ** 2).sum())
    return float((ra * rb).sum() / scale) if scale > 0 else 0.0


def instance_lds(instance: Instance, families: Sequence[str], theta: np.ndarray, tying: str = "head") -> float:
    """The Spearman correlation over the instance's masks between predicted and actual outcomes."""
    return spearman(instance.design(families, tying) @ theta, instance.y)


def folds_of(count: int, folds: int) -> list[np.ndarray]:
    """Instance indices cut into ``folds`` contiguous folds (every instance left out once)."""
    if count < 2:
        raise InvalidInputError(f"cross-validation needs at least 2 training contexts, got {count}")
    return [part for part in np.array_split(np.arange(count), min(folds, count)) if len(part)]


def left_out_lds(instances: Sequence[Instance], families: Sequence[str], lam: float, scaling: str,
                 folds: int = 5, tying: str = "head") -> np.ndarray:
    """Each instance's LDS when its fold is left out (``folds`` folds, each fitted on the other instances)."""
    scores = np.zeros(len(instances))
    for left in folds_of(len(instances), folds):
        held = set(left.tolist())
        train = [inst for i, inst in enumerate(instances) if i not in held]
        theta = centred_ridge(train, families, lam, scaling, tying)
        for i in left:
            scores[i] = instance_lds(instances[i], families, theta, tying)
    return scores


def cross_validate(instances: Sequence[Instance], families: Sequence[str], lam: float, scaling: str,
                   folds: int = 5, tying: str = "head") -> float:
    """The mean LDS of left-out instances over ``folds`` folds, each fitted on the other instances."""
    return float(np.mean(left_out_lds(instances, families, lam, scaling, folds, tying)))


def family_sets(candidates: Sequence[str]) -> list[tuple[str, ...]]:
    """The subsets to try: every non-empty combination of ``candidates``, smallest first."""
    return [combo for size in range(1, len(candidates) + 1) for combo in combinations(candidates, size)]


def choose(instances: Sequence[Instance], candidates: Sequence[str], lambdas: Sequence[float] = LAMBDAS,
           scalings: Sequence[str] = SCALINGS, folds: int = 5, tyings: Sequence[str] = TYINGS) -> Choice:
    """The families, tying, lambda and scaling with the best cross-validated LDS (ties: fewer families, fewer
    weights, the larger lambda, the listed scaling first)."""
    table, best = [], None
    for families in family_sets(candidates):
        per_source = all(instances[0].features[f].shape[1:] == (1, 1) for f in families)
        for tying in (tyings[:1] if per_source else tyings):  # one number per source: every tying is the same
            for scaling in scalings:
                for lam in sorted(lambdas, reverse=True):
                    score = cross_validate(instances, families, lam, scaling, folds, tying)
                    table.append({"families": list(families), "tying": tying, "lambda": lam, "scaling": scaling,
                                  "cv_lds": score})
                    if best is None or score > best.cv_lds + 1e-12:
                        best = Choice(tuple(families), lam, scaling, score, tying)
    best.table = table
    return best
