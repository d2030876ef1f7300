"""Hint scaffolding (docs/cliff.md): the hint builders on records worked out by hand, a hinted prompt that keeps its
images (encoded with the same pixels, the hint's tokens added), and GHPO and Scaf-GRPO in a real collector: a reward
that only hinted prompts can earn (``saw_hint``: rungs two and three) shows which rung each picks and what it
replaces."""

from pathlib import Path

import pytest
import torch
from PIL import Image
from tiny_config import shapes_config

from mmrl.config import ConfigError, load_config
from mmrl.train.hints import GHPO_LEAD, HINTS, register_hints, with_hint
from mmrl.types import Sample

ROOT = Path(__file__).resolve().parents[1]
TINY = str(ROOT / "assets" / "tiny-qwen2.5-vl")
PLUGIN = str(ROOT / "tests" / "reward_plugin_example.py")


@register_hints("test_rungs")
def three_rungs(sample: Sample) -> list[str]:
    return ["rung one", "rung two", "rung three"]


def _image_sample(tmp_path: Path, **kw) -> Sample:
    path = tmp_path / "img.png"
    Image.new("RGB", (64, 48), (200, 10, 10)).save(path)
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "How many?"}]}]
    return Sample("r1", messages, images=[str(path)], **kw)


def test_builders_by_hand(tmp_path):
    s = Sample("a", [{"role": "user", "content": "q"}], answer="abcdefgh")
    assert HINTS.get("reference_prefix")(s) == [GHPO_LEAD + "ab", GHPO_LEAD + "abcd", GHPO_LEAD + "abcdef"]
    # a worked solution is preferred; characters are counted; empty or repeated rungs are dropped
    s = Sample("b", [{"role": "user", "content": "q"}], answer="3", metadata={"solution": "180-50-70"})
    assert HINTS.get("reference_prefix")(s) == [GHPO_LEAD + "18", GHPO_LEAD + "180-", GHPO_LEAD + "180-50-"]
    assert HINTS.get("reference_prefix")(Sample("c", [], answer="3")) == [GHPO_LEAD + "3"]
    geo = HINTS.get("geometry")(
        Sample("g", [], answer="60", metadata={"solution": "180-50-70", "answer": "60"})
    )
    assert geo == [
        "Hint: the answer is a number.",
        "Hint: the answer is a number. Compute 180-50-70.",
        "Hint: the answer is a number. Compute 180-50-70. The answer begins with 6.",
    ]
    mc = HINTS.get("geometry")(
        Sample("m", [], answer="B", metadata={"choices": ["1", "2", "3"], "answer": "B"})
    )
    assert mc == ["Hint: the answer is one of the letters A, B, C."]
    tex = r"\begin{tabular}{ll} a & b \\ c & d \\ e & f \\ \end{tabular}"
    rows = HINTS.get("table2latex")(Sample("t", [], answer=tex))
    assert [r.split("begins with:\n")[1] for r in rows] == [
        r"\begin{tabular}{ll} a & b \\",
        r"\begin{tabular}{ll} a & b \\ c & d \\",
    ]  # never the whole table: the last row end is left out
    img = _image_sample(tmp_path, answer="necrosis", metadata={"region": [40, 30, 60, 44]})
    assert HINTS.get("pathology")(img) == [
        "Hint: the lesion lies in the bottom-right quadrant of the image.",
        "Hint: the lesion lies in the bottom-right quadrant of the image. It is necrosis.",
    ]
    closed = Sample("p", [], answer="yes", metadata={"question_type": "closed"})
    assert HINTS.get("pathology")(closed) == [
        "Hint: the answer is yes or no.",
        "Hint: the answer is yes or no. It begins with 'y'.",
    ]
    gui = Sample(
        "u",
        [],
        metadata={
            "target": {"id": "e1", "kind": "button", "name": "Save"},
            "elements": [{"id": "e1", "bbox": [10, 10, 30, 20]}],
            "image_size": [200, 100],
        },
    )
    assert HINTS.get("gui")(gui) == [
        "Hint: act on the button named 'Save'.",
        "Hint: act on the button named 'Save'. It is in the top-left quadrant of the screen.",
    ]
    assert HINTS.get("gui")(Sample("v", [], metadata={})) == []


