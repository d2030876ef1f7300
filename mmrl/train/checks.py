"""Pre-flight checks: everything in a config that can be verified without loading a model is verified first.

A run that would die after minutes of model loading and data building because of a misspelt reward, an unknown
engine, a sampler option or a missing optional package (the extra to install: :mod:`mmrl.extras`) is refused at
once, with one line naming the field and the fix. Rewards are checked first
and without importing torch, so ``mmrl train`` with a wrong reward name answers within a couple of seconds.
Engine options are checked against what the engine accepts (vLLM: its ``EngineArgs`` fields, from the installed
vLLM or, without it, from the pinned version's list), so a misspelt one is named with the nearest valid key.
"""

from __future__ import annotations

from pathlib import Path

from mmrl.config import Config, ConfigError
from mmrl.extras import MissingExtra, require
from mmrl.run.trackers import check_trackers


def check_rewards(cfg: Config) -> None:
    from mmrl.rewards.base import load_reward, validate_options

    if not cfg.rewards and not cfg.rollout.env:
        raise ConfigError(
            "no rewards configured: list at least one under `rewards:` (see `mmrl list`), or run episodes in an "
            "env (`rollout.env`), whose step rewards are the episode's"
        )
    heavy = []
    entries = [(f"rewards[{i}]", e) for i, e in enumerate(cfg.rewards)]
    entries += [(f"eval.rewards[{i}]", e) for i, e in enumerate(cfg.eval.rewards)]
    for at, entry in entries:
        where = f"{at} ({entry.name!r})"
        try:
            spec = load_reward(entry.name)
            validate_options(spec, entry.options)
        except MissingExtra as e:  # the package a built-in reward needs: the extra to install
            raise ConfigError(f"{where}: {e.reason}") from None
        except (KeyError, ValueError, TypeError, FileNotFoundError, ImportError) as e:
            raise ConfigError(f"{where}: {e.args[0] if e.args else e}") from None
        if spec.heavy:
            heavy.append(where)
    if (
        heavy
    ):  # rendering rewards need the sandbox's confinement (or the explicit opt-in): refuse now, not per item
        from mmrl.rewards.sandbox import SandboxUnavailableError, confinement

        try:
            confinement()
        except SandboxUnavailableError as e:
            raise ConfigError(f"{heavy[0]}: {e}") from None


