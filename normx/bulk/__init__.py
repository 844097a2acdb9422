"""Explaining a whole corpus: rows streamed from a file or a hub dataset, bucketed by length, written as resumable
Parquet shards, one process or many (:mod:`~normx.bulk.attribute`).

Imports ``normx.explanations`` and the layers below it, and ``normx.data``.
"""
