"""The machinery every method runs on: forward hooks through one context manager (:mod:`~normx.core.hooks`), one
model shared by many threads (:mod:`~normx.core.concurrency`), texts made into padded model inputs
(:mod:`~normx.core.inputs`), a head's label space (:mod:`~normx.core.labels`), the one forward pass with layer
capture that the head-on-top methods read (:mod:`~normx.core.forward`), every adapter checked against the model's
own outputs on first use (:mod:`~normx.core.verify`), and the model resolved once per call into the handle the rest
receive (:mod:`~normx.core.handle`).

Layer 2: imports ``normx.models`` (and ``normx.errors``, ``normx._torch``) only.
"""
