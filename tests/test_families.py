"""Every tiny family of ``mmrl build-tiny --family`` encodes non-square images on its own geometry, maps coordinates
exactly, scores rollouts like the training forward and trains (full and LoRA) for 2 steps.

The checkpoints are built once per session into a temporary folder (each builds in well under a second after
import; together they are ~8 MB, too large to ship in assets/). Qwen2.5-VL uses the shipped tiny model.
"""

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from mmrl.cli import main
from mmrl.config import ModelConfig
from mmrl.model.geometry import VisionGeometry, vision_geometry
from mmrl.model.layout import is_vision_param, language_model_prefix
from mmrl.model.policy import Policy
from mmrl.processors.image import ImageGeometry
from mmrl.rewards.gui import to_original
from mmrl.rollout import HFEngine, SamplingParams
from mmrl.run.metrics import read_metrics
from mmrl.tiny.build import FAMILIES, build_tiny
from mmrl.types import Sample

ROOT = Path(__file__).resolve().parents[1]
NEW = [f for f in FAMILIES if f != "qwen2_5_vl"]
SIZES = [(57, 83), (200, 120), (31, 300)]  # (w, h): no side a multiple of 28 or 32
MORE_SIZES = [(1, 1), (28, 28), (32, 32), (56, 56), (640, 480), (333, 334)]
# Beyond ~1:30 at these budgets transformers' own smart_resize gives a zero side (and a wrong token count); mmrl keeps
# one grid step (tests/test_geometry.py), so these are checked against the grid only.
EXTREME = [(13, 500), (1000, 37)]
# HF engine vs training forward, fp32: 1e-5 for every family (Gemma 4's final logit soft-capping is applied by the
# scoring too: without it isolated tokens differed by up to 1.3e-4)
TOL: dict[str, float] = {}
# budgets in merged patches of each grid: 4..16 (the tiny processors' own)
BUDGET = {28: (4 * 28 * 28, 16 * 28 * 28), 32: (4 * 32 * 32, 16 * 32 * 32)}


@pytest.fixture(scope="module")
def policy(tiny_family):
    cache = {}

    def get(family: str) -> Policy:
        if family not in cache:
            path = tiny_family(family)
            factor = vision_geometry(_processor(path)).factor
            lo, hi = BUDGET.get(factor, (3136, 12544))
            cache[family] = Policy.from_pretrained(ModelConfig(path=str(path), min_pixels=lo, max_pixels=hi))
        return cache[family]

    return get


