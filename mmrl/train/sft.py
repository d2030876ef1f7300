"""Supervised warm start (``mmrl sft``): teach a policy a recipe's answer format before RL.

Domain papers (Table2LaTeX-RL, Patho-R1, UI-R1's baselines) start RL from an SFT'd model; a randomly initialised
tiny model cannot earn any reward, so the tiny recipes do the same. The loss is the mean token NLL of
``answer + <|im_end|>`` after the chat prompt, i.e. exactly the tokens the policy would generate.

Multi-turn warm start (``rollout.env`` set): the records are the env's tasks, and the policy learns from oracle
episodes. Each record is played once, before training, as a teacher-forced episode (:func:`mmrl.rollout.episodes.run_episodes`
with ``teacher="oracle"``: the env's :meth:`~mmrl.envs.Env.oracle` writes every turn) under the run's own episode
settings (``rollout.episode``) in an :class:`~mmrl.envs.EnvPool` under the output folder (``sft_episodes/``). Episodes that did not end
``done`` with a positive return are dropped, counted in the card and written to ``sft_dropped.jsonl``. The loss is
the mean NLL over all mask-1 tokens of the batch's trajectories (:func:`mmrl.rollout.episodes.trajectory_logprobs`,
temperature 1): every action with its end-of-turn marker, each after the observations before it, exactly the tokens
the policy samples in RL; observation tokens are context only. Label smoothing is for the single-turn path only.
"""

from __future__ import annotations

import json
import logging
import os
import random
from collections.abc import Callable
from pathlib import Path

import torch

from mmrl.config import Config, to_dict
from mmrl.data import ensure_built, load_split
from mmrl.model.checkpoint_files import resolve_model_path
from mmrl.model.policy import Policy
from mmrl.rollout import SamplingParams
from mmrl.rollout.episodes import Trajectory, run_episodes, trajectory_logprobs
from mmrl.train.trainer import seed_everything
from mmrl.types import Sample

log = logging.getLogger("mmrl.train.sft")
Loss = Callable[[list[int]], torch.Tensor]  # the loss of a batch of example indices


def answer_text(answer: object) -> str:
    return answer if isinstance(answer, str) else json.dumps(answer)


def run_sft(cfg: Config, output_dir: str | Path) -> Path:
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    seed_everything(cfg.train.seed)
    ensure_built(cfg.data.train, cfg.data.builder)
    samples = load_split(cfg.data, cfg.data.train, out / "skipped.jsonl", resolve_model_path(cfg.model.path))
    samples = samples[: cfg.sft.max_records] if cfg.sft.max_records else samples
    policy = Policy.from_pretrained(cfg.model)
    episodes = None
    if cfg.rollout.env:
        n, loss_of, episodes = episode_objective(cfg, policy, samples, out)
    else:
        n, loss_of = answer_objective(cfg, policy, samples)
    opt = torch.optim.AdamW([p for p in policy.model.parameters() if p.requires_grad], lr=cfg.sft.lr)
    rng = random.Random(cfg.train.seed)
    order: list[int] = []
    with policy.training(), (out / "sft_metrics.jsonl").open("a") as metrics:
        for step in range(1, cfg.sft.steps + 1):
            if len(order) < cfg.sft.batch_size:
                order += rng.sample(range(n), n)
            idx, order = order[: cfg.sft.batch_size], order[cfg.sft.batch_size :]
            loss = loss_of(idx)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(policy.model.parameters(), 1.0)
            opt.step()
            metrics.write(json.dumps({"step": step, "loss": loss.item()}) + "\n")
    policy.save(out / "model")
    (out / "sft_config.json").write_text(json.dumps(to_dict(cfg), indent=1))
    write_card(out, cfg, n_records=len(samples), final_loss=loss.item(), episodes=episodes)
    return out / "model"


def answer_objective(cfg: Config, policy: Policy, samples: list[Sample]) -> tuple[int, Loss]:
    """Single turn: the NLL of each record's ``answer + <|im_end|>`` after its chat prompt."""
    tok = policy.tokenizer
    end_id = tok.convert_tokens_to_ids("<|im_end|>")
    encoded = [policy.encode(s) for s in samples]
    targets = [tok(answer_text(s.answer), add_special_tokens=False)["input_ids"] + [end_id] for s in samples]

    def loss(idx: list[int]) -> torch.Tensor:
        return policy.sequence_nll(
            [encoded[i] for i in idx], [targets[i] for i in idx], label_smoothing=cfg.sft.label_smoothing
        )

    return len(samples), loss