def check_components(cfg: Config) -> None:
    """Registered names and their options: engine, sampler, advantage estimator, loss, aggregation, KL, corrections."""
    from mmrl.algos import (
        ADVANTAGES,
        AGGREGATIONS,
        KL_ESTIMATORS,
        LOSSES,
        REWARD_CORRECTIONS,
        ROLLOUT_CORRECTIONS,
        check_reward_correction,
        check_rollout_correction,
    )
    from mmrl.registry import validate_kwargs
    from mmrl.rollout import ENGINES
    from mmrl.samplers import SAMPLERS
    from mmrl.train.augment import AUGMENTERS
    from mmrl.train.update import loss_options

    a = cfg.algo

    def lookup(registry, name: str, field: str):
        try:
            return registry.get(name)
        except KeyError as e:
            raise ConfigError(f"{field}: {e.args[0]}") from None

    engine = lookup(ENGINES, cfg.rollout.engine, "rollout.engine")
    where = f"rollout.engine_options ({cfg.rollout.engine})"
    try:  # an engine that hands its options on (vllm: to vllm.LLM) checks them itself; the others by signature
        engine.check_options(cfg.rollout.engine_options)
    except ValueError as e:
        msg = str(e).removeprefix("engine options: ")
        raise ConfigError(f"{where}: {msg}") from None
    try:  # an engine whose package may be missing (vllm) says so before a model loads
        engine.check()
    except ImportError as e:
        raise ConfigError(f"rollout.engine {cfg.rollout.engine!r}: {e}") from None
    if (
        not engine.logprobs_at_run_temperature
        and cfg.rollout.temperature != 1.0
        and a.old_logprobs != "recompute"
    ):
        raise ConfigError(
            f"rollout.engine {cfg.rollout.engine!r} at rollout.temperature {cfg.rollout.temperature:g}: part of each "
            f"completion's log-probs are at T = 1, not the run's temperature, so pi_old taken from the rollout "
            f"(algo.old_logprobs: {a.old_logprobs}) would be wrong for those tokens; set algo.old_logprobs: recompute"
        )
    sampler = lookup(SAMPLERS, cfg.sampler.name, "sampler.name")
    est = lookup(ADVANTAGES, a.advantage, "algo.advantage")
    loss = lookup(LOSSES, a.loss, "algo.loss")
    lookup(AGGREGATIONS, a.loss_agg, "algo.loss_agg")
    lookup(KL_ESTIMATORS, a.kl_estimator, "algo.kl_estimator")
    lookup(REWARD_CORRECTIONS, a.reward_correction, "algo.reward_correction")
    lookup(ROLLOUT_CORRECTIONS, a.rollout_correction, "algo.rollout_correction")
    try:
        validate_kwargs(
            sampler, cfg.sampler.options, f"sampler.options ({cfg.sampler.name})", skip=("num_records",)
        )
        validate_kwargs(
            est, a.advantage_options, f"algo.advantage_options ({a.advantage})", skip=("num_records",)
        )
        validate_kwargs(loss, loss_options(cfg), f"algo.loss_options ({a.loss})", skip=("logp", "old_logp"))
        if isinstance(loss, type):  # a stateful loss (a class) checks its options' ranges when made
            loss(**loss_options(cfg))
        est(1, eps=a.adv_eps, **a.advantage_options)  # the estimator's own range checks
        if a.augment != "none":
            aug = lookup(AUGMENTERS, a.augment, "algo.augment")
            validate_kwargs(aug, a.augment_options, f"algo.augment_options ({a.augment})")
            aug(**a.augment_options).check(cfg)
        if a.reward_correction != "none":
            check_reward_correction(a.reward_correction, a.advantage)
            REWARD_CORRECTIONS.get(a.reward_correction)(_one_reward(), fp_rate=a.fp_rate, fn_rate=a.fn_rate)
        check_rollout_correction(a.rollout_correction, a.old_logprobs, a.rollout_correction_cap)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    if cfg.rollout.n < est.min_group_size:
        raise ConfigError(
            f"algo.advantage {a.advantage!r} needs at least {est.min_group_size} responses per prompt: set "
            f"rollout.n >= {est.min_group_size} (got {cfg.rollout.n}), or use a single-rollout estimator "
            "(reinforce_pp, spo, mssr)"
        )
    if a.dynamic_sampling and cfg.rollout.n < 2:
        raise ConfigError(
            "algo.dynamic_sampling drops groups whose rewards are all equal: it needs rollout.n >= 2"
        )


def _one_reward():
    import torch

    return torch.zeros(1, 2)


def check_numbers(cfg: Config) -> None:
    positive = {
        "rollout.n": cfg.rollout.n,
        "rollout.max_new_tokens": cfg.rollout.max_new_tokens,
        "rollout.batch_size": cfg.rollout.batch_size,
        "train.prompts_per_step": cfg.train.prompts_per_step,
        "optim.micro_batch_size": cfg.optim.micro_batch_size,
        "algo.epochs": cfg.algo.epochs,
        "algo.mini_batches": cfg.algo.mini_batches,
        "model.logits_chunk_tokens": cfg.model.logits_chunk_tokens,
        "train.prompt_cache_mb": cfg.train.prompt_cache_mb,
        "train.image_check_rows": cfg.train.image_check_rows,
    }
    for name, v in positive.items():
        if v < 1:
            raise ConfigError(f"{name} must be at least 1, got {v}")
    if cfg.rollout.temperature < 0 or not 0 < cfg.rollout.top_p <= 1 or cfg.rollout.top_k < 0:
        raise ConfigError("rollout: temperature must be >= 0, top_p in (0, 1], top_k >= 0")
    if cfg.optim.lr <= 0:
        raise ConfigError(f"optim.lr must be positive, got {cfg.optim.lr}")
    if cfg.train.image_check_every < 0:
        raise ConfigError(
            f"train.image_check_every must be >= 0 (0 = off), got {cfg.train.image_check_every}"
        )
    if cfg.train.dist_timeout_s <= 0:
        raise ConfigError(f"train.dist_timeout_s must be positive, got {cfg.train.dist_timeout_s}")


