"""Critique-GRPO (mmrl.algos.critique, mmrl.train.critique, docs/cliff.md#critique-grpo): the loss on hand-computed
tensors (surrogate on on-policy tokens, shaping f(p) = p / (p + gamma) on refinement tokens, with their gradients);
the refinement prompt keeps the record's images; and the pass in a real collector: a reward that only a refinement
can earn (it sees the critique's ground truth) shows the refinement placed under the original question, marked
off-policy, and reaching the loss in an update.

Hand values: two tokens, A = 1, gamma = 0.1.
    token 0 on-policy:  p = 0.5, pi_old = 0.25: ratio 2, L = -A ratio = -2,  dL/dlogp = -ratio = -2
    token 1 refinement: p = 0.1:  f = 0.1 / 0.2 = 0.5, L = -0.5, dL/dlogp = -A gamma p / (p + gamma)^2 = -0.25
"""

import math
from pathlib import Path

import pytest
import torch
from PIL import Image
from tiny_config import shapes_config

from mmrl.algos import LOSSES
from mmrl.algos.critique import critique_loss, shaping
from mmrl.config import ConfigError, load_config
from mmrl.train.critique import CritiquePass, critique_text, refinement_sample
from mmrl.types import Sample

ROOT = Path(__file__).resolve().parents[1]
TINY = str(ROOT / "assets" / "tiny-qwen2.5-vl")
PLUGIN = str(ROOT / "tests" / "reward_plugin_example.py")


def test_loss_hand_values():
    logp = torch.tensor([[math.log(0.5), math.log(0.1)]], requires_grad=True)
    old = torch.tensor([[math.log(0.25), math.log(0.1)]])
    mask = torch.ones(1, 2)
    off = torch.tensor([[0.0, 1.0]])
    loss, stats = critique_loss(logp, old, torch.tensor([1.0]), mask, off_policy=off)
    assert loss.tolist()[0] == pytest.approx([-2.0, -0.5])
    loss.sum().backward()
    assert logp.grad.tolist()[0] == pytest.approx([-2.0, -0.25])
    assert stats["critique/off_policy_tokens"].item() == 0.5
    assert stats["critique/refinement_prob"].item() == pytest.approx(0.1)
    assert stats["ratio_mean"].item() == pytest.approx(2.0)  # over on-policy tokens only
    # clip: true takes clipped's surrogate on on-policy tokens: ratio 2 clipped to 1.2 for A > 0
    loss, _ = critique_loss(logp.detach(), old, torch.tensor([1.0]), mask, off_policy=off, clip=True)
    assert loss.tolist()[0] == pytest.approx([-1.2, -0.5])
    assert shaping(torch.log(torch.tensor([0.1, 0.9])), 0.1).tolist() == pytest.approx([0.5, 0.9])
    assert LOSSES.get("critique").needs_off_policy
    with pytest.raises(ValueError, match="gamma must be > 0"):
        critique_loss(logp, old, torch.tensor([1.0]), mask, gamma=0.0)


def test_refinement_prompt_keeps_the_images(tmp_path):
    from mmrl.config import ModelConfig
    from mmrl.model.policy import Policy

    path = tmp_path / "img.png"
    Image.new("RGB", (64, 48), (10, 200, 10)).save(path)
    s = Sample("r", [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "How many?"}]}],
               images=[str(path)], answer="3")  # fmt: skip
    assert critique_text("simple", False, "3") == "The generated solution is incorrect."
    assert (
        critique_text("simple_gt", True, "3") == "The generated solution is correct. The ground truth is 3."
    )
    r = refinement_sample(s, "<answer>4</answer>", critique_text("simple_gt", False, "3"))
    assert [m["role"] for m in r.messages] == ["user", "assistant", "user"]
    assert r.messages[0] == s.messages[0] and r.images == s.images
    assert r.prompt_text.startswith("The generated solution is incorrect. The ground truth is 3.\n")
    policy = Policy.from_pretrained(ModelConfig(path=TINY, min_pixels=3136, max_pixels=3136))
    a, b = policy.encode(s), policy.encode(r)
    assert torch.equal(a.mm["pixel_values"], b.mm["pixel_values"])
    assert "<answer>4</answer>" in policy.tokenizer.decode(b.input_ids)


def _recipe(tmp_path: Path, extra: str = "") -> Path:
    cfg = shapes_config(
        tmp_path,
        f"""\
rollout: {{n: 4, max_new_tokens: 3, batch_size: 16}}
rewards: [{{name: '{PLUGIN}:saw_hint', options: {{needle: ground truth}}}}]
algo: {{epochs: 1, mini_batches: 1, advantage: dr_grpo, loss: critique, augment: critique{extra}}}
optim: {{lr: 0.001, micro_batch_size: 8}}
train: {{prompts_per_step: 2, progress: false, seed: 3}}
""",
    )
    return cfg


