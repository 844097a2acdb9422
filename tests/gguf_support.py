"""A tiny GGUF file written with the ``gguf`` package: the tiny seeded Llama of ``tiny.py`` and its byte-level BPE
tokenizer, in llama.cpp's layout (q / k rows permuted as llama.cpp writes them, which transformers undoes on load).
transformers reads it back to the same logits."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import tiny


def _permute(weight: np.ndarray, heads: int) -> np.ndarray:
    return weight.reshape(heads, 2, weight.shape[0] // heads // 2, *weight.shape[1:]).swapaxes(1, 2).reshape(
        weight.shape)


def write_tiny_gguf(file: Path):
    """Write the tiny Llama (``tiny.build("LlamaForCausalLM")``) as a GGUF file; returns ``(model, tokenizer)``
    of the original."""
    import gguf

    model, tokenizer = tiny.build("LlamaForCausalLM")
    config = model.config
    data = json.loads(tokenizer.backend_tokenizer.to_str())
    tokens = [t for t, _ in sorted(data["model"]["vocab"].items(), key=lambda kv: kv[1])]
    writer = gguf.GGUFWriter(str(file), "llama")
    writer.add_name("tiny-llama")
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_rope_freq_base(float((getattr(config, "rope_parameters", None) or {}).get("rope_theta", 10000.0)))
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_vocab_size(len(tokens))
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types([3 if t in tiny.BPE_SPECIALS else 1 for t in tokens])
    writer.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in data["model"]["merges"]])
    writer.add_bos_token_id(tokenizer.bos_token_id)
    writer.add_eos_token_id(tokenizer.eos_token_id)
    writer.add_pad_token_id(tokenizer.pad_token_id)
    writer.add_add_bos_token(True)
    names = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
             "lm_head.weight": "output.weight"}
    parts = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
             "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
             "mlp.down_proj": "ffn_down", "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm"}
    for i in range(config.num_hidden_layers):
        names.update({f"model.layers.{i}.{hf}.weight": f"blk.{i}.{gg}.weight" for hf, gg in parts.items()})
    for name, value in model.state_dict().items():
        array = value.detach().float().numpy()
        if name.endswith("q_proj.weight"):
            array = _permute(array, config.num_attention_heads)
        elif name.endswith("k_proj.weight"):
            array = _permute(array, config.num_key_value_heads)
        writer.add_tensor(names[name], np.ascontiguousarray(array, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return model, tokenizer
