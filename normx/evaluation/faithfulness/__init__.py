"""Faithfulness: AOPC comprehensiveness and sufficiency (confidence drop, accuracy, Pearson r) of methods on a
classifier, by the authors' perturbation protocol: the run (:mod:`~normx.evaluation.faithfulness.run`), the protocol
(:mod:`~.perturbation`), the curves (:mod:`~.metrics`), the examples (:mod:`~normx.evaluation.faithfulness.examples`)
and the report (:mod:`~normx.evaluation.faithfulness.report`)."""

from normx.evaluation.faithfulness.examples import DATA_SUFFIXES, gold_labels, load_examples, read_examples
from normx.evaluation.faithfulness.metrics import (
    aopc,
    classification_curves,
    classification_values,
    pearson,
    regression_curves,
    softmax,
    standard_error,
)
from normx.evaluation.faithfulness.report import FaithfulnessReport, MethodResult, format_table
from normx.evaluation.faithfulness.run import RANKINGS, SuppliedScores, evaluate

__all__ = ["DATA_SUFFIXES", "RANKINGS", "FaithfulnessReport", "MethodResult", "SuppliedScores", "aopc",
           "classification_curves", "classification_values", "evaluate", "format_table", "gold_labels",
           "load_examples", "pearson", "read_examples", "regression_curves", "softmax", "standard_error"]
