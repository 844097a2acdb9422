"""A Gradio app with the demo's ``/explain`` signature that answers at once and computes nothing: the load test
(``test_demo_load.py``) sends it the same crowd to measure what the clients and Gradio cost by themselves on the
machine, the floor under any server's latencies. ``python tests/serving/null_demo.py --host H --port P``."""

from __future__ import annotations

import argparse
import os

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

import gradio as gr

INPUTS = 8  # model, text, pair, method, steps, unit, special tokens, compared methods: the demo's explain inputs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    with gr.Blocks(analytics_enabled=False) as blocks:
        inputs = [gr.Textbox() for _ in range(INPUTS)]
        answer = gr.Textbox()
        gr.Button().click(lambda *values: "", inputs, answer, api_name="explain")
    blocks.queue(default_concurrency_limit=32, max_size=64)  # the demo's queue settings (demo/normx_page.py)
    blocks.launch(server_name=args.host, server_port=args.port, ssr_mode=False, share=False)


if __name__ == "__main__":
    main()
