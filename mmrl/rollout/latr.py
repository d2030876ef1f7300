"""LATR, lookahead tree-based rollouts (docs/cliff.md#latr), as a rollout engine that wraps another
(``rollout.engine: latr``, ``rollout.engine_options: {base: hf | vllm, ...}``).

Of the n responses of each prompt, k = round(n * eta) come from a rollout tree and n - k are the base engine's plain
samples (eta from ``schedule``, a map from the training step, counted by weight syncs, to the share; default 1). The
tree of a prompt grows by rounds, each one call of the base engine for every live branch of every prompt:

1. A branch is decoded greedily (the base engine at temperature 0) for up to ``depth`` tokens, recording at every
   position the top ``m`` tokens of the T = 1 distribution (``SamplingParams.top_logprobs``).
2. Position s of a branch is a *branch point* when its greedy token is candidate 1 and candidate j >= 2 has
   p_j > ``tau_abs`` and p_1 - p_j < ``tau_rel``: a child is the branch's tokens before s, then candidate j.
   Children are taken in column order (every branch point's candidate 2 before any candidate 3; earlier positions
   first) while the prompt has fewer than k branches; the next round decodes them greedily on from their prefix.
3. *Lookahead pruning*: a child born at s is compared with its parent over the ``window`` tokens after the branch
   token; if both have them (neither stopped before) and they are too alike (ROUGE-L F1 of the token ids >
   ``rouge_l`` or the share of the window ending in a common suffix > ``suffix``), the child is dropped and its place
   is free for the next candidate.
4. *Hand-off*: when no candidate is left or the prompt holds k branches, every branch is cut after its lookahead
   window (the root after ``window`` tokens) and finished by the base engine's ordinary sampling with the run's
   settings, one sample each; a branch that already stopped is complete. A prompt with fewer than k branches is
   padded by repeating its branches (their completions still differ, being sampled).

The completion's tokens are the tree prefix and its sampled continuation; its log-probs the prefix's at T = 1 (the
greedy phase's) and the continuation's at the run's temperature, so with ``rollout.temperature != 1`` use
``algo.old_logprobs: recompute``. Multi-turn episodes go through :meth:`generate` turn by turn, as with any engine.
Greedy requests (the validator's default) go straight to the base engine; suppressed tokens (vision placeholders)
are never branch tokens; a tensor-parallel base is refused (its group's calls must match). The schedule's step is
the engine's version, which the trainer sets on resume.

Departures from the released code (starreeze/latr): its tree phase is one HF decoding loop that duplicates KV-cache
rows at each branch; here each round is one call of the base engine on the branches' token prefixes (prefix caching
where the engine has it, vLLM), so HF and vLLM share one implementation. Its windows 20/30/50 are one ``window``
here, whose default suits short answers (8 tokens); its suffix-match score is read as the longest common suffix of
the two windows over the window's length (the code's exact formula was not read).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Any

from mmrl.model.policy import Policy
from mmrl.model.prompt import EncodedPrompt
from mmrl.rollout.base import ENGINES, Completion, RolloutEngine, SamplingParams
from mmrl.types import Sample


def branch_points(
    tokens: list[int], top: list[list[tuple[int, float]]], start: int, tau_abs: float, tau_rel: float
) -> list[tuple[int, int, int]]:
    """``(column, position, token)`` of every child a greedy branch offers from ``start`` on: candidate j >= 2 of a
    position whose greedy token is candidate 1, with p_j > tau_abs and p_1 - p_j < tau_rel (probabilities)."""
    import math

    out = []
    for s in range(start, min(len(tokens), len(top))):
        cands = top[s]
        if not cands or cands[0][0] != tokens[s]:
            continue
        p1 = math.exp(cands[0][1])
        for j, (tok, lp) in enumerate(cands[1:], start=2):
            p = math.exp(lp)
            if p > tau_abs and p1 - p < tau_rel:
                out.append((j, s, tok))
    return out


def rouge_l(a: list[int], b: list[int]) -> float:
    """ROUGE-L F1 of two token sequences (longest common subsequence)."""
    if not a or not b:
        return 0.0
    prev = [0] * (len(b) + 1)
    for x in a:
        cur = [0]
        for j, y in enumerate(b):
            cur.append(prev[j] + 1 if x == y else max(prev[j + 1], cur[j]))
        prev = cur
    lcs = prev[-1]
    return 0.0 if lcs == 0 else 2 * lcs / (len(a) + len(b))


def suffix_share(a: list[int], b: list[int]) -> float:
    """The longest common suffix of two windows over the longer one's length."""
    n = 0
    while n < min(len(a), len(b)) and a[-1 - n] == b[-1 - n]:
        n += 1
    return n / max(len(a), len(b), 1)


