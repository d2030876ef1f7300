"""IGPO (mmrl.algos.igpo, docs/credit.md#igpo): turn rewards from the gain in the policy's likelihood of the reference
answer, against values worked out by hand with both baselines; the answer probes carry the media each turn saw and
score like the context itself; and a 2-step run on the multi-turn test env through the CLI.

The hand batch (docs/credit.md#igpo has the same numbers): one task of G = 2 trajectories of 2 turns, each turn a span
of 2 tokens with one environment token after it; p is the probe's answer likelihood before each turn.

    traj  env rewards  p before turn 0, 1   turn rewards r          returns (gamma 1)
     0    0, 1         0.2, 0.6             0.4, 1.0                1.4, 1.0
     1    0, 0         0.2, 0.1             -0.1, 0.0               -0.1, 0.0

baseline ``turn``: index 0 mean 0.65 -> A = +-0.75; index 1 mean 0.5 -> A = +-0.5.
baseline ``pooled``: r = [0.4, 1.0, -0.1, 0.0], mean 0.325, unbiased std sqrt(0.7475 / 3) = 0.499166;
z = [0.150251, 1.352256, -0.851419, -0.651088]; A = returns of z = [1.502507, 1.352256], [-1.502507, -0.651088].
"""

import math
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from tiny_config import shapes_config

from mmrl.algos import ADVANTAGES, IGPO, AdvantageInput, Turn
from mmrl.algos.igpo import info_gain_rewards
from mmrl.cli import main
from mmrl.config import ConfigError, load_config
from mmrl.run.metrics import read_metrics

TINY = str(Path(__file__).resolve().parents[1] / "assets" / "tiny-qwen2.5-vl")
T = 6
SPANS = [Turn(0, 2, 0.0, "s0"), Turn(3, 5, 0.0, "s1")]
P = [[0.2, 0.6], [0.2, 0.1]]
ENV = [[0.0, 1.0], [0.0, 0.0]]


def make_input(p=P, env=ENV) -> AdvantageInput:
    turns = [[replace(s, reward=r) for s, r in zip(SPANS, row)] for row in env]
    mask = torch.zeros(2, T)
    mask[:, [0, 1, 3, 4]] = 1
    rewards = torch.tensor([[sum(row) for row in env]])
    return AdvantageInput(
        rewards,
        [0],
        torch.zeros(2, T),
        mask,
        turns=turns,
        answer_logp=[[math.log(v) for v in row] for row in p],
    )


def test_turn_baseline_hand_values():
    adv, stats = IGPO(1)(make_input())
    assert adv[0].tolist() == pytest.approx([0.75, 0.75, 0, 0.5, 0.5, 0], abs=1e-6)
    assert adv[1].tolist() == pytest.approx([-0.75, -0.75, 0, -0.5, -0.5, 0], abs=1e-6)
    assert stats["igpo/p_first"] == pytest.approx(0.2)
    assert stats["igpo/p_last"] == pytest.approx(0.35)
    assert stats["igpo/gain_mean"] == pytest.approx(0.15)  # (0.4 - 0.1) / 2
    assert stats["igpo/gain_positive"] == 0.5


def test_pooled_baseline_hand_values():
    adv, _ = IGPO(1, baseline="pooled")(make_input())
    assert adv[0, [0, 3]].tolist() == pytest.approx([1.502507, 1.352256], abs=1e-5)
    assert adv[1, [0, 3]].tolist() == pytest.approx([-1.502507, -0.651088], abs=1e-5)


def test_gain_weight_and_discount():
    assert info_gain_rewards([0.0, 1.0], [math.log(0.2), math.log(0.6)], 0.5) == pytest.approx([0.2, 1.0])
    # without a gain (w = 0) the turn baseline is discounted_turns with mean_norm on the env's rewards
    adv, _ = IGPO(1, gain_weight=0.0, gamma=0.5)(make_input())
    ref, _ = ADVANTAGES.get("discounted_turns")(1, gamma=0.5, norm="mean_norm")(make_input())
    assert torch.allclose(adv, ref, atol=1e-6)
    # returns with gamma 0.5: traj 0 [0.4 + 0.5, 1.0]; traj 1 [-0.1, 0] -> index 0 mean 0.4
    adv, _ = IGPO(1, gamma=0.5)(make_input())
    assert adv[0, 0].item() == pytest.approx(0.5) and adv[1, 0].item() == pytest.approx(-0.5)


def test_single_turn_rows_are_dr_grpo():
    r = torch.tensor([[1.0, 0.0, 0.0, 1.0]])
    mask = torch.ones(4, 3)
    inp = AdvantageInput(r, [0], torch.zeros(4, 3), mask, answer_logp=[[-1.0]] * 4)
    adv, _ = IGPO(1)(inp)
    ref, _ = ADVANTAGES.get("dr_grpo")(1)(AdvantageInput(r, [0], torch.zeros(4, 3), mask))
    assert torch.allclose(adv, ref.reshape(-1, 1).expand(4, 3) if ref.dim() == 1 else ref)


