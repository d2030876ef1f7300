"""Qwen2.5-VL's processor with the tiny pixel budgets, shared by the tiny Qwen2.5-VL and Qwen2-VL (which keeps
Qwen2.5-VL's 28 px geometry and chat template). The budgets are small (4..16 merged 28x28 patches per image, 4..8 per
video frame) so CPU forwards stay fast; recipes override them like for the real model."""

from __future__ import annotations

from transformers import Qwen2_5_VLProcessor, Qwen2Tokenizer, Qwen2VLImageProcessor, Qwen2VLVideoProcessor

from mmrl.tiny.archs import VISION_ARCH
from mmrl.tiny.tokenization import QWEN25_VL_CHAT_TEMPLATE

# Pixel budgets of the processor (a merged 28x28 patch is one LLM token): a 56x56 image gives 4 image tokens.
IMAGE_MIN_PIXELS = 28 * 28 * 4
IMAGE_MAX_PIXELS = 28 * 28 * 16
VIDEO_MIN_PIXELS = 28 * 28 * 4
VIDEO_MAX_PIXELS = 28 * 28 * 8


def build_processor(tokenizer: Qwen2Tokenizer) -> Qwen2_5_VLProcessor:
    """Qwen2.5-VL's processor with the tiny pixel budgets (see module docstring)."""
    patch = {k: VISION_ARCH[k] for k in ("patch_size", "temporal_patch_size")}
    merge = VISION_ARCH["spatial_merge_size"]
    image_processor = Qwen2VLImageProcessor(
        size={"shortest_edge": IMAGE_MIN_PIXELS, "longest_edge": IMAGE_MAX_PIXELS}, merge_size=merge, **patch
    )
    # cap_pixels_per_frame=True: qwen-vl-utils' total-video pixel budget, the default from transformers 5.22 on.
    video_processor = Qwen2VLVideoProcessor(
        size={"shortest_edge": VIDEO_MIN_PIXELS, "longest_edge": VIDEO_MAX_PIXELS},
        merge_size=merge,
        cap_pixels_per_frame=True,
        **patch,
    )
    return Qwen2_5_VLProcessor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        video_processor=video_processor,
        chat_template=QWEN25_VL_CHAT_TEMPLATE,
    )
