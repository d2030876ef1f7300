"""Algorithm presets: ``algo.preset: NAME`` applies these fields. Written in a recipe, the preset lies under the
recipe's own fields; named on the command line, over them; other command-line overrides win over both. Values are
the papers' (docs/algorithms.md#grpo-family, docs/algorithms.md#mssr), except where noted.

- ``grpo`` (DeepSeekMath): group z-score advantages, clip 0.2, seq-mean-token-mean, k3 KL in the loss with
  beta 0.04. The paper sampled G = 64; the preset uses G = 8, the GRPO baseline of the MSSR paper and within the
  5-16 seen for VLMs.
- ``dr_grpo``: A = r - mean (no std), token sums over the max generation length (``loss_agg_constant`` None = the
  trainer's ``rollout.max_new_tokens``), no KL.
- ``dapo``: clip-higher 0.2 / 0.28, token-mean, no KL, dynamic sampling (drop groups whose rewards are all equal;
  ``max_sampling_tries`` 10 as verl's DAPO recipe's ``max_num_gen_batches``), G = 16. DAPO's overlong shaping is
  a reward (``overlong_penalty`` with the recipe's ``max_length``/``buffer``), so it belongs in the recipe's
  ``rewards`` list, which a preset cannot extend without replacing it.
- ``gspo``: sequence-ratio loss with clip 3e-4 / 4e-4, seq-mean-token-mean, no KL, G = 8.
- ``spo``: ``mssr`` without the entropy shaping (plain single-rollout with SPO's tracker): the ablation that MSSR's
  paper reports as unstable.
- ``mssr``: one response per prompt, the MSSR estimator with the paper's global forgetting rule (window 10,
  target KL 0.01) and sampled-token entropy shaping, clip 0.2 / 0.3, dual clip 3, token-mean, k3 KL 0.01 in the
  loss. For the paper's equal-rollout comparison set ``train.prompts_per_step`` to G times the GRPO run's. The
  paper's optimiser settings (lr 1e-6, weight decay 1e-2, grad clip 0.5) are the recipe's to choose.

Dual clip is off (None) for the methods whose papers do not use it.
"""

from __future__ import annotations

from typing import Any

PRESETS: dict[str, dict[str, Any]] = {
    "grpo": {
        "algo": {
            "advantage": "grpo",
            "loss": "clipped",
            "loss_agg": "seq-mean-token-mean",
            "clip_low": 0.2,
            "clip_high": 0.2,
            "dual_clip": None,
            "kl_coef": 0.04,
            "kl_estimator": "k3",
            "kl_in": "loss",
        },
        "rollout": {"n": 8},
    },
    "dr_grpo": {
        "algo": {
            "advantage": "dr_grpo",
            "loss": "clipped",
            "loss_agg": "seq-mean-token-sum-norm",
            "loss_agg_constant": None,
            "clip_low": 0.2,
            "clip_high": 0.2,
            "dual_clip": None,
            "kl_coef": 0.0,
        },
        "rollout": {"n": 8},
    },
    "dapo": {
        "algo": {
            "advantage": "grpo",
            "loss": "clipped",
            "loss_agg": "token-mean",
            "clip_low": 0.2,
            "clip_high": 0.28,
            "dual_clip": None,
            "kl_coef": 0.0,
            "dynamic_sampling": True,
            "max_sampling_tries": 10,
        },
        "rollout": {"n": 16},
    },
    "gspo": {
        "algo": {
            "advantage": "grpo",
            "loss": "gspo",
            "loss_agg": "seq-mean-token-mean",
            "clip_low": 3e-4,
            "clip_high": 4e-4,
            "dual_clip": None,
            "kl_coef": 0.0,
        },
        "rollout": {"n": 8},
    },
    "mssr": {
        "algo": {
            "advantage": "mssr",
            "advantage_options": {
                "rho": "global",
                "rho_rule": "paper",
                "target_kl": 0.01,
                "window": 10,
                "entropy": "sampled",
            },
            "loss": "clipped",
            "loss_agg": "token-mean",
            "clip_low": 0.2,
            "clip_high": 0.3,
            "dual_clip": 3.0,
            "kl_coef": 0.01,
            "kl_estimator": "k3",
            "kl_in": "loss",
        },
        "rollout": {"n": 1},
    },
}

# spo is mssr without the entropy shaping: the same tracker, forgetting rule and loss (the paper's ablation)
_mssr_algo = PRESETS["mssr"]["algo"]
PRESETS["spo"] = {
    "algo": {
        **_mssr_algo,
        "advantage": "spo",
        "advantage_options": {k: v for k, v in _mssr_algo["advantage_options"].items() if k != "entropy"},
    },
    "rollout": dict(PRESETS["mssr"]["rollout"]),
}
