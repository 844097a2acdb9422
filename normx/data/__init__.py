"""Data sets read from plain files (or the Hugging Face hub when online): the GLUE tasks (:mod:`~normx.data.glue`),
corpus rows streamed from TSV / CSV / JSONL / Parquet files (:mod:`~normx.data.rows`), and BLiMP minimal pairs with
their evidence (:mod:`~normx.data.blimp`) made ready for a model (:mod:`~normx.data.blimp_items`).

Imports ``normx.errors`` and ``normx.models`` (a head's kind) only.
"""
