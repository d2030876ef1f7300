"""Critique-GRPO's refinement pass (docs/cliff.md#critique-grpo), a batch augmenter (``algo.augment: critique``).

After the on-policy round every response gets a natural-language critique; the policy then writes one refinement of
each (n = 1, the run's sampling settings) from a *refinement prompt*: the record's own conversation (its images and
videos where they were), the response as the assistant's turn, and a user turn with the critique and ``instruction``.
The refinements are scored by the run's rewards against the same record. Per group one is picked, the first that
reaches ``success_at``, else the highest-scoring, and it takes the group's first ``slots`` row(s) *under the original
question* (the released code does not keep the refinement prompt): the row's prompt is the original one, its tokens
are the refinement's, and the batch marks the row off-policy (``Collected.off_policy_rows``) so that a loss that
reads it (``critique``, :mod:`mmrl.algos.critique`) shapes its tokens instead of taking a ratio. Its reward replaces
the slot's, and the estimator (Dr. GRPO, ``dr_grpo``, in the paper) reads the group with it.

Critics (``critic``): ``simple`` ("The generated solution is correct." / "... is incorrect.", by ``success_at``) and
``simple_gt`` (the released script's default: adds "The ground truth is {answer}."). The paper's chain-of-thought
critiques come from an external model; a judge critic is not implemented here.

Stats: ``critique/extra_samples`` (refinements generated), ``critique/refined_right`` (share of refinements that reach
``success_at``), ``critique/fixed`` (share of wrong responses whose refinement is right), ``critique/placed``.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from mmrl.algos.losses import LOSSES
from mmrl.config import Config
from mmrl.rollout.episodes import Trajectory
from mmrl.train.augment import AUGMENTERS, Augmenter, put_row
from mmrl.types import Sample

INSTRUCTION = (
    "Please review the critique of your previous answer, then answer the question again: correct the errors if there "
    "are any, and give the final answer in the same format as before."
)


def critique_text(critic: str, right: bool, answer: Any) -> str:
    verdict = f"The generated solution is {'correct' if right else 'incorrect'}."
    if critic == "simple":
        return verdict
    return f"{verdict} The ground truth is {answer}."


def refinement_sample(sample: Sample, response: str, critique: str, instruction: str = INSTRUCTION) -> Sample:
    """The record's conversation, the response as the assistant's turn, then the critique and the instruction as a
    new user turn; images and videos untouched."""
    messages = [
        *[dict(m) for m in sample.messages],
        {"role": "assistant", "content": response},
        {"role": "user", "content": f"{critique}\n{instruction}"},
    ]
    return replace(sample, messages=messages)


@AUGMENTERS.register("critique")
class CritiquePass(Augmenter):
    """Critique-GRPO: a refinement of each response from its critique; the best per group joins under the question."""

    def __init__(
        self,
        *,
        critic: str = "simple_gt",
        success_at: float = 1.0,
        slots: int = 1,
        instruction: str = INSTRUCTION,
    ):
        if critic not in ("simple", "simple_gt"):
            raise ValueError(
                f"augment 'critique': critic must be 'simple' or 'simple_gt' (algo.augment_options.critic), got "
                f"{critic!r}"
            )
        if slots < 1:
            raise ValueError(f"augment 'critique': slots must be >= 1, got {slots}")
        self.critic, self.success_at, self.slots, self.instruction = critic, success_at, slots, instruction

    def check(self, cfg: Config) -> None:
        if cfg.rollout.env:
            raise ValueError(
                "algo.augment 'critique' refines single-turn answers; it cannot run with rollout.env"
            )
        if cfg.rollout.placement == "separate":
            raise ValueError(
                "algo.augment 'critique' runs in the trainer's collector: use rollout.placement: colocated"
            )
        if not getattr(LOSSES.get(cfg.algo.loss), "needs_off_policy", False):
            raise ValueError(
                "algo.augment 'critique' places refinements under the original question, where the engine's "
                "log-probs are not theirs: use a loss that shapes off-policy rows, algo.loss: critique"
            )
        if cfg.algo.old_logprobs == "interpolate":
            raise ValueError(
                "algo.augment 'critique' adds rows whose engine log-probs are of another prompt, which the "
                "interpolated proximal policy would read: use algo.old_logprobs: rollout or recompute"
            )
        if self.slots >= cfg.rollout.n:
            raise ValueError(
                f"algo.augment 'critique': slots ({self.slots}) must be < rollout.n ({cfg.rollout.n})"
            )

    def __call__(self, collector: Any, got: Any) -> Any:
        got.resolve()
        B, G = got.rewards.shape
        asks, right_before = [], []
        for b in range(B):
            s = got.samples[b]
            for g in range(G):
                right = float(got.rewards[b, g]) >= self.success_at
                right_before.append(right)
                text = got.trajectories[b][g].last_completion().text
                asks.append(
                    refinement_sample(s, text, critique_text(self.critic, right, s.answer), self.instruction)
                )
        # one-off prompts: not through the prompt cache, which holds the dataset's
        trajs, rewards, results = collector.rollout(
            asks, replace(collector.sampling_params(), n=1), cache=False
        )
        r = rewards[:, 0].view(B, G)
        placed = 0
        for b in range(B):
            order = sorted(range(G), key=lambda g: (-(float(r[b, g]) >= self.success_at), -float(r[b, g]), g))
            s = got.samples[b]
            prompt = collector.encode(s)
            for slot, g in enumerate(order[: self.slots]):
                refined = trajs[b * G + g][0]
                t = Trajectory.start(f"{refined.episode_id}~refined", s, prompt, f"{s.id}#refined{slot}")
                t.add_completion(refined.last_completion())
                t.end = "single_turn"
                put_row(got, b, slot, t, float(r[b, g]), results[b * G + g])
                got.off_policy_rows.add(b * G + slot)
                placed += 1
        good = (r >= self.success_at).reshape(-1).tolist()
        wrong = [i for i, ok in enumerate(right_before) if not ok]
        got.stats = {
            **got.stats,
            "critique/extra_samples": float(r.numel()),
            "critique/refined_right": sum(good) / len(good),
            "critique/fixed": sum(good[i] for i in wrong) / len(wrong) if wrong else 0.0,
            "critique/placed": float(placed),
        }
        return got