def episode_objective(
    cfg: Config, policy: Policy, samples: list[Sample], out: Path
) -> tuple[int, Loss, tuple[int, int]]:
    """Multi-turn (module docstring): the mean NLL of the sampled tokens of the kept oracle episodes, and
    ``(kept, dropped)``."""
    if cfg.sft.label_smoothing:
        raise ValueError(
            f"sft.label_smoothing {cfg.sft.label_smoothing}: a multi-turn warm start (rollout.env "
            f"{cfg.rollout.env!r}) trains on the episodes' log-probs without smoothing; set it to 0"
        )
    trajs, dropped = oracle_episodes(cfg, policy, samples, out)

    def loss(idx: list[int]) -> torch.Tensor:
        logp, _, mask = trajectory_logprobs(
            policy, [trajs[i] for i in idx], temperature=1.0, entropy_grad=False
        )
        return -(logp * mask).sum() / mask.sum().clamp(min=1.0)

    return len(trajs), loss, (len(trajs), dropped)


def oracle_episodes(
    cfg: Config, policy: Policy, samples: list[Sample], out: Path
) -> tuple[list[Trajectory], int]:
    """One teacher-forced episode per record under the run's rollout settings; those that ended ``done`` with a
    positive return, and how many were dropped (written to ``sft_dropped.jsonl``)."""
    from mmrl.envs import EnvPool  # the envs (Chromium's launcher among them) only for multi-turn warm starts

    r = cfg.rollout
    with EnvPool.for_episodes(out / "sft_episodes", r.episode) as pool:
        rows = run_episodes(
            policy, None, samples, SamplingParams(n=1, max_new_tokens=r.max_new_tokens), pool=pool,
            env_name=r.env, settings=r.episode, teacher="oracle",
        )  # fmt: skip
    trajs = [row[0] for row in rows]
    won = [t.end == "done" and t.episode_return > 0 for t in trajs]
    kept = [t for t, w in zip(trajs, won) if w]
    dropped = [t for t, w in zip(trajs, won) if not w]
    with (out / "sft_dropped.jsonl").open("w") as f:
        f.writelines(json.dumps(t.to_record(), default=str) + "\n" for t in dropped)
    if dropped:
        log.warning(
            "sft: %d of %d oracle episodes of env %r did not end done with a positive return and are left out "
            "(%s)", len(dropped), len(trajs), r.env, out / "sft_dropped.jsonl",
        )  # fmt: skip
    if not kept:
        raise ValueError(
            f"sft: none of the {len(trajs)} oracle episodes of env {r.env!r} ended done with a positive return "
            f"(see {out / 'sft_dropped.jsonl'}); check the env's oracle and the episode limits (rollout.episode: "
            "max_turns, max_total_tokens, max_images, max_context_pixels)"
        )
    return kept, len(dropped)


def write_card(
    out: Path, cfg: Config, *, n_records: int, final_loss: float, episodes: tuple[int, int] | None = None
) -> None:
    import sys

    import transformers

    def rel(path: str) -> str:
        return os.path.relpath(path) if os.path.isabs(path) else path

    cmd = (
        "mmrl " + " ".join(sys.argv[1:])
        if sys.argv and sys.argv[0].endswith("mmrl")
        else "mmrl.train.sft.run_sft(...)"
    )
    images = f"images at {cfg.model.min_pixels}..{cfg.model.max_pixels} px"
    if episodes is None:
        objective = (
            f"mean token cross-entropy (label smoothing {cfg.sft.label_smoothing}) of `answer + <|im_end|>` "
            f"after the chat prompt ({images})"
        )
        unit = "records"
    else:
        kept, dropped = episodes
        r = cfg.rollout
        objective = (
            f"mean token cross-entropy of the actions (each with its end-of-turn marker) of teacher-forced "
            f"episodes of env `{r.env}` (its oracle writes every turn; max_turns {r.episode.max_turns}, "
            f"{r.episode.observation_role} observation turns, {images}): {kept} episodes kept, {dropped} dropped for not "
            "ending done with a positive return (`sft_dropped.jsonl`)"
        )
        unit = "episodes"
    text = f"""# Supervised warm start: {out.name}

Made by `{cmd}` with mmrl's `run_sft` (torch {torch.__version__}, transformers {transformers.__version__}, CPU).

- base model: `{rel(cfg.model.path)}`
- records: the first {n_records} of `{rel(cfg.data.train)}` (built by `{cfg.data.builder}`, seed {cfg.train.seed})
- objective: {objective}
- optimiser: AdamW lr {cfg.sft.lr}, {cfg.sft.steps} steps x {cfg.sft.batch_size} {unit}, grad-norm clip 1.0, seed {cfg.train.seed}
- final training loss: {final_loss:.4f} (per-step losses in `sft_metrics.jsonl`; full config in `sft_config.json`)

The weights are in `model/` (HF format: `AutoModelForImageTextToText.from_pretrained("{out}/model")`).
"""
    (out / "README.md").write_text(text)