def check_data(cfg: Config) -> None:
    if not cfg.data.train:
        raise ConfigError("data.train is empty: give the training records' path")
    if not Path(cfg.data.train).exists() and not cfg.data.builder:
        raise ConfigError(f"data.train not found: {cfg.data.train} (build it first, or set data.builder)")
    if cfg.data.eval and not Path(cfg.data.eval).exists() and not cfg.data.builder:
        raise ConfigError(f"data.eval not found: {cfg.data.eval} (build it first, or set data.builder)")
    for field, path in (("data.train", cfg.data.train), ("data.eval", cfg.data.eval)):
        _check_format(field, path)
    e = cfg.eval
    if e.benchmark:
        from mmrl.eval import EvalError, get_benchmark

        try:
            get_benchmark(e.benchmark, e.benchmark_options, cfg.model)  # the name and its options
        except EvalError as err:
            raise ConfigError(f"eval.benchmark: {err}") from None
        if not e.benchmark_data or not Path(e.benchmark_data).exists():
            raise ConfigError(
                f"eval.benchmark_data not found: {e.benchmark_data!r} (the {e.benchmark} files on disk)"
            )


def _check_format(field: str, path: str | None) -> None:
    """Parquet files and saved HF dataset folders are read with the ``data`` extra's packages."""
    if not path:
        return
    if Path(path).suffix == ".parquet":
        module = "pyarrow"
    elif Path(path).is_dir():
        module = "datasets"
    else:
        return
    try:
        require("data", f"{field} ({path})", (module,))
    except MissingExtra as e:
        raise ConfigError(str(e)) from None


def check_env(cfg: Config) -> None:
    """``rollout.env`` and ``rollout.episode`` (:func:`mmrl.envs.validate_episode_settings`: the limits, the env's
    options against its signature, the image budget)."""
    r = cfg.rollout
    if not r.env:
        if r.episode != type(r.episode)():
            raise ConfigError("rollout.episode is set without rollout.env: name the env the episodes run in")
        return
    tp = r.engine_options.get("tensor_parallel_size", 1)
    if isinstance(tp, int) and tp > 1:
        raise ConfigError(
            f"rollout.env {r.env!r} with rollout.engine_options.tensor_parallel_size {tp}: the ranks of a "
            "tensor-parallel engine must make the same generate calls, but each rank steps its own episodes, which "
            "end after different numbers of turns, so the group would desync; use tensor_parallel_size 1 (one "
            "engine per rank: give each rank a whole GPU, or a model that fits one)"
        )
    from mmrl.envs import validate_episode_settings

    try:
        validate_episode_settings(r.env, r.episode, r.max_new_tokens)
    except MissingExtra as e:
        raise ConfigError(f"rollout.env {r.env!r}: {e.reason}") from None
    except (KeyError, ImportError) as e:
        raise ConfigError(f"rollout.env {r.env!r}: {e.args[0] if e.args else e}") from None
    except ValueError as e:
        raise ConfigError(f"rollout.episode.{e} (rollout.env {r.env!r})") from None