@dataclass
class Branch:
    tokens: list[int]
    logps: list[float]
    versions: list[int]
    born: int  # position of its branch token (-1: the root)
    parent: int  # index of its parent in the prompt's branches (-1: the root)
    top: list[list[tuple[int, float]]] = field(default_factory=list)
    stopped: bool = False
    offered: bool = False  # its branch points were queued


@ENGINES.register("latr")
class LATREngine(RolloutEngine):
    """Lookahead tree rollouts around a base engine."""

    logprobs_at_run_temperature = False  # the tree prefix's are at T = 1 (module docstring)

    def __init__(
        self,
        policy: Policy,
        batch_size: int = 16,
        *,
        base: str = "hf",
        base_options: dict[str, Any] | None = None,
        schedule: dict[int, float] | None = None,
        branches_per_token: int = 2,
        tau_abs: float = 0.15,
        tau_rel: float = 0.25,
        window: int = 8,
        rouge_l: float = 0.5,
        suffix: float = 0.2,
        depth: int | None = None,
        **engine_extra: Any,
    ):
        if base == "latr":
            raise ValueError("rollout.engine_options.base: latr cannot wrap itself; use hf or vllm")
        if branches_per_token < 2 or window < 1:
            raise ValueError(
                f"latr: branches_per_token >= 2 and window >= 1, got {branches_per_token}, {window}"
            )
        sched = {int(k): float(v) for k, v in (schedule or {0: 1.0}).items()}
        if not all(0.0 <= v <= 1.0 for v in sched.values()) or 0 not in sched:
            raise ValueError(f"latr: schedule maps steps (from 0) to shares in [0, 1], got {schedule}")
        self.base = ENGINES.get(base)(policy, batch_size=batch_size, **(base_options or {}), **engine_extra)
        self.policy, self.batch_size = policy, batch_size
        self.owns_weights = self.base.owns_weights
        self.schedule, self.m = sorted(sched.items()), branches_per_token
        self.tau_abs, self.tau_rel, self.window = tau_abs, tau_rel, window
        self.max_rouge, self.max_suffix, self.depth = rouge_l, suffix, depth
        self.step = 0  # weight syncs so far: the training step, for the schedule
        self.counts: Counter = Counter()
        self.last_share = 0.0
        self.records_versions = True  # the base engine's completions carry versions (HF and vLLM do)

    # the base engine's members
    def sync_weights(self) -> None:
        self.base.sync_weights()
        self.step += 1

    def close(self) -> None:
        self.base.close()

    def score(self, contexts: list, tails: list[int]) -> list[list[float]] | None:
        return self.base.score(contexts, tails)

    def paused(self) -> Any:
        return self.base.paused()

    @property
    def version(self) -> int:
        return getattr(self.base, "version", self.step)

    @version.setter
    def version(self, v: int) -> None:
        """The policy version the weights hold (the trainer sets it on resume): the schedule's step too."""
        self.step = v
        if hasattr(self.base, "version"):
            self.base.version = v

    def share(self) -> float:
        return [v for s, v in self.schedule if s <= self.step][-1]

    # generation
    @classmethod
    def check_options(cls, options: dict[str, Any]) -> None:
        super().check_options(options)
        tp = (options.get("base_options") or {}).get("tensor_parallel_size", 1)
        if tp > 1:
            raise ValueError(
                "latr around a tensor-parallel engine: the members of a tensor-parallel group must make the same "
                "engine calls, and a tree's calls depend on its prompts; use tensor_parallel_size 1"
            )

    def generate(self, prompts: list[EncodedPrompt], params: SamplingParams) -> list[list[Completion]]:
        if params.temperature <= 0:  # greedy (the validator's default): one root decoded greedily is the same
            return self.base.generate(prompts, params)
        k = round(params.n * self.share())
        plain = self.base.generate(prompts, replace(params, n=params.n - k)) if k < params.n else None
        trees = self._trees(prompts, params, k) if k else [[] for _ in prompts]
        return [t + (plain[i] if plain is not None else []) for i, t in enumerate(trees)]

    def _decode(self, prompts: list[EncodedPrompt], prefixes: list[list[int]], budget: list[int], params: Any,
                greedy: bool) -> list[Completion]:  # fmt: skip
        """One base-engine call: each prompt continued after its prefix for its budget of tokens."""
        contexts = [continued(self.policy, p, x) for p, x in zip(prompts, prefixes)]
        out: list[Completion | None] = [None] * len(contexts)
        by_budget: dict[int, list[int]] = {}
        for i, b in enumerate(budget):
            by_budget.setdefault(b, []).append(i)
        for b, idx in by_budget.items():
            ps = replace(params, n=1, max_new_tokens=b)
            if greedy:
                ps = replace(ps, temperature=0.0, top_logprobs=self.m)
            for i, group in zip(idx, self.base.generate([contexts[i] for i in idx], ps)):
                out[i] = group[0]
        return out  # type: ignore[return-value]

    def _trees(self, prompts: list[EncodedPrompt], params: SamplingParams, k: int) -> list[list[Completion]]:
        depth = min(self.depth or params.max_new_tokens, params.max_new_tokens)
        eos = set(self.policy.eos_ids)
        banned = set(self.policy.suppressed_token_ids or ())  # vision placeholders: never a branch token
        trees: list[list[Branch]] = [[] for _ in prompts]
        queues: list[list[tuple[int, int, int, int]]] = [
            [] for _ in prompts
        ]  # (column, position, token, parent)
        pending = [(i, Branch([], [], [], -1, -1)) for i in range(len(prompts))]
        pruned = rounds = 0
        while pending:
            rounds += 1
            live = [(i, b) for i, b in pending if not b.stopped and len(b.tokens) < depth]
            done = self._decode(
                [prompts[i] for i, _ in live],
                [b.tokens for _, b in live],
                [depth - len(b.tokens) for _, b in live],
                params,
                greedy=True,
            ) if live else []  # fmt: skip
            for (_, b), c in zip(live, done):
                self.records_versions = c.versions is not None
                b.tokens += c.token_ids
                b.logps += c.logprobs
                b.versions += c.versions or [0] * len(c.token_ids)
                b.top += c.top or [[]] * len(c.token_ids)
                b.stopped = bool(b.tokens) and b.tokens[-1] in eos
            for i, b in pending:
                if b.parent >= 0 and self._too_alike(b, trees[i][b.parent]):
                    pruned += 1
                else:
                    trees[i].append(b)
            pending = []
            for i, tree in enumerate(trees):
                for j, b in enumerate(tree):
                    if not b.offered:
                        b.offered = True
                        found = branch_points(b.tokens, b.top, b.born + 1, self.tau_abs, self.tau_rel)
                        queues[i] += [(col, s, tok, j) for col, s, tok in found if tok not in banned]
                queues[i].sort()
                room = k - len(tree)
                while room > 0 and queues[i]:
                    _, s, tok, j = queues[i].pop(0)
                    pending.append((i, child(tree[j], j, s, tok, eos)))
                    room -= 1
        # hand-off: each branch cut after its window, finished by sampling (padded to k by repetition)
        jobs: list[tuple[int, Branch]] = []
        for i, tree in enumerate(trees):
            for r in range(k):
                jobs.append((i, tree[r % len(tree)]))
        cut = []
        for _, b in jobs:
            end = (
                min(len(b.tokens), b.born + 1 + self.window)
                if b.born >= 0
                else min(len(b.tokens), self.window)
            )
            stopped = b.stopped and end == len(b.tokens)
            cut.append((b.tokens[:end], b.logps[:end], b.versions[:end], stopped))
        todo = [n for n, c in enumerate(cut) if not c[3] and len(c[0]) < params.max_new_tokens]
        tails = self._decode(
            [prompts[jobs[n][0]] for n in todo],
            [cut[n][0] for n in todo],
            [params.max_new_tokens - len(cut[n][0]) for n in todo],
            params,
            greedy=False,
        ) if todo else []  # fmt: skip
        finished = dict(zip(todo, tails))
        out: list[list[Completion]] = [[] for _ in prompts]
        for n, (i, _) in enumerate(jobs):
            tokens, logps, versions, stopped = cut[n]
            tail = finished.get(n)
            if tail is not None:
                tokens, logps = tokens + tail.token_ids, logps + tail.logprobs
                versions = versions + (tail.versions or [0] * len(tail.token_ids))
            reason = "stop" if tokens and tokens[-1] in eos else "length"
            versions = versions if self.records_versions else None
            out[i].append(Completion(tokens, self.policy.decode(tokens), logps, reason, versions=versions))
        c = self.counts
        c["prompts"] += len(trees)
        c["branches"] += sum(len(t) for t in trees)
        c["pruned"] += pruned
        c["rounds"] += rounds
        c["calls"] += 1
        self.last_share = k / params.n
        return out

    def take_stats(self) -> dict[str, float]:
        """Per tree-building call since the last take: branches per prompt (before padding to k), children pruned
        and rounds; and the share of tree responses of the last call."""
        c, self.counts = self.counts, Counter()
        if not c["calls"]:
            return {}
        return {
            "latr/branches": c["branches"] / c["prompts"],
            "latr/pruned": c["pruned"] / c["calls"],
            "latr/rounds": c["rounds"] / c["calls"],
            "latr/share": self.last_share,
        }

    def _too_alike(self, child: Branch, parent: Branch) -> bool:
        s, w = child.born + 1, self.window
        a, b = child.tokens[s : s + w], parent.tokens[s : s + w]
        if (
            len(a) < w or len(b) < w
        ):  # one side stopped inside the window: not compared, as the code skips at EOS
            return False
        return rouge_l(a, b) > self.max_rouge or suffix_share(a, b) > self.max_suffix


def child(parent: Branch, j: int, s: int, token: int, eos: set[int]) -> Branch:
    """The branch that leaves ``parent`` (index ``j``) at position ``s`` with ``token`` (one of its top candidates
    there, whose T = 1 log-prob it keeps)."""
    logp = dict(parent.top[s])[token]
    return Branch(
        parent.tokens[:s] + [token],
        parent.logps[:s] + [logp],
        parent.versions[: s + 1],
        s,
        j,
        top=parent.top[: s + 1],  # position s's candidates are the parent's: the same context before it
        stopped=token in eos,
    )


def continued(policy: Policy, prompt: EncodedPrompt, prefix: list[int]) -> EncodedPrompt:
    """``prompt`` followed by the response tokens ``prefix``: the context a base engine continues from (its media
    unchanged; for vLLM the prefix rides as token ids after the prompt's parts), as the episode driver builds a
    trajectory's context."""
    if not prefix:
        return prompt
    from mmrl.rollout.episodes import Trajectory

    t = Trajectory.start("latr", Sample("latr", []), prompt, "")
    t.add_completion(Completion(list(prefix), "", [0.0] * len(prefix), "length"))
    return t.context()
