"""What a server runs over ``normx.explain``: one page session's requests and kept results
(:mod:`~normx.serving.session`), what the page shows of them (:mod:`~normx.serving.views`), the model cache, locked
mode and the server's options (:mod:`~normx.serving.server`), the work budget (:mod:`~normx.serving.budget`) and
the two lanes requests run in (:mod:`~normx.serving.lanes`, :mod:`~normx.serving.batching`).
No web framework: ``demo/app.py`` wraps these in Gradio components.

Imports ``normx.explanations`` and the layers below it, and ``normx.zoo`` (the presets a server offers).
"""