def check_model(cfg: Config) -> None:
    """A local model folder must exist; a hub id is only usable when the hub is reachable (not offline)."""
    import os

    from mmrl.model.checkpoint_files import resolve_model_path

    path = cfg.model.path
    if Path(resolve_model_path(path)).is_dir():
        return
    offline = os.environ.get("HF_HUB_OFFLINE") == "1" or os.environ.get("TRANSFORMERS_OFFLINE") == "1"
    looks_local = Path(path).is_absolute() or path.startswith((".", "~")) or path.count("/") != 1
    if offline or looks_local:
        raise ConfigError(
            f"model.path not found: {path} (a local folder in HF format"
            + (", or a hub id once HF_HUB_OFFLINE is unset)" if offline else ")")
        )


def check_async(cfg: Config) -> None:
    """``rollout.max_staleness > 0``: what the asynchronous producer (:mod:`mmrl.train.producer`) supports today."""
    import os

    k, r = cfg.rollout.max_staleness, cfg.rollout
    if k < 0:
        raise ConfigError(f"rollout.max_staleness must be >= 0, got {k}")
    why = "(docs/async.md#asynchronous-rollouts says what runs asynchronously today)"
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if r.placement == "separate":
        if world < 2:
            raise ConfigError(
                "rollout.placement: separate needs a launcher with at least 2 processes (one trains, one generates): "
                "`torchrun --nproc_per_node 2 -m mmrl train ...`; or set rollout.placement: colocated"
            )
        g = r.rollout_processes
        if not 0 < g < world:
            raise ConfigError(
                f"rollout.rollout_processes {g} of {world} launched processes: at least one must train and one "
                "generate"
            )
        if cfg.train.prompts_per_step % g:
            raise ConfigError(
                f"rollout.rollout_processes {g}: each generating process generates an equal share of a batch's "
                f"groups, and train.prompts_per_step {cfg.train.prompts_per_step} does not split evenly; make it a "
                f"multiple of {g}"
            )
        if r.engine not in ("hf", "vllm"):
            raise ConfigError(
                f"rollout.placement: separate with rollout.engine {r.engine!r}: a generating process runs the hf or "
                f"the vllm engine, which take pushed weights while they generate; set rollout.engine: hf or vllm {why}"
            )
        if r.engine == "vllm":
            _refuse_in_flight_vllm_options(r.engine_options, "rollout.placement: separate", why)
        if r.engine == "vllm" and int(r.engine_options.get("tensor_parallel_size", 1)) != 1:
            raise ConfigError(
                f"rollout.placement: separate with rollout.engine_options.tensor_parallel_size "
                f"{r.engine_options['tensor_parallel_size']}: a generating process drives one vLLM engine on one "
                f"device for now; use rollout.rollout_processes for more engines {why}"
            )
    _check_next_batch_at(cfg, world)
    if k == 0:
        return
    if world > 1 and r.placement == "colocated" and r.engine != "hf":
        raise ConfigError(
            f"rollout.max_staleness {k} with {world} colocated processes and rollout.engine {r.engine!r}: several "
            f"colocated processes run ahead with the hf engine (vLLM's engines there join the training group, which "
            f"the trainer's thread uses meanwhile); set rollout.engine: hf, or rollout.placement: separate {why}"
        )
    if r.placement == "colocated" and cfg.train.fsdp and r.engine == "hf":
        raise ConfigError(
            f"rollout.max_staleness {k} with train.fsdp, colocated: the engine would keep a whole unsharded copy of "
            f"the policy on every GPU beside its FSDP2 shard (what FSDP2 is there to avoid); set rollout.placement: "
            f"separate (the generating processes hold the copy, FSDP2 shards the training ones) {why}"
        )
    if r.engine not in ("hf", "vllm"):
        raise ConfigError(
            f"rollout.max_staleness {k} with rollout.engine {cfg.rollout.engine!r}: only the hf and vllm engines swap "
            f"weights while they generate; set rollout.engine: hf or vllm, or rollout.max_staleness: 0 {why}"
        )
    if r.engine == "vllm":
        from mmrl.train.collect import reward_uses_vllm

        _refuse_in_flight_vllm_options(r.engine_options, f"rollout.max_staleness {k}", why)
        judges = [x.name for x in cfg.rewards if reward_uses_vllm(x.options)]
        if judges:
            raise ConfigError(
                f"rollout.max_staleness {k} with rollout.engine vllm and the vLLM judge of reward(s) {judges}: the "
                f"judge would run while the policy's engine steps in the same process (vLLM keeps one forward context "
                f"per process); use engine: hf for the judge, serve it (reward server), or set rollout.engine: hf {why}"
            )
    if cfg.algo.old_logprobs == "rollout":
        raise ConfigError(
            f"rollout.max_staleness {k}: set algo.old_logprobs: recompute or interpolate (decoupled PPO's proximal policy, the "
            "weights before this update; the rollout log-probs are the behaviour policy's, several versions old), "
            f"and algo.rollout_correction (tis_token: w = pi_prox / mu truncated) to weight the stale tokens {why}"
        )


