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

Critics (``critic``): ``simple`` ("The generated solution is correct." / "... is incorrect.", by ``success_at``),
``simple_gt`` (the released script's default: adds "The ground truth is {answer}.") and ``judge``: the paper's
natural-language critiques, written by a judge model (:class:`JudgeCritic`, options under ``judge``: the ``judge``
reward's model settings plus ``template``), after the ``simple`` verdict sentence; a critique the judge does not
write in time, or writes empty, falls back to the verdict sentence alone and is counted in
``critique/judge_failures``.

Stats: ``critique/extra_samples`` (refinements generated), ``critique/refined_right`` (share of refinements that reach
``success_at``), ``critique/fixed`` (share of wrong responses whose refinement is right), ``critique/placed``.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
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


JUDGE_TEMPLATE = (
    "Question: {question}\n"
    "Reference answer: {reference}\n"
    "Candidate answer: {response}\n"
    "The candidate answer was graded {verdict}. Critique it in one or two sentences: say what is wrong or missing "
    "(or, when it is correct, what makes it so), without writing the corrected answer."
)


class JudgeCritic:
    """Critiques written by a judge model: the ``judge`` reward's loader and engines (one copy per process, shared
    with a ``judge`` or ``arena`` reward that names the same folder and settings), greedy, ``max_new_tokens`` at
    most. ``template`` (fields ``{question}``, ``{reference}``, ``{response}`` and ``{verdict}``: ``correct`` or
    ``incorrect`` by the run's reward) is one user turn, text or a .txt/.md file; with ``use_image`` the judge, a
    VLM, sees the record's images first; ``answer_only``: ``{response}`` is the ``<answer>`` content (else the
    whole response, reasoning included)."""

    def __init__(
        self,
        *,
        model: str = "",
        engine: str = "hf",
        template: str = JUDGE_TEMPLATE,
        answer_only: bool = False,
        use_image: bool = False,
        chat_template_kwargs: dict | None = None,
        max_new_tokens: int = 96,
        batch_size: int = 16,
        timeout_s: float = 120.0,
        device: str = "auto",
        dtype: str = "auto",
        offload: bool = False,
        gpu_memory_utilization: float = 0.3,
    ):
        from mmrl.rewards.local_model import check_model_folder

        check_model_folder("critique", "judge.model", model)
        if template.endswith((".txt", ".md")) and "\n" not in template:
            path = Path(template).expanduser()
            if not path.is_file():
                raise ValueError(f"augment 'critique': judge.template: file not found: {template}")
            template = path.read_text()
        if "{response}" not in template:
            raise ValueError("augment 'critique': judge.template must contain {response}")
        try:
            template.format(question="", reference="", response="", verdict="")
        except (KeyError, IndexError, ValueError) as e:
            raise ValueError(
                f"augment 'critique': judge.template: {type(e).__name__} {e} (its fields: {{question}}, "
                "{reference}, {response}, {verdict}; write a literal brace twice)"
            ) from None
        self.model, self.engine, self.template, self.use_image = model, engine, template, use_image
        self.answer_only = answer_only
        self.kwargs = chat_template_kwargs or {}
        self.max_new_tokens, self.batch_size, self.timeout_s = max_new_tokens, batch_size, timeout_s
        self.load = (model, engine, device, dtype, use_image, offload, gpu_memory_utilization)

    def __call__(self, items: list[tuple[Sample, str, bool]]) -> list[str | None]:
        """One critique per (record, response text, graded right); None where the judge wrote nothing in time."""
        from mmrl.rewards.judge import load_judge
        from mmrl.rewards.local_model import clean_reference, open_images
        from mmrl.rewards.text import answer_text

        judge = load_judge(*self.load)
        prompts = []
        for sample, text, right in items:
            refs = clean_reference(sample.answer)
            user = self.template.format(
                question=question_text(sample),
                reference=refs[0] if refs else "",
                response=answer_text(text) if self.answer_only else text.strip(),
                verdict="correct" if right else "incorrect",
            )
            images = open_images(sample.images, sample.id) if self.use_image else []
            prompts.append((judge.render(user, len(images), self.kwargs), images))
        out = judge.generate(prompts, self.max_new_tokens, self.batch_size, self.timeout_s)
        return [None if g is None or not g.text.strip() else g.text.strip() for g in out]


def question_text(sample: Sample) -> str:
    """``metadata["question"]``, else the text of the record's last user turn."""
    q = sample.metadata.get("question")
    if q:
        return str(q)
    users = [m for m in sample.messages if m.get("role") == "user"]
    content = users[-1]["content"] if users else ""
    if isinstance(content, str):
        return content.replace("<image>", "").replace("<video>", "").strip()
    return " ".join(p.get("text", "") for p in content if p.get("type") == "text").strip()


def critique_text(critic: str, right: bool, answer: Any) -> str:
    verdict = f"The generated solution is {'correct' if right else 'incorrect'}."
    if critic in ("simple", "judge"):
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
        judge: dict | None = None,
    ):
        if critic not in ("simple", "simple_gt", "judge"):
            raise ValueError(
                "augment 'critique': critic must be 'simple', 'simple_gt' or 'judge' (algo.augment_options.critic), "
                f"got {critic!r}"
            )
        if (critic == "judge") != bool(judge):
            raise ValueError(
                "augment 'critique': critic 'judge' needs the judge's options (algo.augment_options.judge: {model: "
                "...}), and only it takes them"
            )
        self.judge = JudgeCritic(**judge) if judge else None
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
        asks, right_before, items = [], [], []
        for b in range(B):
            for g in range(G):
                right = float(got.rewards[b, g]) >= self.success_at
                right_before.append(right)
                items.append((got.samples[b], got.trajectories[b][g].last_completion().text, right))
        written = self.judge(items) if self.judge is not None else [None] * len(items)
        for (s, text, right), extra in zip(items, written):
            critique = critique_text(self.critic, right, s.answer)
            asks.append(
                refinement_sample(s, text, f"{critique} {extra}" if extra else critique, self.instruction)
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
        if self.judge is not None:
            got.stats["critique/judge_failures"] = float(sum(w is None for w in written))
        return got
