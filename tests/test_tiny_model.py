"""The tiny Qwen2.5-VL checkpoint built by mmrl.tiny.build loads and runs through the same code path as a real one."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import hashlib
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from tokenizers import Tokenizer
from transformers import AutoModelForImageTextToText, AutoProcessor, Qwen2_5_VLProcessor

from mmrl.tiny.build import build_tiny
from mmrl.tiny.tokenization import FORMAT_TAGS, QWEN_SPECIAL_TOKENS

SHIPPED = Path(__file__).resolve().parents[1] / "assets" / "tiny-qwen2.5-vl"


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory) -> Path:
    return build_tiny(tmp_path_factory.mktemp("tiny") / "model", seed=0)


@pytest.fixture(scope="module")
def processor(tiny_dir):
    return AutoProcessor.from_pretrained(tiny_dir)


@pytest.fixture(scope="module")
def model(tiny_dir):
    return AutoModelForImageTextToText.from_pretrained(tiny_dir).eval()


def _file_hashes(directory: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(directory.iterdir())}


def _prompt(processor, kind: str) -> str:
    messages = [
        {"role": "user", "content": [{"type": kind}, {"type": "text", "text": "What colour is the circle?"}]}
    ]
    return processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)


def _red_circle(size: int = 56) -> Image.Image:
    yy, xx = np.mgrid[:size, :size]
    pixels = np.full((size, size, 3), 255, dtype=np.uint8)
    pixels[(yy - size / 2) ** 2 + (xx - size / 2) ** 2 < (size / 3) ** 2] = (220, 30, 30)
    return Image.fromarray(pixels)


def test_auto_processor_is_the_qwen_processor(processor):
    assert isinstance(processor, Qwen2_5_VLProcessor)
    assert processor.image_processor.size["shortest_edge"] == 28 * 28 * 4
    assert processor.image_processor.size["longest_edge"] == 28 * 28 * 16
    assert processor.video_processor.merge_size == 2


def test_chat_template_is_qwen25_vl(processor):
    text = _prompt(processor, "image")
    assert text == (
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
        "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>What colour is the circle?<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    assert "<|vision_start|><|video_pad|><|vision_end|>" in _prompt(processor, "video")


def test_image_input_expands_to_merged_patch_count(processor, model):
    inputs = processor(text=[_prompt(processor, "image")], images=[_red_circle()], return_tensors="pt")
    grid = inputs["image_grid_thw"]
    assert grid.tolist() == [[1, 4, 4]]  # 56 px / 14 px patches, one frame
    merge = model.config.vision_config.spatial_merge_size
    n_pad = int((inputs["input_ids"] == model.config.image_token_id).sum())
    assert n_pad == int(grid.prod()) // merge**2 == 4
    assert inputs["pixel_values"].shape == (16, 3 * 2 * 14 * 14)


def test_forward_logits_and_generate(processor, model):
    inputs = processor(text=[_prompt(processor, "image")], images=[_red_circle()], return_tensors="pt")
    length = inputs["input_ids"].shape[1]
    with torch.no_grad():
        logits = model(**inputs).logits
    assert logits.shape == (1, length, len(processor.tokenizer))
    assert torch.isfinite(logits).all()
    first = model.generate(**inputs, max_new_tokens=5, do_sample=False)
    again = model.generate(**inputs, max_new_tokens=5, do_sample=False)
    assert length < first.shape[1] <= length + 5
    assert torch.equal(first, again) and torch.equal(first[:, :length], inputs["input_ids"])
    assert first[0, length] == logits[0, -1].argmax()  # greedy: the first new token is the forward's argmax


@pytest.mark.parametrize("as_array", [False, True], ids=["pil_frames", "numpy_array"])
def test_video_input_runs(processor, model, as_array):
    frames = [_red_circle().rotate(30 * i) for i in range(4)]
    video = np.stack([np.asarray(f) for f in frames]) if as_array else frames  # [4, H, W, 3] or 4 PIL frames
    inputs = processor(text=[_prompt(processor, "video")], videos=[video], return_tensors="pt")
    assert inputs["video_grid_thw"].tolist() == [[2, 4, 4]]  # 4 frames / temporal patch 2
    assert int((inputs["input_ids"] == model.config.video_token_id).sum()) == 2 * 4 * 4 // 4
    with torch.no_grad():
        logits = model(**inputs).logits
    assert logits.shape == (1, inputs["input_ids"].shape[1], model.config.text_config.vocab_size)


def test_config_matches_tokenizer_and_architecture(processor, model):
    tok, cfg = processor.tokenizer, model.config
    assert 500_000 <= model.num_parameters() <= 3_000_000
    assert cfg.text_config.vocab_size == len(tok)
    assert cfg.image_token_id == tok.convert_tokens_to_ids("<|image_pad|>")
    assert cfg.video_token_id == tok.convert_tokens_to_ids("<|video_pad|>")
    assert cfg.vision_start_token_id == tok.convert_tokens_to_ids("<|vision_start|>")
    assert cfg.vision_end_token_id == tok.convert_tokens_to_ids("<|vision_end|>")
    head_dim = cfg.text_config.hidden_size // cfg.text_config.num_attention_heads
    assert sum(cfg.text_config.rope_parameters["mrope_section"]) == head_dim // 2
    assert cfg.vision_config.out_hidden_size == cfg.text_config.hidden_size
    assert model.get_output_embeddings().weight is model.get_input_embeddings().weight
    gen = model.generation_config
    assert set(gen.eos_token_id) == {
        tok.convert_tokens_to_ids("<|im_end|>"),
        tok.convert_tokens_to_ids("<|endoftext|>"),
    }
    assert gen.pad_token_id == tok.pad_token_id == tok.convert_tokens_to_ids("<|endoftext|>")


def test_tokenizer_round_trip_and_special_tokens(tiny_dir, processor):
    tok = processor.tokenizer
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|endoftext|>"
    ids = [tok.convert_tokens_to_ids(t) for t in QWEN_SPECIAL_TOKENS]
    assert ids == sorted(ids) and ids[0] == len(tok) - len(QWEN_SPECIAL_TOKENS) - len(FORMAT_TAGS)
    for token in QWEN_SPECIAL_TOKENS + FORMAT_TAGS:
        assert len(tok.encode(token)) == 1, token
    text = (
        "<|im_start|>user\nHow many shapes?  Ünïcödé 日本 \\begin{tabular}{|c|c|} \\hline a & b \\\\ \\end{tabular}"
        "<|im_end|>\n<think>two</think><answer>[{'action': 'click', 'coordinate': [12, 34]}]</answer><|endoftext|>"
    )
    encoded = tok.encode(text)
    assert tok.decode(encoded) == text
    assert Tokenizer.from_file(str(tiny_dir / "tokenizer.json")).encode(text).ids == encoded
    stripped = tok.decode(encoded, skip_special_tokens=True)
    assert "<|im_start|>" not in stripped and "<think>two</think>" in stripped


def test_model_card_lists_the_files(tiny_dir, model):
    card = (tiny_dir / "README.md").read_text()
    assert "mmrl build-tiny" in card and f"{model.num_parameters():,}" in card
    for name, digest in _file_hashes(tiny_dir).items():
        if name != "README.md":
            assert f"| {name} | {(tiny_dir / name).stat().st_size} | {digest[:16]} |" in card


def test_build_is_deterministic_and_seeded(tiny_dir, tmp_path):
    again = build_tiny(tmp_path / "again", seed=0)
    assert _file_hashes(again) == _file_hashes(tiny_dir)
    other = _file_hashes(build_tiny(tmp_path / "other", seed=1))
    assert other["tokenizer.json"] == _file_hashes(tiny_dir)["tokenizer.json"]
    assert other["model.safetensors"] != _file_hashes(tiny_dir)["model.safetensors"]


def test_shipped_copy_is_current(tiny_dir):
    shipped, fresh = _file_hashes(SHIPPED), _file_hashes(tiny_dir)
    for name in ("model.safetensors", "tokenizer.json", "chat_template.jinja"):
        assert shipped[name] == fresh[name], (
            f"{SHIPPED / name} is stale: rerun `mmrl build-tiny` and commit it"
        )


def test_rebuild_replaces_only_an_earlier_build(tiny_dir, tmp_path):
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("not a model")
    with pytest.raises(FileExistsError, match="not an earlier tiny-qwen2.5-vl build"):
        build_tiny(foreign)
    assert (foreign / "notes.txt").read_text() == "not a model"
    earlier = build_tiny(tmp_path / "earlier")
    (earlier / "stale.json").write_text("{}")
    assert sorted(p.name for p in build_tiny(earlier).iterdir()) == sorted(p.name for p in tiny_dir.iterdir())
