"""AEPO (mmrl.algos.aepo, mmrl.train.augment, docs/credit.md#aepo): the temperature rule, the kept samples and their
count against values worked out by hand; the fixed advantages; the temperature pass in a real collector (its rows
replace on-policy rows of their own prompt's group with advantage 1, sampled at the temperature the last entropy
chose); the config checks; the state a resume restores.

Hand values: rewards of a pass over three prompts, G = 4,
    [1, 0, 0, 1]  mean 0.5,  unbiased std 0.5774  -> A = +-0.866: rows 0 and 3 kept
    [1, 1, 1, 1]  all equal                       -> A = 0: none kept
    [0, 0, 0, 1]  mean 0.25, unbiased std 0.5     -> A = 1.5 for row 3, -0.5 for the others: row 3 kept
"""

from pathlib import Path

import pytest
import torch
from tiny_config import shapes_config

from mmrl.algos.aepo import kept_samples, pass_temperature, sample_count, with_fixed_advantages
from mmrl.config import ConfigError, load_config
from mmrl.train.augment import AUGMENTERS, AEPOPass


def test_hand_values():
    assert pass_temperature(0.3, 0.5, 1.2, 0.8) == 1.2
    assert pass_temperature(0.5, 0.5, 1.2, 0.8) == 0.8  # at the target: colder
    r = torch.tensor([[1.0, 0.0, 0.0, 1.0], [1.0, 1.0, 1.0, 1.0], [0.0, 0.0, 0.0, 1.0]])
    assert kept_samples(r, 0.05) == [(0, 0), (0, 3), (2, 3)]
    assert kept_samples(r, 1.0) == [(2, 3)]  # only A = 1.5 passes a threshold of 1
    assert sample_count(3, 60, 0.3, 0.5) == 3
    assert sample_count(3, 2, 0.3, 0.5) == 2
    assert sample_count(3, 60, 0.5, 0.5) == 3  # at the target: all
    assert sample_count(3, 60, 0.7, 0.5) == 1  # above it: half, rounded down


def test_fixed_advantages():
    adv = torch.tensor([0.5, -0.5, 0.0])
    assert with_fixed_advantages(adv, torch.ones(3, 2), {2: 1.0}).tolist() == [0.5, -0.5, 1.0]
    tok = torch.full((3, 4), 0.25)
    mask = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 0], [1, 0, 0, 0]]).float()
    out = with_fixed_advantages(tok, mask, {1: 1.0})
    assert out[1].tolist() == [1.0, 1.0, 1.0, 0.0] and out[0].tolist() == [0.25] * 4
    assert with_fixed_advantages(adv, mask, {}) is adv


def _recipe(tmp_path: Path, extra: str = "") -> Path:
    cfg = shapes_config(
        tmp_path,
        f"""\
rollout: {{n: 4, max_new_tokens: 3, batch_size: 8, temperature: 1.0}}
rewards: [{{name: exact_match}}]
algo: {{epochs: 1, mini_batches: 1, old_logprobs: recompute, rollout_correction: tis_token, augment: aepo,
  augment_options: {{share: 0.5, threshold: -10.0, samples: 3, target_entropy: 2.0}}{extra}}}
optim: {{lr: 0.001, micro_batch_size: 8}}
train: {{prompts_per_step: 4, progress: false, seed: 3}}
""",
    )
    return cfg


def test_the_pass_in_a_collector(tmp_path, monkeypatch):
    """A threshold of -10 keeps every sample of the pass (every A > -10): 2 groups (share 0.5 of 4) x 4 samples, of
    which ``samples: 3`` replace rows."""
    from mmrl.train.trainer import Trainer

    trainer = Trainer(load_config(str(_recipe(tmp_path))), tmp_path / "run")
    temps = []
    real = trainer.collector.run_episodes

    def spy(samples, prompts, params):
        temps.append(params.temperature)
        return real(samples, prompts, params)

    monkeypatch.setattr(trainer.collector, "run_episodes", spy)
    try:
        trainer.collector.feedback({"entropy": 1.0})  # below the target 2.0: the pass samples hot
        got = trainer.collector.collect(1)
        assert temps == [1.0, 1.2]
        # 2 groups x 4 samples kept (threshold -10), 3 used: group 0's last three rows
        assert got.fixed_advantages == {3: 1.0, 2: 1.0, 1: 1.0}
        assert got.stats["aepo/kept"] == 8 and got.stats["aepo/replaced"] == 3
        assert got.stats["aepo/temperature"] == 1.2 and got.stats["aepo/entropy_seen"] == 1.0
        for row in (1, 2, 3):  # the logs read the replaced rows' own rewards
            assert got.results[row].score == got.rewards[0, row].item()
        for row in (1, 2, 3):
            t = got.trajectories[0][row]
            assert t.sample is got.samples[0]  # its own prompt's group
            assert got.groups[0][row].token_ids == t.whole_response().token_ids
        batch = trainer.make_batch(got)
        got.resolve()
        trainer.advantages(got, batch)
        # the replaced rows' engine log-probs are at T = 1.2: no mismatch, weight 1 under the rollout correction
        assert batch.placed_rows == {1, 2, 3}
        assert torch.equal(batch.rollout_weights[[1, 2, 3]], batch.mask[[1, 2, 3]])
        assert trainer.mismatch["rollout/logprob_diff_max"] < 1e-3
        assert batch.advantages.dim() == 1  # grpo: one value per response
        assert batch.advantages[[1, 2, 3]].tolist() == [1.0, 1.0, 1.0]
        trainer.collector.feedback({"entropy": 3.0})  # above the target: cold, and half the samples
        got = trainer.collector.collect(2)
        assert temps[-1] == 0.8 and len(got.fixed_advantages) == 1
        assert AEPOPass(target_entropy=2.0).state_dict() == {"entropy": 0.0}
        assert trainer.collector.augment.state_dict() == {"entropy": 3.0}
    finally:
        trainer.collector.close()


def test_config_checks(tmp_path):
    from mmrl.train.checks import check_components

    assert AUGMENTERS.get("aepo") is AEPOPass
    check_components(load_config(str(_recipe(tmp_path))))
    with pytest.raises(ConfigError, match="set algo.old_logprobs: recompute"):
        check_components(load_config(str(_recipe(tmp_path)), ["algo.old_logprobs=rollout"]))
    with pytest.raises(ConfigError, match="unknown option 'target'"):
        check_components(load_config(str(_recipe(tmp_path)), ["algo.augment_options={target: 1.0}"]))
    with pytest.raises(ConfigError, match="share must be in"):
        check_components(load_config(str(_recipe(tmp_path)), ["algo.augment_options={share: 0}"]))
    with pytest.raises(ConfigError, match="algo.augment"):
        check_components(load_config(str(_recipe(tmp_path)), ["algo.augment=aepoo"]))
