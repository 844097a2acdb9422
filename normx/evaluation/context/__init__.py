"""Context attribution's evaluation (issue #46): which sources of a context a response came from, read by every
method (:mod:`~normx.evaluation.context.readings`), scored by the linear datamodeling score, top-k log-probability
drops and evidence recall (:mod:`~normx.evaluation.context.metrics`), reported per reading with its cost
(:mod:`~normx.evaluation.context.report`); :func:`~normx.evaluation.context.run.evaluate_context` runs it, resumably.
The ``normx evaluate context`` command is :mod:`normx.cli.context`."""

from normx.evaluation.context.report import ContextReport
from normx.evaluation.context.run import DEFAULT_METHODS, evaluate_context

__all__ = ["DEFAULT_METHODS", "ContextReport", "evaluate_context"]
