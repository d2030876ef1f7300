"""IGPO's answer probes (docs/credit.md#igpo): teacher-forced rows, built from a multi-turn trajectory, that ask how
likely the policy finds the record's reference answer before each turn. The trainer scores them in its no-grad
passes (:mod:`mmrl.train.no_grad`) and hands the log-probs to the estimator (``AdvantageInput.answer_logp``)."""

from __future__ import annotations

from dataclasses import replace

from mmrl.model.policy import Policy
from mmrl.rollout.episodes import Trajectory


def answer_probes(
    policy: Policy, trajectories: list[Trajectory], template: str
) -> tuple[list[Trajectory], list[int]]:
    """Teacher-forced rows that ask how likely the policy finds each sample's reference answer before each turn
    (docs/credit.md#igpo): for turn k of a trajectory, its context when turn k was generated (the first prompt, the
    response before the turn's first token, the media the turn saw) followed by ``template`` with ``{answer}``
    replaced by ``str(sample.answer)``; only the answer's own tokens have mask 1. The template's text before and
    after the answer and the answer are tokenised apart, so the answer's tokens are the same in every probe.
    Returns the probes in trajectory order, turn order, and for each the index of its trajectory. A trajectory of
    fewer than two turns has no probe (there is no gain to measure)."""
    if template.count("{answer}") != 1:
        raise ValueError(f"answer probe template {template!r} must hold '{{answer}}' exactly once")
    head, tail = template.split("{answer}")

    def ids(text: str) -> list[int]:
        return policy.tokenizer(text, add_special_tokens=False).input_ids if text else []

    probes: list[Trajectory] = []
    owners: list[int] = []
    answers: dict[str, tuple[list[int], list[int], list[int]]] = {}
    for i, t in enumerate(trajectories):
        if len(t.turns) < 2:  # no gain to measure: a one-turn episode's only turn keeps its outcome
            continue
        ans = t.sample.answer
        if isinstance(ans, (list, tuple)) and len(ans) == 1:
            ans = ans[0]
        if not isinstance(ans, (str, int, float)) or isinstance(ans, bool) or not str(ans).strip():
            raise ValueError(
                f"record {t.sample.id!r}: the answer probe needs a reference answer that reads as one text (its "
                f"'answer' field); got {ans!r}. Give every record an answer, or use an estimator that reads none"
            )
        if str(ans) not in answers:
            answers[str(ans)] = (ids(head), ids(str(ans)), ids(tail))
        pre, gt, post = answers[str(ans)]
        tail_ids = pre + gt + post
        tail_mask = [0] * len(pre) + [1] * len(gt) + [0] * len(post)
        P, full = len(t.prompt.input_ids), t.seq()
        for turn, mm in zip(t.turns, t.turn_media):
            L = (
                turn.start
            )  # the response before this turn: earlier turns, their observations, the turn's header
            prompt = t.prompt if mm is t.prompt.mm else replace(t.prompt, mm=mm)
            probe = Trajectory(
                f"{t.episode_id}@{L}",
                t.sample,
                prompt,
                response=t.response[:L] + tail_ids,
                mask=[0] * L + tail_mask,
                logprobs=[0.0] * (L + len(tail_ids)),
                mm=prompt.mm,
                seq_parts=[
                    (P, prompt.seq),
                    (L, {k: v[P : P + L] for k, v in full.items()}),
                    (len(tail_ids), {}),
                ],
            )
            probes.append(probe)
            owners.append(i)
    return probes, owners