def _processor(path: Path):
    from transformers import AutoProcessor

    return AutoProcessor.from_pretrained(path)


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    """Non-square images, left half red and right half blue, by size."""
    d = tmp_path_factory.mktemp("imgs")
    out = {}
    for w, h in SIZES + MORE_SIZES + EXTREME:
        a = np.zeros((h, w, 3), np.uint8)
        a[:, : w // 2] = (230, 20, 20)
        a[:, w // 2 :] = (20, 20, 230)
        Image.fromarray(a).save(d / f"{w}x{h}.png")
        out[(w, h)] = str(d / f"{w}x{h}.png")
    return out


def _sample(
    sid: str, paths: list[str], text: str = "What colour is the shape?", system: bool = False
) -> Sample:
    content = [{"type": "image"} for _ in paths] + [{"type": "text", "text": text}]
    messages = [{"role": "system", "content": "Answer briefly."}] if system else []
    return Sample(sid, messages + [{"role": "user", "content": content}], images=list(paths))


def _image_token_id(policy: Policy) -> int:
    config = policy.model.config
    found = getattr(config, "image_token_id", None)
    return found if found is not None else config.image_token_index


def test_every_family_builds_and_loads_like_a_release(tiny_family):
    from transformers import AutoModelForImageTextToText

    for family in NEW:
        path = tiny_family(family)
        config = json.loads((path / "config.json").read_text())
        assert config["model_type"] == family
        model = AutoModelForImageTextToText.from_pretrained(path)
        assert model.num_parameters() < 600_000  # GLM-4.5V's untied head (vLLM never ties it): 567k
        assert (path / "README.md").read_text().startswith(f"# tiny-{family}\n")
    with pytest.raises(ValueError, match="unknown family 'llama9'"):
        build_tiny(tiny_family("qwen3_vl").parent / "x", family="llama9")


def test_geometry_is_read_from_the_processor(tiny_family):
    want = {
        "qwen2_5_vl": (28, None, 2, Image.Resampling.BICUBIC),
        "qwen3_vl": (32, None, 2, Image.Resampling.BICUBIC),
        "qwen3_vl_moe": (32, None, 2, Image.Resampling.BICUBIC),
        "qwen3_5": (32, None, 2, Image.Resampling.BICUBIC),
        "qwen3_5_moe": (32, None, 2, Image.Resampling.BICUBIC),
        "gemma3": (1, (224, 224), None, Image.Resampling.BILINEAR),
    }
    for family, (factor, fixed, temporal, resample) in want.items():
        geo = vision_geometry(_processor(tiny_family(family)))
        assert (geo.factor, geo.fixed_size, geo.temporal_patch, geo.resample) == (
            factor,
            fixed,
            temporal,
            resample,
        )
    qwen3 = vision_geometry(_processor(tiny_family("qwen3_vl")))
    assert (qwen3.min_pixels, qwen3.max_pixels, qwen3.video_factor) == (4 * 32 * 32, 16 * 32 * 32, 32)
    assert qwen3.model_size(57, 83) == (64, 96)  # the processor's own budget when the run gives none


def test_processor_call_defaults_win_over_image_processor_settings(tiny_family, tmp_path):
    """Gemma3Processor calls its image processor with do_pan_and_scan=False unless told otherwise, so a checkpoint
    whose image processor says True still sees one fixed-size view: the geometry reads what a call does."""
    import shutil

    path = tmp_path / "gemma3-pan"
    shutil.copytree(tiny_family("gemma3"), path)
    conf = json.loads((path / "processor_config.json").read_text())
    conf["image_processor"].update(do_pan_and_scan=True, pan_and_scan_min_crop_size=32)
    (path / "processor_config.json").write_text(json.dumps(conf))
    processor = _processor(path)
    assert processor.image_processor.do_pan_and_scan is True
    geo = vision_geometry(processor)
    assert (geo.tiling, geo.fixed_size) == (None, (224, 224))
    wide = Image.new("RGB", (200, 120))
    text = processor.apply_chat_template([{"role": "user", "content": [{"type": "image"}]}], tokenize=False)
    out = processor(text=[text], images=[wide], return_tensors="pt", add_special_tokens=False)
    assert out["pixel_values"].shape[0] == 1  # no crops


def test_geometry_kinds_from_processor_settings():
    assert vision_geometry(_processor_stub(size={"shortest_edge": 336})).tiling == "resize"  # LLaVA-1.5 style
    llama4 = vision_geometry(_processor_stub(size={"height": 336, "width": 336}, max_patches=16))
    assert llama4.tiling == "max_patches" and llama4.model_size(500, 200) == (500, 200)
    internvl = _processor_stub(size={"height": 448, "width": 448}, crop_to_patches=False, max_patches=12)
    assert vision_geometry(internvl).fixed_size == (448, 448)
    internvl.image_processor.crop_to_patches = True
    assert vision_geometry(internvl).tiling == "crop_to_patches"
    pixtral = _processor_stub(size={"longest_edge": 1540}, patch_size={"height": 14, "width": 14})
    pixtral.spatial_merge_size = 2
    assert (vision_geometry(pixtral).factor, vision_geometry(pixtral).tiling) == (28, None)


def _processor_stub(**attrs):
    class IP:
        pass

    class P:
        image_processor = IP()

    for k, v in attrs.items():
        setattr(P.image_processor, k, v)
    return P()


@pytest.mark.parametrize("family", FAMILIES)
def test_vision_token_count_matches_the_processor(family, policy, images):
    """(a) The number of image tokens the policy encodes equals what the family's processor computes when it resizes
    the original image itself (with the same pixels, to a grey level), and the grid covers exactly the model-size
    pixels; encoding never crashes, and the model takes what was encoded."""
    pol = policy(family)
    geo: VisionGeometry = pol.geometry
    for size in SIZES + MORE_SIZES + EXTREME:
        prompt = pol.encode(_sample("s", [images[size]]))
        n_tokens = int((prompt.input_ids == _image_token_id(pol)).sum())
        if geo.processor_resizes:
            _check_processor_owned(family, pol, prompt, images[size], size, n_tokens)
            continue
        if (
            geo.max_side is not None
        ):  # Pixtral: what mmrl hands over is a fixed point of the processor's resize
            own = pol.processor(text=[pol.processor.image_token], images=prompt.images, return_tensors="pt")
            assert torch.equal(own["pixel_values"], prompt.mm["pixel_values"]), (family, size)
            assert n_tokens == int((own["input_ids"] == _image_token_id(pol)).sum()) > 0, (family, size)
            assert max(prompt.model_image_sizes[0]) <= geo.max_side
            continue
        if size in EXTREME and geo.fixed_size is None:
            t, gh, gw = prompt.mm["image_grid_thw"][0].tolist()
            assert n_tokens == gh * gw // 4 and min(gh, gw) == 2  # one merged patch across the short side
            continue
        own = pol.processor(
            text=[pol.processor.image_token],
            images=[Image.open(images[size]).convert("RGB")],
            images_kwargs=_own_resize(pol, geo),
            return_tensors="pt",
        )
        assert n_tokens == int((own["input_ids"] == _image_token_id(pol)).sum()), (family, size)
        # the same pixels as the processor's own resize, to one grey level (PIL's filter vs torchvision's)
        level = 1 / 255 / min(pol.processor.image_processor.image_std)
        assert (own["pixel_values"] - prompt.mm["pixel_values"]).abs().max() <= level + 1e-5, (family, size)
        mw, mh = prompt.model_image_sizes[0]
        if geo.fixed_size is None:
            t, gh, gw = prompt.mm["image_grid_thw"][0].tolist()
            assert torch.equal(prompt.mm["image_grid_thw"], own["image_grid_thw"])
            patch = pol.processor.image_processor.patch_size
            assert (
                (t, gw * patch, gh * patch) == (1, mw, mh) and mw % geo.factor == 0 and mh % geo.factor == 0
            )
            assert n_tokens == gh * gw // pol.processor.image_processor.merge_size**2
            assert pol.cfg.min_pixels <= mw * mh <= pol.cfg.max_pixels
        else:
            assert (mw, mh) == geo.fixed_size == tuple(prompt.mm["pixel_values"].shape[-1:-3:-1])
            assert n_tokens == pol.model.config.mm_tokens_per_image
            assert own["pixel_values"].shape == prompt.mm["pixel_values"].shape
    with torch.no_grad():  # the model accepts what was encoded
        prompts = [pol.encode(_sample(f"s{i}", [images[s]])) for i, s in enumerate(SIZES)]
        lp, _, _ = pol.logprobs(prompts, [[5, 6]] * len(prompts))
    assert torch.isfinite(lp).all()


def _expected_image_tokens(family: str, processor, w: int, h: int) -> int:
    """The image-feature tokens of one ``w x h`` image, from the processor's config alone (each tiny module
    re-implements its family's tiling rule)."""
    from mmrl.tiny import idefics as tiny_idefics
    from mmrl.tiny import internvl_llava as tiny_internvl_llava
    from mmrl.tiny import llama4_gemma4 as tiny_llama4_gemma4

    if family in ("internvl", "llava_onevision"):
        return tiny_internvl_llava.expected_image_tokens(processor, w, h)
    if family in ("idefics3", "smolvlm"):
        return tiny_idefics.expected_image_soft_tokens(processor, w, h)
    return tiny_llama4_gemma4.expected_image_features(processor, w, h)


def _check_processor_owned(family, pol, prompt, path, size, n_tokens) -> None:
    """A processor that tiles or resizes itself gets the original image: the prompt is the processor's own on the
    original, token for token and pixel for pixel, and its image-token count is the family's rule."""
    assert prompt.model_image_sizes == [size] and prompt.images[0].size == size
    own = pol.processor(
        text=[prompt.text],
        images=[Image.open(path).convert("RGB")],
        return_tensors="pt",
        **({"add_special_tokens": False} if prompt.text.startswith(pol.tokenizer.bos_token or "\0") else {}),
    )
    assert torch.equal(own["input_ids"][0], prompt.input_ids), (family, size)
    assert torch.equal(own["pixel_values"], prompt.mm["pixel_values"]), (family, size)
    assert n_tokens == _expected_image_tokens(family, pol.processor, *size) > 0, (family, size, n_tokens)


def _own_resize(pol: Policy, geo: VisionGeometry) -> dict:
    if geo.fixed_size is not None:
        return {"do_resize": True}
    # GLM-4.xV's resize holds temporal_patch x h x w (an image counts as one temporal patch) to the budget
    t = (
        pol.processor.image_processor.temporal_patch_size
        if pol.model.config.model_type.startswith("glm")
        else 1
    )
    return {
        "do_resize": True,
        "size": {"shortest_edge": pol.cfg.min_pixels * t, "longest_edge": pol.cfg.max_pixels * t},
    }


@pytest.mark.parametrize("family", FAMILIES)
def test_coordinates_map_exactly_between_original_and_model_pixels(family, policy, images):
    """(b) model_image_sizes is the size of the pixels the model saw, and the per-axis map (the GUI reward's) sends
    corners to corners, round-trips and puts the image's red/blue edge where the model's pixels have it."""
    pol = policy(family)
    for size in SIZES + MORE_SIZES[-2:] + EXTREME:
        prompt = pol.encode(_sample("s", [images[size]]))
        (ow, oh), (mw, mh) = prompt.image_sizes[0], prompt.model_image_sizes[0]
        assert (ow, oh) == size and prompt.images[0].size == (mw, mh)
        geom = ImageGeometry(original_size=(ow, oh), model_size=(mw, mh))
        reward_map = to_original({"image_sizes": [[ow, oh]], "model_image_sizes": [[mw, mh]]})
        assert reward_map(mw, mh) == geom.to_original(mw, mh) == (ow, oh)
        assert geom.to_model(ow, oh) == (mw, mh) and geom.to_original(0, 0) == (0, 0)
        for x, y in [(0.5, 0.5), (ow / 3, oh / 7), (ow - 1, oh - 1), (ow / 2, oh / 2)]:
            assert geom.to_original(*geom.to_model(x, y)) == pytest.approx((x, y), abs=1e-9)
            assert reward_map(*geom.to_model(x, y)) == pytest.approx((x, y), abs=1e-9)
        if ow >= 8:  # the colour edge at original x = ow // 2 sits at the mapped model x, within a pixel
            row = np.asarray(prompt.images[0])[mh // 2, :, 0].astype(int)  # red channel
            edge = int(np.argmax(row < 125))
            assert abs(edge - geom.to_model(ow // 2, 0)[0]) <= 1.5, (family, size, edge)


@pytest.mark.parametrize("family", FAMILIES)
def test_rollout_logprobs_equal_the_training_forward(family, policy, images):
    """(c) fp32: the HF engine's log-probs equal the training forward's to 1e-5 (batched with left padding, two images
    in one prompt, a system prompt, text only), and the training forward has real gradients."""
    pol = policy(family)
    torch.manual_seed(0)
    samples = [
        _sample("one", [images[SIZES[0]]], system=True),
        _sample("two", [images[SIZES[1]], images[SIZES[2]]], "How many shapes in both pictures?"),
        Sample(
            "text", [{"role": "user", "content": "no image at all, a longer question to change the padding"}]
        ),
    ]
    prompts = [pol.encode(s) for s in samples]
    assert len({len(p.input_ids) for p in prompts}) == 3
    groups = HFEngine(pol, batch_size=3).generate(
        prompts, SamplingParams(n=2, temperature=1.0, max_new_tokens=6)
    )
    comps = [c for g in groups for c in g]
    flat = [p for p in prompts for _ in range(2)]
    with pol.training():
        lp, _, mask = pol.logprobs(flat, [c.token_ids for c in comps])
        (lp.sum() / mask.sum()).backward()
    for i, c in enumerate(comps):
        assert not set(c.token_ids) & set(pol.suppressed_token_ids)
        assert mask[i].sum().item() == len(c.token_ids)
        err = (lp[i, : len(c.token_ids)].detach() - torch.tensor(c.logprobs)).abs().max().item()
        assert err < TOL.get(family, 1e-5), (family, i, err)
    grads = {n: p.grad for n, p in pol.model.named_parameters() if p.grad is not None}
    decoder = language_model_prefix(pol.model)
    assert any(n.startswith(decoder) and g.abs().sum() > 0 for n, g in grads.items())
    assert any(is_vision_param(n, decoder) and g.abs().sum() > 0 for n, g in grads.items())
    pol.model.zero_grad(set_to_none=True)


def _train_config(tmp_path: Path, model_dir: Path, lora: bool) -> Path:
    from mmrl.recipes.shapes.data import build

    if not (tmp_path / "data").exists():
        build(tmp_path / "data", n_train=8, n_eval=4, seed=6)
    lora_part = ", lora: {r: 4, alpha: 8}" if lora else ""
    cfg = tmp_path / ("lora.yaml" if lora else "full.yaml")
    cfg.write_text(
        f"""
model: {{path: {model_dir}, min_pixels: 4096, max_pixels: 4096{lora_part}}}
data: {{train: data/train.jsonl}}
rollout: {{n: 2, max_new_tokens: 3, batch_size: 4}}
algo: {{kl_coef: 0.01, entropy_coef: 0.01}}  # the entropy term has gradients even when every reward is 0
optim: {{lr: 0.001, micro_batch_size: 4}}
rewards: [{{name: exact_match}}]
train: {{prompts_per_step: 2, progress: false, seed: 3}}
"""
    )
    return cfg


@pytest.mark.parametrize("family", NEW)
def test_train_two_steps_full_and_lora(family, tiny_family, tmp_path):
    """(d) `mmrl train` runs 2 GRPO steps on the shapes data (56x56 images: on the 28 grid, not on 32) with full
    fine-tuning and with LoRA's default targets, and saves a checkpoint that loads."""
    for lora in (False, True):
        out = tmp_path / ("lora" if lora else "full")
        cfg = _train_config(tmp_path, tiny_family(family), lora)
        assert main(["train", str(cfg), "--output-dir", str(out), "--max-steps", "2"]) == 0
        rows = [r for r in read_metrics(out / "metrics.jsonl") if "loss" in r]
        assert [r["step"] for r in rows] == [1, 2] and all(np.isfinite(r["loss"]) for r in rows)
        assert rows[-1]["grad_norm"] > 0
        model_dir = out / "checkpoints" / "step-2" / "model"
        assert (model_dir / "adapter" / "adapter_config.json").is_file() == lora
    saved = Policy.from_pretrained(
        ModelConfig(path=str(tmp_path / "full" / "checkpoints" / "step-2" / "model"))
    )
    assert saved.geometry == Policy.from_pretrained(ModelConfig(path=str(tiny_family(family)))).geometry


@pytest.mark.parametrize("family", NEW)
def test_video_frames_follow_the_video_geometry(family, policy, tmp_path):
    """Video frames of a 90x50 clip: a grid video processor (Qwen3-VL, Qwen3.5, GLM-4.xV) gets them resized to its
    grid and padded to its temporal patch, with the grid's token count; one that resizes frames itself (LLaVA-OneVision,
    SmolVLM2, InternVL, Gemma 4) gets them as selected and writes the tokens its own call writes; a family without a
    video processor refuses the sample, naming it. The model accepts what was encoded."""
    import cv2

    from mmrl.processors.errors import MediaError

    path = tmp_path / "clip.avi"
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"MJPG"), 10.0, (90, 50))
    for i in range(15):
        writer.write(np.full((50, 90, 3), 12 * i, np.uint8))
    writer.release()
    pol = policy(family)
    geo = pol.geometry
    content = [{"type": "video"}, {"type": "text", "text": "What happens?"}]
    sample = Sample("v", [{"role": "user", "content": content}], videos=[str(path)])
    if geo.video_factor is None:
        with pytest.raises(MediaError, match="sample 'v'.*takes no video"):
            pol.encode(sample)
        return
    prompt = pol.encode(sample)
    frames = prompt.videos[0]  # [T, H, W, 3]
    if geo.video_resizes:
        own = pol.processor(
            text=[prompt.text],
            videos=[[frames]],  # one list per text, as Policy.encode passes them
            videos_kwargs={
                "do_sample_frames": False,
                "video_metadata": [
                    {
                        "fps": prompt.video_fps[0],
                        "total_num_frames": len(frames),
                        "frames_indices": list(range(len(frames))),
                    }
                ],
            },
            return_tensors="pt",
            **(
                {"add_special_tokens": False}
                if prompt.text.startswith(pol.tokenizer.bos_token or "\0")
                else {}
            ),
        )
        assert torch.equal(own["input_ids"][0], prompt.input_ids)
    else:
        t, gh, gw = prompt.mm["video_grid_thw"][0].tolist()
        patch, temporal = pol.processor.video_processor.patch_size, geo.temporal_patch
        assert frames.shape[1] % geo.video_factor == 0 and frames.shape[2] % geo.video_factor == 0
        assert len(frames) % temporal == 0 and (t * temporal, gh * patch, gw * patch) == frames.shape[:3]
        # GLM-4.xV writes a video's frames with its image token between per-frame markers
        slots = {getattr(pol.model.config, "video_token_id", None), _image_token_id(pol)}
        assert int(sum((prompt.input_ids == s).sum() for s in slots if s is not None)) == t * gh * gw // 4
    with torch.no_grad():
        assert torch.isfinite(pol.logprobs([prompt], [[5, 6]])[0]).all()


@pytest.mark.parametrize("family", ["gemma3", "gemma4", "mistral3", "llama4", "idefics3"])
def test_a_bos_written_by_the_template_is_not_added_again(family, policy, images):
    pol = policy(family)  # these tokenizers add a BOS and their templates write one
    ids = pol.encode(_sample("s", [images[SIZES[0]]], system=True)).input_ids
    assert ids[0] == pol.tokenizer.bos_token_id and int((ids == pol.tokenizer.bos_token_id).sum()) == 1
    assert pol.tokenizer("hi").input_ids[0] == pol.tokenizer.bos_token_id


@pytest.mark.parametrize("family", ["qwen3_5", "glm4v_moe"])
def test_thinking_prompts_and_the_rewards_view_of_them(family, tiny_family, images):
    """Qwen3.5's generation prompt opens a think block: the rewards see it before the completion (so a
    <think>...</think><answer> format check passes); model.chat_template_kwargs switches thinking off."""
    from mmrl.train.collect import reward_inputs

    sample = _sample("s", [images[SIZES[0]]])
    think = Policy.from_pretrained(ModelConfig(path=str(tiny_family(family))), trainable=False)
    plain = Policy.from_pretrained(
        ModelConfig(path=str(tiny_family(family)), chat_template_kwargs={"enable_thinking": False}),
        trainable=False,
    )
    opened, closed = think.encode(sample), plain.encode(sample)
    assert closed.response_prefix == "" and closed.text != opened.text
    assert "</think>" in closed.text.split("<think>")[-1]  # an empty, closed block
    if family == "qwen3_5":
        assert opened.response_prefix == "<think>\n" and opened.text.endswith(
            "<|im_start|>assistant\n<think>\n"
        )
        seen = reward_inputs(sample, opened, ["red.</think>\n<answer>red</answer>"], [5])[0].response
        assert seen == "<think>\nred.</think>\n<answer>red</answer>"
        from mmrl.rewards.text import is_think_answer

        assert is_think_answer(seen) and not is_think_answer(seen.removeprefix("<think>\n"))


def test_the_28_pixel_grid_is_what_crashed_qwen3(policy, images):
    """Why the geometry must come from the processor: a Qwen3-VL processor handed a 28-grid image (what mmrl's
    resize produced before) without resizing cannot cut it into 32 px merged patches."""
    pol = policy("qwen3_vl")
    img = Image.open(images[SIZES[0]]).convert("RGB").resize((56, 84))  # smart_resize(83, 57) at factor 28
    with pytest.raises(RuntimeError, match="is invalid for input of size"):
        pol.processor(text=["<|image_pad|>"], images=[img], images_kwargs={"do_resize": False})


@pytest.mark.parametrize("family", FAMILIES)
def test_mmrl_eval_on_non_square_screenshots(family, tiny_family, tmp_path):
    """`mmrl eval` runs ScreenSpot's fixture (480x300, 400x300 and 270x480 screenshots) with each family: every item
    is predicted and scored, the points read in the family's coordinate frame."""
    fixture = ROOT / "tests" / "data" / "eval" / "screenspot"
    out = tmp_path / "eval"
    args = ["eval", "--benchmark", "screenspot", "--data", str(fixture), "--output-dir", str(out)]
    args += ["--model", str(tiny_family(family)), "--no-progress", "max_new_tokens=4", "device=cpu"]
    assert main(args + ["min_pixels=4096", "max_pixels=16384"]) == 0
    rows = [json.loads(line) for line in (out / "predictions.jsonl").read_text().splitlines()]
    metrics = json.loads((out / "metrics.json").read_text())
    assert len(rows) == metrics["items"] >= 3 and all(isinstance(r["correct"], (bool, float)) for r in rows)


@pytest.mark.parametrize("family", ["qwen3_vl", "qwen3_5", "glm4v", "internvl"])
def test_an_image_in_the_system_turn(family, policy, images):
    """A reference image in the system message (templates that render system content as parts): both images are
    encoded in order, each with its own token count, and the model scores the prompt."""
    pol = policy(family)
    a, b = images[SIZES[0]], images[SIZES[1]]
    system = {"role": "system", "content": [{"type": "image"}, {"type": "text", "text": "The reference."}]}
    user = {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Same shape?"}]}
    both = pol.encode(Sample("s", [system, user], images=[a, b]))
    alone = [pol.encode(_sample("s", [p])) for p in (a, b)]
    count = [int((p.input_ids == _image_token_id(pol)).sum()) for p in [both, *alone]]
    assert count[0] == count[1] + count[2] > 0 and both.image_sizes == [SIZES[0], SIZES[1]]
    with torch.no_grad():
        assert torch.isfinite(pol.logprobs([both], [[5, 6]])[0]).all()


def test_qwen3_vl_moe_experts_are_saved_and_streamed_as_released(tiny_family):
    """Qwen3-VL-MoE's fused experts are stored transposed at release ([experts, in, out]), which vLLM reads;
    transformers keeps them [experts, out, in] and its save_pretrained does not transpose back. The tiny checkpoint
    is written as released, loads back to the same weights, and the engine's weight stream sends the file's layout."""
    from safetensors.torch import load_file

    from mmrl.model.layout import release_transposes

    path = tiny_family("qwen3_vl_moe")
    saved = load_file(path / "model.safetensors")
    pol = Policy.from_pretrained(ModelConfig(path=str(path)), trainable=False)
    assert [p for p, _, _ in release_transposes(pol.model)] == [
        "mlp.experts.gate_up_proj",
        "mlp.experts.down_proj",
    ]
    experts = {k: v for k, v in saved.items() if ".experts." in k}
    assert len(experts) == 4
    memory = pol.model.state_dict()
    for key, t in experts.items():
        assert torch.equal(memory[key], t.transpose(1, 2))  # loaded back into transformers' layout
    streamed = {k: v for k, v in pol.stream_weights() if ".experts." in k}
    assert streamed.keys() == experts.keys() and all(torch.equal(streamed[k], experts[k]) for k in experts)


ZOOM_TOOL = {
    "type": "function",
    "function": {
        "name": "zoom",
        "description": "Crop the image to a box and return it at full resolution.",
        "parameters": {
            "type": "object",
            "properties": {k: {"type": "integer"} for k in ("x1", "y1", "x2", "y2")},
            "required": ["x1", "y1", "x2", "y2"],
        },
    },
}


@pytest.mark.parametrize("family", ["qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_5"])
def test_an_image_in_a_tool_turn(family, images, tiny_family):
    """An agent turn: the user's image, the assistant's tool call, the tool's result carrying a new image (the zoom
    crop). The templates render the call and the result (Qwen3's inside <tool_response>, one token each side), both
    images are encoded in order with their own token counts, and the HF engine's log-probs after the tool turn equal
    the training forward's with gradients in the vision tower."""
    path = tiny_family(family)
    lo, hi = BUDGET[vision_geometry(_processor(path)).factor]
    kwargs = {"tools": [ZOOM_TOOL]} if family.startswith("qwen3") else {}
    pol = Policy.from_pretrained(
        ModelConfig(path=str(path), min_pixels=lo, max_pixels=hi, chat_template_kwargs=kwargs)
    )
    a, b = images[SIZES[1]], images[SIZES[0]]
    call = {
        "type": "function",
        "function": {"name": "zoom", "arguments": {"x1": 0, "y1": 0, "x2": 100, "y2": 60}},
    }
    messages = [
        {
            "role": "user",
            "content": [{"type": "image"}, {"type": "text", "text": "What colour is the left half?"}],
        },
        {"role": "assistant", "content": "I zoom in.", "tool_calls": [call]},
        {"role": "tool", "content": [{"type": "image"}, {"type": "text", "text": "the crop"}]},
    ]
    both = pol.encode(Sample("tool", messages, images=[a, b]))
    alone = [pol.encode(_sample("s", [p])) for p in (a, b)]
    image_id = _image_token_id(pol)
    count = [int((p.input_ids == image_id).sum()) for p in [both, *alone]]
    assert count[0] == count[1] + count[2] > 0 and both.image_sizes == [SIZES[1], SIZES[0]]
    ids = both.input_ids.tolist()
    first_b = ids.index(image_id, ids.index(image_id) + count[1])  # the crop's tokens come after the call
    if family.startswith("qwen3"):
        tok = pol.tokenizer
        assert '"name": "zoom"' in both.text or "<function=zoom>" in both.text
        tags = tok.convert_tokens_to_ids(["<tool_call>", "<tool_response>", "</tool_response>"])
        assert ids.index(tags[0]) < ids.index(tags[1]) < first_b < ids.index(tags[2])
    else:  # Qwen2-VL's template: a plain "tool" turn
        assert "<|im_start|>tool\n" in both.text
    torch.manual_seed(0)
    comps = HFEngine(pol).generate([both], SamplingParams(n=2, temperature=1.0, max_new_tokens=6))[0]
    with pol.training():
        lp, _, mask = pol.logprobs([both] * 2, [c.token_ids for c in comps])
        (lp.sum() / mask.sum()).backward()
    for i, c in enumerate(comps):
        assert (lp[i, : len(c.token_ids)].detach() - torch.tensor(c.logprobs)).abs().max().item() < 1e-5
    decoder = language_model_prefix(pol.model)
    assert any(
        is_vision_param(n, decoder) and p.grad is not None and p.grad.abs().sum() > 0
        for n, p in pol.model.named_parameters()
    )


class _ForceAt:
    """A logits processor that forces ``token`` for row ``row`` at generation step ``step`` (after the recorder, so
    the recorded log-prob stays the model's own)."""

    def __init__(self, forced: dict[int, tuple[int, int]], prompt_len: int):
        self.forced, self.prompt_len = forced, prompt_len

    def __call__(self, input_ids, scores):
        step = input_ids.shape[1] - self.prompt_len
        for row, (at, token) in self.forced.items():
            if step == at:
                scores[row] = float("-inf")
                scores[row, token] = 0.0
        return scores


@pytest.mark.parametrize("family", ["qwen3_vl", "gemma3", "glm4v", "llama4", "idefics3"])
def test_every_stop_id_ends_a_completion(family, policy, images, monkeypatch):
    """Checkpoints stop on several ids (generation_config.eos_token_id: Qwen's <|im_end|> and <|endoftext|>,
    Gemma's <eos> and <end_of_turn>, GLM's <|endoftext|>, <|user|>, <|observation|>, </answer>, ...). Each row of one
    batch is made to emit a different stop id at a different step: each completion ends right there, with that id,
    marked "stop", while the rows that go on are not cut short."""
    pol = policy(family)
    stops = pol.eos_ids
    assert len(stops) >= 2 and stops == list(pol.model.generation_config.eos_token_id)
    prompt = pol.encode(_sample("s", [images[SIZES[0]]]))
    forced = {row: (row + 1, stop) for row, stop in enumerate(stops)}  # row r emits stops[r] as token r + 2
    engine = HFEngine(pol, batch_size=len(stops) + 1)
    chain = engine._processors

    def processors(params):
        procs, recorder = chain(params)
        return [*procs, _ForceAt(forced, len(prompt.input_ids))], recorder

    monkeypatch.setattr(engine, "_processors", processors)
    torch.manual_seed(0)
    params = SamplingParams(n=len(stops) + 1, temperature=1.0, max_new_tokens=len(stops) + 3)
    rows = engine.generate([prompt], params)[0]
    for row, (at, stop) in forced.items():
        c = rows[row]
        assert c.finish_reason == "stop" and c.token_ids[-1] == stop and len(c.token_ids) == at + 1, (row, c)
        assert not set(c.token_ids[:-1]) & set(stops) and len(c.logprobs) == len(c.token_ids)
    free = rows[len(stops)]  # no forced stop: it runs to the length limit unless it samples a stop itself
    assert free.finish_reason == "length" or free.token_ids[-1] in stops
