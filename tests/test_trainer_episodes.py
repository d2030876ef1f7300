"""The trainer on multi-turn episodes (issue 20): episodes in an EnvPool feed the update (environment tokens masked,
images of later turns in the training forward), the step-level estimators get the turns, rollouts.jsonl records
each logged trajectory's turns, and only the logged episodes' folders stay."""

import json
from pathlib import Path

import pytest
import torch

from mmrl.cli import main
from mmrl.config import ConfigError, load_config
from mmrl.run.metrics import read_metrics

TINY = str(Path(__file__).resolve().parents[1] / "assets" / "tiny-qwen2.5-vl")
ENV = "trainer_envs:ParityEnv"


def _recipe(tmp_path: Path, *, advantage: str = "gigpo", extra: str = "", more: str = "") -> Path:
    from mmrl.recipes.shapes.data import build

    build(tmp_path / "data", n_train=8, n_eval=4, seed=5)
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(
        f"""
model: {{path: {TINY}, min_pixels: 3136, max_pixels: 3136}}
data: {{train: data/train.jsonl}}
rollout: {{n: 4, max_new_tokens: 5, batch_size: 8, env: '{ENV}',
  episode: {{env_options: {{steps: 3}}, max_turns: 3, env_workers: 1{extra}}}}}
algo: {{epochs: 1, mini_batches: 1, advantage: {advantage}, old_logprobs: recompute}}
optim: {{lr: 0.001, micro_batch_size: 3}}
train: {{prompts_per_step: 2, progress: false, seed: 3}}
{more}"""
    )
    return cfg


@pytest.mark.parametrize("schedule", ["lockstep", "continuous"])
def test_episode_training_step(tmp_path, schedule):
    cfg = _recipe(tmp_path, extra=f", schedule: {schedule}")
    out = tmp_path / "run"
    assert main(["train", str(cfg), "--output-dir", str(out), "--max-steps", "2"]) == 0
    rows = read_metrics(out / "metrics.jsonl")
    for r in rows[-2:]:
        # the training forward over whole trajectories (3 turns, 2 screens added later) equals the engine's
        # per-turn log-probs on every sampled token
        assert r["rollout/logprob_diff_max"] < 1e-4
        assert r["episode/turns_mean"] == 3.0 and r["episode/end/done"] == 1.0
        assert 0.0 <= r["episode/step_accuracy"] <= 1.0
        # returns vary (parity of each action's length): the update moved the weights
        assert r["grad_norm"] > 0 and r["gigpo/anchor_groups"] > 0
        assert r["reward/mean"] == pytest.approx(r["episode/return_mean"])
    logged = [json.loads(line) for line in (out / "rollouts.jsonl").read_text().splitlines()]
    assert len(logged) == 4  # 2 groups per step
    kept = set()
    for row in logged:
        for resp in row["responses"]:
            turns = resp["turns"]
            assert [t["target_hit"] for t in turns] == [t["reward"] == 1.0 for t in turns]
            assert resp["reward"] == pytest.approx(sum(t["reward"] for t in turns))
            assert resp["episode"]["end"] == "done" and len(resp["turns"]) == 3
            assert [len(t["images"]) for t in turns] == [1, 1, 0]  # the screens after turns 1 and 2
            for t in turns:
                for img in t["images"]:
                    assert not Path(img).is_absolute() and (out / img).is_file()
                    kept.add((out / img).parent)
    # only the logged episodes' folders stay (2 steps x 2 groups x 4 episodes)
    folders = [p for p in (out / "episodes").iterdir() if p.is_dir()]
    assert len(folders) == 16 and set(folders) == kept