def test_options_and_missing_probe_are_refused():
    assert IGPO(1).answer_template == "<answer>{answer}</answer>"
    with pytest.raises(ValueError, match="baseline"):
        IGPO(1, baseline="token")
    with pytest.raises(ValueError, match="template"):
        IGPO(1, template="no slot")
    with pytest.raises(ValueError, match="gain_weight"):
        IGPO(1, gain_weight=-1.0)
    with pytest.raises(ValueError, match="answer_logp"):
        IGPO(1)(replace(make_input(), answer_logp=None))
    with pytest.raises(ValueError, match="record 0.*2 turns but 1 answer probes"):
        IGPO(1)(replace(make_input(), answer_logp=[[-1.0], [-1.0, -2.0]]))


def _recipe(tmp_path: Path, extra: str = "") -> Path:
    cfg = shapes_config(
        tmp_path,
        f"""\
rollout: {{n: 4, max_new_tokens: 5, batch_size: 8, env: 'trainer_envs:ParityEnv',
  episode: {{env_options: {{steps: 3}}, max_turns: 3, env_workers: 1}}}}
algo: {{epochs: 1, mini_batches: 1, advantage: igpo, old_logprobs: recompute{extra}}}
optim: {{lr: 0.001, micro_batch_size: 3}}
train: {{prompts_per_step: 2, progress: false, seed: 3}}
""",
    )
    return cfg


def test_probes_carry_each_turns_media_and_score_like_the_context(tmp_path):
    """The probe of turn k is the context turn k was generated from (the screens of the turns before it) plus the
    answer: scored as a training row it equals the context scored as a prompt, and it differs from the same ids
    with blank pixels."""
    from mmrl.rollout.probes import answer_probes
    from mmrl.train.trainer import Trainer

    trainer = Trainer(load_config(str(_recipe(tmp_path))), tmp_path / "run")
    try:
        got = trainer.collector.collect(1)
        trajs = [t for row in got.trajectories for t in row][:2]
        probes, owners = answer_probes(trainer.policy, trajs, "<answer>{answer}</answer>")
        assert owners == [0, 0, 0, 1, 1, 1]
        policy = trainer.policy
        answer = policy.tokenizer(trajs[0].sample.answer, add_special_tokens=False).input_ids
        assert (
            trajs[0].turn_media[2]["image_grid_thw"].shape[0] == 3
        )  # the prompt's image and the screens after turns 1 and 2
        for k, (probe, t) in enumerate(zip(probes[:3], [trajs[0]] * 3)):
            L = t.turns[k].start
            assert probe.prompt.mm is t.turn_media[k]
            assert probe.prompt.mm["image_grid_thw"].shape[0] == 1 + k
            assert sum(probe.mask) == len(answer)
            assert [i for i, m in zip(probe.response, probe.mask) if m] == answer
            row = trainer.forward_no_grad(policy, _batch([probe]))[0][0]
            ctx = replace(
                t.prompt,
                input_ids=torch.tensor(t.prompt.input_ids.tolist() + t.response[:L]),
                mm=t.turn_media[k],
                seq={key: v[: len(t.prompt.input_ids) + L] for key, v in t.seq().items()},
            )
            tail = probe.response[L:]
            direct = policy.logprobs([ctx], [tail], sampled=[probe.mask[L:]])[0][0]
            scored = row[L : L + len(tail)][torch.tensor(probe.mask[L:]).bool()]
            assert torch.allclose(scored, direct[: len(tail)][torch.tensor(probe.mask[L:]).bool()], atol=1e-4)
            # the same ids with blank pixels read differently: the probe's answer sees the images
            blank = {**probe.prompt.mm, "pixel_values": torch.zeros_like(probe.prompt.mm["pixel_values"])}
            blind = replace(probe, prompt=replace(probe.prompt, mm=blank), mm=blank)
            other = trainer.forward_no_grad(policy, _batch([blind]))[0][0]
            assert (other - row).abs().max() > 1e-3
    finally:
        trainer.collector.close()


def _batch(probes):
    from mmrl.train.update import RolloutBatch

    return RolloutBatch(probes, 1, torch.zeros(len(probes), max(len(p.response) for p in probes)))


def test_two_steps_on_the_multi_turn_test_env(tmp_path):
    out = tmp_path / "run"
    assert main(["train", str(_recipe(tmp_path)), "--output-dir", str(out), "--max-steps", "2"]) == 0
    rows = [r for r in read_metrics(out / "metrics.jsonl") if "igpo/p_first" in r]
    assert len(rows) == 2
    for r in rows:
        assert 0 < r["igpo/p_first"] < 1 and 0 < r["igpo/p_last"] < 1
        assert r["igpo/gain_mean"] != 0 and r["grad_norm"] > 0
        assert r["igpo/turns_mean"] == 3.0


def test_registration_and_config_checks():
    from mmrl.train.checks import check_components

    assert ADVANTAGES.get("igpo") is IGPO and "igpo" in ADVANTAGES.names()
    cfg = [f"model.path={TINY}", "data.train=x.jsonl", "rewards=[{name: exact_match}]", "algo.advantage=igpo"]
    check_components(load_config(None, [*cfg, "algo.advantage_options={baseline: pooled, gamma: 0.9}"]))
    with pytest.raises(ConfigError, match="unknown option 'baselines'; did you mean 'baseline'"):
        check_components(load_config(None, [*cfg, "algo.advantage_options={baselines: pooled}"]))
    with pytest.raises(ValueError, match="baseline must be 'turn' or 'pooled'"):
        check_components(load_config(None, [*cfg, "algo.advantage_options={baseline: token}"]))