def _check_next_batch_at(cfg: Config, world: int) -> None:
    """``rollout.episode.next_batch_at``: the next batch's episodes starting while this batch's last ones run
    (docs/async.md#episodes-across-batches) needs one process driving the episodes of consecutive batches."""
    r, at = cfg.rollout, cfg.rollout.episode.next_batch_at
    if not at:
        return
    if not 0 < at <= 1:
        raise ConfigError(f"rollout.episode.next_batch_at must be in [0, 1], got {at}")
    generating = r.rollout_processes if r.placement == "separate" else world
    problems = [
        (r.max_staleness < 1, "needs rollout.max_staleness >= 1: a batch starts early only within the staleness bound"),
        (not r.env, "is for multi-turn episodes (rollout.env)"),
        (r.episode.schedule != "continuous", "needs rollout.episode.schedule: continuous (lockstep turns wait for "
         "every episode of one batch)"),
        (cfg.algo.dynamic_sampling, "and algo.dynamic_sampling: a round's redraws depend on its rewards, which the "
         "next batch's draw would precede"),
        (cfg.algo.augment not in ("", "none"), f"and algo.augment {cfg.algo.augment!r}: an augmenter's extra rollouts run after a "
         "batch ends, beside the next batch's episodes"),
        (cfg.sampler.name != "uniform", f"and sampler {cfg.sampler.name!r}: the next batch is drawn before this "
         "batch's rewards reach the sampler; only the uniform sampler draws the same prompts either way"),
        (generating != 1, f"with {generating} generating processes: each would start batches at its own time, and "
         "their gathers must meet in order; use one (rollout.placement: separate, rollout.rollout_processes: 1)"),
    ]  # fmt: skip
    bad = [why for hit, why in problems if hit]
    if bad:
        raise ConfigError(f"rollout.episode.next_batch_at {at} " + "; ".join(bad) + "; or set it to 0")


def _refuse_in_flight_vllm_options(options: dict, what: str, why: str) -> None:
    """A vLLM engine that takes weights while it generates (running ahead, or a separate placement's) cannot sleep,
    and labels a step's tokens with the weights of the forward that just ran (no async scheduling)."""
    for key in ("sleep_mode", "async_scheduling"):
        if options.get(key):
            raise ConfigError(
                f"{what} with rollout.engine_options.{key}: true: the vLLM engine takes weights while it generates, "
                f"so it never sleeps, and a step's tokens must be labelled with the weights of the forward that just "
                f"ran; leave {key} unset {why}"
            )


def check_config(cfg: Config) -> None:
    """All pre-flight checks, cheapest first; raises :class:`ConfigError` with one line."""
    check_rewards(cfg)
    check_numbers(cfg)
    check_data(cfg)
    check_model(cfg)
    check_env(cfg)
    check_async(cfg)
    check_components(cfg)
    check_trackers(cfg.train)