def test_episode_batch_masks_env_tokens(tmp_path, monkeypatch):
    """The update's mask is the trajectories' (1 on sampled tokens only) and the estimator sees every row's turns."""
    from mmrl.train.trainer import Trainer

    cfg = load_config(str(_recipe(tmp_path, advantage="discounted_turns")))
    seen = {}
    trainer = Trainer(cfg, tmp_path / "run")
    real = trainer.estimator.__call__

    def spy(inp):
        seen["inp"] = inp
        return real(inp)

    monkeypatch.setattr(trainer, "estimator", spy)
    trainer.estimator.needs_entropy = False
    trainer.estimator.answer_template = None
    got = trainer.collector.collect(1)
    batch = trainer.make_batch(got)
    got.resolve()
    trainer.advantages(got, batch)
    inp = seen["inp"]
    trajs = [t for row in got.trajectories for t in row]
    for i, t in enumerate(trajs):
        assert batch.mask[i, : len(t.mask)].tolist() == [float(m) for m in t.mask]
        assert batch.mask[i, len(t.mask) :].sum() == 0
        assert inp.turns[i] == t.turns and len(t.turns) == 3
        # advantages live on the turns' sampled tokens only
        env_tokens = torch.tensor(t.mask[: batch.advantages.shape[1]]) == 0
        assert batch.advantages[i, : len(t.mask)][env_tokens].abs().sum() == 0
    assert got.rewards.tolist() == [[t.episode_return for t in row] for row in got.trajectories]
    trainer.collector.close()


def test_env_preflight_names_the_field(tmp_path):
    from mmrl.train.checks import check_config

    with pytest.raises(ConfigError, match="rollout.episode.image_rule"):
        load_config(str(_recipe(tmp_path, extra=", image_rule: shrink")))
    cfg = load_config(str(_recipe(tmp_path)))
    cfg.rollout.episode.env_options = {"stepz": 2}
    with pytest.raises(ConfigError, match="rollout.episode.env_options: env .* unknown option 'stepz'"):
        check_config(cfg)
    cfg = load_config(str(_recipe(tmp_path)))
    cfg.rollout.episode.max_turns = 0
    with pytest.raises(ConfigError, match="rollout.episode.max_turns must be at least 1"):
        check_config(cfg)
    cfg = load_config(str(_recipe(tmp_path, extra=", schedule: continuous, min_ready: 0")))
    with pytest.raises(ConfigError, match=r"rollout.episode.min_ready must be in \(0, 1\]"):
        check_config(cfg)
    cfg = load_config(str(_recipe(tmp_path, more="rewards: [{name: exact_match}]")))
    cfg.rollout.env = None
    with pytest.raises(ConfigError, match="rollout.episode is set without rollout.env"):
        check_config(cfg)


def test_preflight_refuses_downscaled_screens_for_an_env_that_points_on_them(tmp_path):
    from mmrl.train.checks import check_config

    cfg = load_config(str(_recipe(tmp_path)))
    cfg.rollout.env, cfg.rollout.episode.env_options = "browser_app", {}
    cfg.rollout.episode.max_context_pixels = 40_000
    with pytest.raises(ConfigError, match="image_rule: end"):
        check_config(cfg)
    cfg.rollout.episode.image_rule = "end"
    check_config(cfg)


def test_preflight_refuses_a_tensor_parallel_engine_with_an_env(tmp_path):
    """The ranks of a tensor-parallel vLLM engine must make the same generate calls; ranks stepping their own
    episodes would not (issue: multi-turn with vLLM TP would desync), so the combination is refused with the reason."""
    from mmrl.train.checks import check_env

    cfg = load_config(str(_recipe(tmp_path)))
    cfg.rollout.engine_options = {"tensor_parallel_size": 2}
    with pytest.raises(ConfigError, match="tensor_parallel_size 2: the ranks of a tensor-parallel engine"):
        check_env(cfg)
    cfg.rollout.engine_options = {"tensor_parallel_size": 1}
    check_env(cfg)


def test_retiring_a_step_keeps_the_folders_of_batches_made_ahead(tmp_path):
    """A producer running ahead has made step 3's and 4's episode folders when the trainer retires step 2: only
    step 2's (and older) go, those of the logged episodes stay."""
    from mmrl.train.collect import Collector

    class Pool:
        def episode_dir(self, eid):
            return tmp_path / eid

    c = Collector.__new__(Collector)
    c._pool = Pool()
    c._episode_dirs = {}
    for step, eids in ((1, ["a"]), (2, ["b", "c"]), (3, ["d"]), (4, ["e"])):
        for e in eids:
            (tmp_path / e).mkdir()
        c._episode_dirs[step] = [tmp_path / e for e in eids]
    c.retire_episodes(2, {"c"})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c", "d", "e"]
    assert sorted(c._episode_dirs) == [3, 4]