def test_hinted_prompt_keeps_its_images(tmp_path):
    from mmrl.config import ModelConfig
    from mmrl.model.policy import Policy

    policy = Policy.from_pretrained(ModelConfig(path=TINY, min_pixels=3136, max_pixels=3136))
    s = _image_sample(tmp_path)
    h = with_hint(s, "rung one")
    assert h.images == s.images and h.id == s.id
    assert h.messages[0]["content"][:2] == s.messages[0]["content"]
    assert h.prompt_text == "How many?\nrung one"
    a, b = policy.encode(s), policy.encode(h)
    assert torch.equal(a.mm["pixel_values"], b.mm["pixel_values"])
    assert torch.equal(a.mm["image_grid_thw"], b.mm["image_grid_thw"])
    pad = policy.processor.tokenizer.convert_tokens_to_ids("<|image_pad|>")
    assert (a.input_ids == pad).sum() == (b.input_ids == pad).sum() > 0
    assert "rung one" in policy.tokenizer.decode(b.input_ids) and len(b.input_ids) > len(a.input_ids)
    with pytest.raises(ValueError, match="no user turn"):
        with_hint(Sample("x", [{"role": "system", "content": "s"}]), "h")


def _recipe(tmp_path: Path, augment: str, options: str) -> Path:
    cfg = shapes_config(
        tmp_path,
        f"""\
rollout: {{n: 4, max_new_tokens: 3, batch_size: 8}}
rewards: [{{name: '{PLUGIN}:saw_hint'}}]
algo: {{epochs: 1, mini_batches: 1, augment: {augment}, augment_options: {{hints: test_rungs{options}}}}}
optim: {{lr: 0.001, micro_batch_size: 8}}
train: {{prompts_per_step: 2, progress: false, seed: 3}}
""",
    )
    return cfg


def _trainer(cfg: Path, out: Path):
    from mmrl.train.trainer import Trainer

    return Trainer(load_config(str(cfg)), out)


def test_ghpo_regenerates_failed_groups_rung_by_rung(tmp_path):
    trainer = _trainer(_recipe(tmp_path, "ghpo", ""), tmp_path / "run")
    try:
        got = trainer.collector.collect(1)
        # every unhinted group fails; rung one fails too; rung two succeeds: whole groups replaced
        assert got.stats["ghpo/failed_groups"] == 2 and got.stats["ghpo/rescued"] == 2
        assert got.stats["ghpo/rung"] == 2.0 and got.stats["ghpo/hinted_rows"] == 8
        assert got.stats["ghpo/extra_samples"] == 16  # rung one and rung two, 2 groups x 4 each
        assert got.rewards.tolist() == [[1.0] * 4] * 2
        assert [r.score for r in got.results] == [1.0] * 8  # the logs read the hinted responses' own results
        for b, row in enumerate(got.trajectories):
            for t in row:
                assert t.sample.prompt_text.endswith("\nrung two") and t.sample.id == got.samples[b].id
                assert t.sample.images == got.samples[b].images
                # the training row's prompt is the hinted one: the hint's tokens are in what the update scores
                assert "rung two" in trainer.policy.tokenizer.decode(t.prompt.input_ids)
        batch = trainer.make_batch(got)
        assert [t.prompt for t in batch.trajectories] == [t.prompt for row in got.trajectories for t in row]
    finally:
        trainer.collector.close()


def test_scaf_splices_the_lowest_successful_rung_after_its_warmup(tmp_path):
    trainer = _trainer(_recipe(tmp_path, "scaf", ", warmup_steps: 1"), tmp_path / "run")
    try:
        got = trainer.collector.collect(1)  # within the exemption period: nothing happens
        assert got.stats["scaf/failed_groups"] == 0 and got.resolve().rewards.sum() == 0
        got = trainer.collector.collect(2)
        assert got.stats["scaf/failed_groups"] == 2 and got.stats["scaf/rung"] == 2.0
        assert got.stats["scaf/extra_samples"] == 6  # three rungs once, 2 groups
        assert got.rewards.tolist() == [[1.0, 0.0, 0.0, 0.0]] * 2  # 1 right (hinted), G - 1 wrong
        for row in got.trajectories:
            assert row[0].sample.prompt_text.endswith("\nrung two")
            assert all("rung" not in t.sample.prompt_text for t in row[1:])
        batch = trainer.make_batch(got)
        trainer.advantages(got, batch)
        assert batch.advantages[0] > 0 and (batch.advantages[1:4] < 0).all()
    finally:
        trainer.collector.close()


def test_config_checks(tmp_path):
    from mmrl.train.checks import check_components

    check_components(load_config(str(_recipe(tmp_path, "ghpo", ", max_rungs: 2"))))
    with pytest.raises(ConfigError, match="hint builder 'nope'"):
        check_components(
            load_config(str(_recipe(tmp_path, "ghpo", "")), ["algo.augment_options={hints: nope}"])
        )
    with pytest.raises(ConfigError, match="algo.dynamic_sampling drops them"):
        check_components(load_config(str(_recipe(tmp_path, "ghpo", "")), ["algo.dynamic_sampling=true"]))
    with pytest.raises(ConfigError, match="slots .* must leave an unhinted response"):
        check_components(load_config(str(_recipe(tmp_path, "scaf", ", slots: 4"))))
