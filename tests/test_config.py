import pytest

from mmrl.config import Config, ConfigError, apply_overrides, from_dict, load_config


def test_unknown_key_names_nearest(tmp_path):
    with pytest.raises(
        ConfigError, match=r"unknown config key 'optim.weight_decy'.*did you mean 'optim.weight_decay'"
    ):
        from_dict(Config, {"optim": {"weight_decy": 1e-5}})
    with pytest.raises(ConfigError, match=r"unknown config key 'rollut'; did you mean 'rollout'"):
        from_dict(Config, {"rollut": {}})


def test_types_are_checked():
    with pytest.raises(ConfigError, match=r"rollout.n: expected an integer"):
        from_dict(Config, {"rollout": {"n": "eight"}})
    with pytest.raises(ConfigError, match=r"algo.kl_in: 'rewards' is not one of .*did you mean 'reward'"):
        from_dict(Config, {"algo": {"kl_in": "rewards"}})
    # registered names (loss_agg, advantage, ...) are checked against their registries by mmrl.train.checks, before any
    # model loads: tests/test_hardening_runs.py::test_config_errors_are_one_line_before_any_model_loads
    cfg = from_dict(Config, {"optim": {"lr": 1}})
    assert isinstance(cfg.optim.lr, float)
    with pytest.raises(ConfigError, match=r"optim.lr: expected float, got 'fast'"):
        from_dict(Config, {"optim": {"lr": "fast"}})


def test_exponent_floats_without_a_dot_are_floats(tmp_path):
    """PyYAML reads 1e-6 (no dot) as a string, in files and in key=value overrides alike: a float field takes it."""
    p = tmp_path / "c.yaml"
    p.write_text("optim:\n  lr: 1e-6\nalgo:\n  kl_coef: 5E-3\n")
    cfg = load_config(p, ["optim.weight_decay=1e-2"])
    assert (cfg.optim.lr, cfg.algo.kl_coef, cfg.optim.weight_decay) == (1e-6, 5e-3, 1e-2)


def test_overrides_and_reward_list(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text(
        "rollout:\n  n: 4\nrewards:\n  - name: exact_match\n    options: {extract_answer_tag: false}\n"
    )
    cfg = load_config(p, ["rollout.n=6", "rewards.0.weight=2", "train.seed=3", "model.dtype=bfloat16"])
    assert cfg.rollout.n == 6 and cfg.train.seed == 3 and cfg.model.dtype == "bfloat16"
    assert cfg.rewards[0].weight == 2.0 and cfg.rewards[0].options == {"extract_answer_tag": False}
    with pytest.raises(ConfigError, match="must look like key.sub=value"):
        apply_overrides({}, ["rollout.n"])


def test_recipe_configs_load():
    for name in ("tiny.yaml", "sft.yaml"):
        load_config(f"recipes/shapes/{name}")


def test_preset_precedence(tmp_path):
    """A recipe's preset lies under the recipe's fields; a command-line preset lies over them; other command-line
    overrides win over both."""
    from mmrl.config import load_config

    recipe = tmp_path / "r.yaml"
    recipe.write_text("algo: {advantage: grpo, clip_high: 0.25}\nrollout: {n: 8}\n")
    cli = load_config(recipe, ["algo.preset=mssr"])
    assert (cli.algo.advantage, cli.rollout.n, cli.algo.clip_high, cli.algo.kl_coef) == ("mssr", 1, 0.3, 0.01)
    later = load_config(recipe, ["rollout.n=2", "algo.preset=dapo", "algo.clip_high=0.5"])
    assert (later.algo.advantage, later.rollout.n, later.algo.clip_high, later.algo.dynamic_sampling) == (
        "grpo",
        2,
        0.5,
        True,
    )
    inside = tmp_path / "p.yaml"
    inside.write_text("algo: {preset: mssr, clip_high: 0.25}\n")
    rec = load_config(inside)
    assert (rec.algo.advantage, rec.algo.clip_high, rec.rollout.n) == ("mssr", 0.25, 1)