def test_the_pass_in_a_collector_and_an_update(tmp_path):
    from mmrl.train.trainer import Trainer

    trainer = Trainer(load_config(str(_recipe(tmp_path))), tmp_path / "run")
    try:
        got = trainer.collector.collect(1)
        # initial responses never see a ground truth (0); every refinement does (1): slot 0 of each group
        assert got.rewards.tolist() == [[1.0, 0.0, 0.0, 0.0]] * 2
        assert got.off_policy_rows == {0, 4}
        assert [got.results[r].score for r in (0, 4)] == [1.0, 1.0]  # the refinements' own reward results
        assert got.stats["critique/extra_samples"] == 8 and got.stats["critique/refined_right"] == 1.0
        assert got.stats["critique/fixed"] == 1.0 and got.stats["critique/placed"] == 2
        for b, row in enumerate(got.trajectories):
            t = row[0]
            assert t.sample is got.samples[b] and t.prompt is trainer.collector.encode(got.samples[b])
            assert "ground truth" not in trainer.policy.tokenizer.decode(
                t.prompt.input_ids
            )  # the original question
        batch = trainer.make_batch(got)
        assert batch.off_policy_rows == {0, 4}
        trainer.advantages(got, batch)
        seen = {}
        real = trainer.updater.loss_fn

        def spy(*args, **kw):
            seen.setdefault("off", []).append(kw["off_policy"])
            return real(*args, **kw)

        trainer.updater.loss_fn = spy
        stats = trainer.updater(batch, 0)
        off = torch.cat([o.sum(1) > 0 for o in seen["off"]]).tolist()
        assert sorted(off) == [False] * 6 + [True] * 2  # exactly the two placed rows
        assert 0 < stats["critique/off_policy_tokens"] < 1 and stats["grad_norm"] > 0
    finally:
        trainer.collector.close()


def test_config_checks(tmp_path):
    from mmrl.train.checks import check_components

    check_components(load_config(str(_recipe(tmp_path))))
    with pytest.raises(ConfigError, match="algo.loss: critique"):
        check_components(load_config(str(_recipe(tmp_path)), ["algo.loss=clipped"]))
    with pytest.raises(ConfigError, match="interpolated proximal policy"):
        check_components(load_config(str(_recipe(tmp_path)), ["algo.old_logprobs=interpolate"]))
    with pytest.raises(ConfigError, match="critic must be"):
        check_components(load_config(str(_recipe(tmp_path)), ["algo.augment_options={critic: oracle}"]))
    with pytest.raises(ConfigError, match="needs the judge's options"):
        check_components(load_config(str(_recipe(tmp_path)), ["algo.augment_options={critic: judge}"]))
    with pytest.raises(ConfigError, match="must contain"):
        check_components(
            load_config(
                str(_recipe(tmp_path)),
                [
                    f"algo.augment_options={{critic: judge, judge: {{model: {JUDGE}, template: 'Grade {{verdict}}'}}}}"
                ],
            )
        )
    with pytest.raises(ConfigError, match="judge.model"):
        check_components(
            load_config(
                str(_recipe(tmp_path)), ["algo.augment_options={critic: judge, judge: {model: nowhere}}"]
            )
        )
    assert CritiquePass().critic == "simple_gt"


JUDGE = ROOT / "assets" / "tiny-judge"


def test_a_judge_writes_the_critiques():
    """The shipped tiny judge as the critic, with the template it was trained on: its verdict is its critique (a
    real judge writes sentences; this one writes YES or NO), the record's question and reference filled in."""
    from mmrl.recipes.medvqa import language
    from mmrl.rewards.judge import DEFAULT_TEMPLATE
    from mmrl.rewards.local_model import Loaded
    from mmrl.train.critique import JudgeCritic, question_text

    content = [{"type": "image"}, {"type": "text", "text": language.QUESTION}]
    s = Sample("t", [{"role": "user", "content": content}], answer=["adipose tissue with tumour"])
    assert question_text(s) == language.QUESTION
    critic = JudgeCritic(model=str(JUDGE), template=DEFAULT_TEMPLATE, answer_only=True, max_new_tokens=4)
    try:
        got = critic([(s, "<think>x</think><answer>fat containing a neoplasm</answer>", True),
                      (s, "<think>x</think><answer>fibrous stroma, no lesion</answer>", False)])  # fmt: skip
    finally:
        Loaded.clear()
    assert got == ["YES", "NO"]


def test_the_judge_critic_in_a_collector(tmp_path):
    """critic: judge in a real collector: every refinement prompt holds the verdict sentence followed by the
    judge's words (the reward pays only for that), and no critique fell back."""
    from mmrl.rewards.judge import DEFAULT_TEMPLATE
    from mmrl.rewards.local_model import Loaded
    from mmrl.train.trainer import Trainer

    template = DEFAULT_TEMPLATE.replace("\n", "\\n")  # inside a YAML double-quoted string
    opts = f'{{critic: judge, judge: {{model: {JUDGE}, max_new_tokens: 4, answer_only: true, template: "{template}"}}}}'
    cfg = load_config(
        str(_recipe(tmp_path)),
        [
            f"algo.augment_options={opts}",
            "rewards=[{name: '" + PLUGIN + ":saw_hint', options: {needle: 'solution is incorrect. '}}]",
        ],
    )
    trainer = Trainer(cfg, tmp_path / "run")
    try:
        got = trainer.collector.collect(1)
        assert got.stats["critique/judge_failures"] == 0.0
        assert got.stats["critique/refined_right"] == 1.0 and got.off_policy_rows == {0, 4}
    finally:
        trainer.collector.close()
        Loaded.clear()
