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
    # registered names (loss_agg, advantage, ...) are checked against their registries by mmrl.checks, before any
    # model loads: tests/test_hardening_runs.py::test_config_errors_are_one_line_before_any_model_loads
    cfg = from_dict(Config, {"optim": {"lr": 1}})
    assert isinstance(cfg.optim.lr, float)


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
