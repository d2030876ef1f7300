"""The Qwen3-VL-8B-Instruct variants of the GPU recipes (``recipes/*/gpu-qwen3vl8b*.yaml``) and the checkpoint config
they plan from (``mmrl/plan/configs/Qwen3-VL-8B-Instruct``): the config builds the published architecture on the meta
device, each recipe loads, fits its stated hardware by ``mmrl plan`` and quotes the plan's peak in its header, and its
pixel budget is on Qwen3-VL's 32-pixel grid. Meta device only: nothing is allocated or downloaded."""

import re
from pathlib import Path

import pytest

from mmrl.config import load_config
from mmrl.plan import memory, report
from mmrl.plan import planner as plan

ROOT = Path(__file__).resolve().parents[1]
HUB_ID = "Qwen/Qwen3-VL-8B-Instruct"
SHIPPED = ROOT / "mmrl" / "plan" / "configs" / "Qwen3-VL-8B-Instruct"
RECIPES = sorted((ROOT / "recipes").glob("*/gpu-qwen3vl8b*.yaml"))
PUBLISHED_PARAMS = 8.77e9  # the checkpoint's published size

# counted by hand from the config: text 36 layers of h 4096 (32 heads, 8 KV heads of 128; q/k norms), MLP 12,288,
# vocabulary 151,936 with an untied head; vision 27 blocks of 1,152 (MLP 4,304, LayerNorms with biases), a 16 x 16 x 2
# patch embedding, 2,304 learned positions, a 2 x 2 merger to 4,096 and three deepstack mergers (norm after shuffle)
H, MLP, KV, VOCAB = 4096, 12288, 8 * 128, 151936
LAYER = 2 * H * H + 2 * H * KV + 3 * H * MLP + 2 * H + 2 * 128
TEXT = 2 * VOCAB * H + 36 * LAYER + H
HV, MV, MERGED = 1152, 4304, 4 * 1152
BLOCK = 4 * HV + (HV * 3 * HV + 3 * HV) + (HV * HV + HV) + (HV * MV + MV) + (MV * HV + HV)


def _merger(norm: int) -> int:
    return 2 * norm + (MERGED * MERGED + MERGED) + (MERGED * H + H)


VISION = (HV * 3 * 2 * 16 * 16 + HV) + 2304 * HV + 27 * BLOCK + _merger(HV) + 3 * _merger(MERGED)


@pytest.fixture
def no_hub_cache(monkeypatch):
    """Plan from the shipped folder even on a machine whose HF cache holds the real checkpoint."""
    monkeypatch.setattr(memory, "_hub_cached_config", lambda repo_id: None)


def test_shipped_config_is_the_published_architecture(no_hub_cache):
    from transformers import AutoConfig

    assert memory.config_folder(HUB_ID) == SHIPPED
    s = memory.model_shapes(str(SHIPPED))
    assert (s.params, s.vision_params) == (TEXT + VISION, VISION) == (8_767_123_696, 576_388_336)
    assert abs(s.params - PUBLISHED_PARAMS) / PUBLISHED_PARAMS < 0.01
    assert (s.embed_params, s.head_params, s.vocab) == (VOCAB * H, VOCAB * H, VOCAB)  # untied head
    tx, vi = s.text, s.vision
    assert (tx.layers, tx.hidden, tx.mlp, tx.heads, tx.kv_heads) == (36, 4096, 12288, 32, 8)
    assert tx.block_params == LAYER
    assert (vi.layers, vi.hidden, vi.mlp, vi.heads, vi.block_params) == (27, 1152, 4304, 16, BLOCK)
    assert (s.patch, s.merge, s.temporal_patch, s.pixels_per_token) == (16, 2, 2, 32 * 32)
    assert s.max_positions == 262144
    # transformers 5 reads the released (4.x) layout: rope_scaling and rope_theta become rope_parameters
    text = AutoConfig.from_pretrained(SHIPPED).get_text_config()
    assert text.rope_parameters["rope_theta"] == 5_000_000
    assert text.rope_parameters["mrope_section"] == [24, 20, 20] and text.rope_parameters["mrope_interleaved"]


def test_shipped_preprocessor_is_qwen3_vl_grid():
    from transformers import AutoImageProcessor

    ip = AutoImageProcessor.from_pretrained(SHIPPED)
    assert (ip.patch_size, ip.merge_size, ip.temporal_patch_size) == (16, 2, 2)
    assert (ip.size["shortest_edge"], ip.size["longest_edge"]) == (65536, 16777216)
    assert list(ip.image_mean) == list(ip.image_std) == [0.5, 0.5, 0.5]


def test_every_qwen3_recipe_is_here():
    names = {f"{p.parent.name}/{p.name}" for p in RECIPES}
    assert {f"{r}/gpu-qwen3vl8b.yaml" for r in ("gui", "table2latex", "geometry")} <= names


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_qwen3_recipe_fits_its_hardware(path, no_hub_cache):
    cfg = load_config(path)
    m, hw = cfg.model, cfg.hardware
    assert m.path == HUB_ID and m.dtype == "bfloat16" and m.gradient_checkpointing
    assert cfg.rollout.engine == "vllm"
    assert m.max_pixels % (32 * 32) == 0 and m.min_pixels % (32 * 32) == 0  # Qwen3-VL's 32-px grid
    p = plan.plan_run(cfg)
    assert p.setup.shapes.source == str(SHIPPED)
    assert p.setup.hw.source == "the config's hardware section"
    assert p.setup.seq.visual_tokens == m.max_pixels // (32 * 32)  # one image per prompt
    assert p.fits, report.format_plan(p, str(path))
    world = hw.gpus_per_node * hw.nodes
    assert world == 1 or (cfg.train.fsdp and cfg.train.prompts_per_step % world == 0)
    # vLLM starts: its cache holds one max_model_len sequence, which holds the planned prompt and response
    e = plan.engine(p.setup)
    assert p.setup.seq.total <= e.max_model_len <= e.kv_tokens
    # the header quotes the plan's peak
    quoted = re.search(r"peak ~(\d+) GiB per GPU", path.read_text())
    assert quoted, f"{path}: quote the plan's peak in the header comment"
    assert int(quoted.group(1)) == round(p.peak / memory.GIB)


def test_gui_variant_scores_points_in_qwen3_vl_frame():
    """Qwen3-VL answers in 0-1000 of the image's width and height: the frame its model_type maps to."""
    import json

    from mmrl.processors.geometry import coordinate_frame, frame_to_original

    model_type = json.loads((SHIPPED / "config.json").read_text())["model_type"]
    assert coordinate_frame(model_type) == "relative_1000"
    assert frame_to_original(500, 250, "relative_1000", (1280, 800), (1280, 800)) == (640, 200)
