"""LATR (mmrl.rollout.latr, docs/cliff.md#latr): the branching test, ROUGE-L and the suffix share on hand values; the
tree engine around the HF engine on the tiny model with an image (k tree responses that differ from their first
branch token on, plain samples beside them by the schedule, every token's log-prob the training forward's); and a
2-step run with ``rollout.engine: latr``. The vLLM side is tests/test_vllm_latr.py.

Branching by hand (tau_abs 0.15, tau_rel 0.25), top-2 per position of a greedy path [5, 6, 7]:
    position 0: 5 p 0.5, 9 p 0.4   -> 0.4 > 0.15 and 0.1 < 0.25: branch (column 2, position 0, token 9)
    position 1: 6 p 0.9, 8 p 0.05  -> 0.05 < 0.15: no
    position 2: 7 p 0.4, 3 p 0.3   -> branch (2, 2, 3)
"""

import math
from pathlib import Path

import pytest
import torch
from PIL import Image
from tiny_config import shapes_config

from mmrl.config import ModelConfig
from mmrl.model.policy import Policy
from mmrl.rollout import ENGINES, SamplingParams
from mmrl.rollout.latr import branch_points, rouge_l, suffix_share
from mmrl.run.metrics import read_metrics
from mmrl.types import Sample

ROOT = Path(__file__).resolve().parents[1]
TINY = str(ROOT / "assets" / "tiny-qwen2.5-vl")


def _top(*pairs):
    return [[(t, math.log(p)) for t, p in step] for step in pairs]


def test_hand_values():
    top = _top([(5, 0.5), (9, 0.4)], [(6, 0.9), (8, 0.05)], [(7, 0.4), (3, 0.3)])
    assert branch_points([5, 6, 7], top, 0, 0.15, 0.25) == [(2, 0, 9), (2, 2, 3)]
    assert branch_points([5, 6, 7], top, 1, 0.15, 0.25) == [(2, 2, 3)]  # a child offers only after its birth
    assert branch_points([9, 6, 7], top, 0, 0.15, 0.25) == [(2, 2, 3)]  # position 0 is not greedy there
    assert rouge_l([1, 2, 3, 4], [1, 3, 4, 5]) == pytest.approx(0.75)  # LCS 3: 2 * 3 / 8
    assert rouge_l([], [1]) == 0.0
    assert suffix_share([1, 2, 3, 4], [9, 9, 3, 4]) == 0.5 and suffix_share([1], [2]) == 0.0


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    d = tmp_path_factory.mktemp("img")
    Image.new("RGB", (56, 56), (30, 160, 200)).save(d / "a.png")
    policy = Policy.from_pretrained(ModelConfig(path=TINY, min_pixels=3136, max_pixels=3136))
    msgs = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What is shown?"}]}]
    return policy, [policy.encode(Sample("a", msgs, images=[str(d / "a.png")]))]


def test_tree_responses_differ_and_score_like_the_policy(setup):
    policy, prompts = setup
    torch.manual_seed(0)
    eng = ENGINES.get("latr")(
        policy, batch_size=8, tau_abs=0.0, tau_rel=1.0, window=3, rouge_l=1.1, suffix=1.1
    )
    params = SamplingParams(n=4, temperature=1.0, max_new_tokens=8)
    [group] = eng.generate(prompts, params)
    stats = eng.take_stats()
    assert len(group) == 4 and stats["latr/branches"] == 4 and stats["latr/share"] == 1.0
    assert eng.take_stats() == {}  # taken: reset
    # 4 branches of one tree: the root and children that leave it at a branch token, so no two share a prefix of
    # length (first branch position + 1): the group differs at the trajectory level, not by sampling alone
    heads = {tuple(c.token_ids[:4]) for c in group}
    assert len(heads) == 4
    for c in group:  # the engine's log-probs (tree tokens at T = 1, the continuation at 1) are the policy's
        logp, _, _ = policy.logprobs([prompts[0]], [c.token_ids], temperature=1.0)
        assert torch.allclose(logp[0, : len(c.token_ids)], torch.tensor(c.logprobs), atol=1e-4)


def test_schedule_and_plain_samples(setup):
    policy, prompts = setup
    eng = ENGINES.get("latr")(policy, batch_size=8, schedule={0: 0.5, 1: 0.0}, tau_abs=0.0, tau_rel=1.0)
    [group] = eng.generate(prompts, SamplingParams(n=4, temperature=1.0, max_new_tokens=4))
    assert len(group) == 4 and eng.take_stats()["latr/share"] == 0.5
    eng.sync_weights()  # step 1: the share drops to 0, every response a plain sample
    assert eng.share() == 0.0 and len(eng.generate(prompts, SamplingParams(n=3, max_new_tokens=4))[0]) == 3
    eng.version = 0  # a resumed run sets the version it resumed at: the schedule follows it
    assert eng.share() == 0.5 and eng.base.version == 0
    assert eng.generate(prompts, SamplingParams(n=1, temperature=0.0, max_new_tokens=4))  # greedy: the base's
    assert eng.take_stats() == {}
    with pytest.raises(ValueError, match="tensor-parallel"):
        ENGINES.get("latr").check_options({"base": "vllm", "base_options": {"tensor_parallel_size": 2}})
    with pytest.raises(ValueError, match="cannot wrap itself"):
        ENGINES.get("latr")(policy, base="latr")
    with pytest.raises(ValueError, match="schedule"):
        ENGINES.get("latr")(policy, schedule={1: 0.5})


def test_two_steps_through_the_cli(tmp_path):
    from mmrl.cli import main

    cfg = shapes_config(
        tmp_path,
        """\
rollout: {n: 4, max_new_tokens: 6, batch_size: 8, engine: latr,
  engine_options: {tau_abs: 0.0, tau_rel: 1.0, window: 2}}
rewards: [{name: exact_match}]
algo: {epochs: 1, mini_batches: 1, old_logprobs: recompute}
optim: {lr: 0.001, micro_batch_size: 8}
train: {prompts_per_step: 2, progress: false, seed: 3}
""",
    )
    out = tmp_path / "run"
    assert main(["train", str(cfg), "--output-dir", str(out), "--max-steps", "2"]) == 0
    rows = [r for r in read_metrics(out / "metrics.jsonl") if "rollout/logprob_diff_max" in r]
    assert len(rows) == 2 and all(r["rollout/logprob_diff_max"] < 1e-3 for r in rows)
    assert all(r["latr/branches"] == 4 for r in rows)


class _Toy:
    """A deterministic stand-in for a model, to follow the tree below its first level: token 0 ends a response.
    Greedy is 1 everywhere; the root's position 0 offers 3 (p 0.5 vs 0.4), and a branch that starts with 3 offers 5
    at every later position; nothing else branches. Sampling writes 7, 7, then ends."""

    eos_ids = [0]
    suppressed_token_ids: list[int] = []

    @staticmethod
    def decode(tokens):
        return " ".join(map(str, tokens))


def test_children_branch_again_at_their_own_positions(monkeypatch):
    from mmrl.rollout import RolloutEngine, latr
    from mmrl.rollout.base import Completion

    calls = []

    class ToyEngine(RolloutEngine):
        def __init__(self, policy, batch_size=1):
            self.batch_size = batch_size

        def sync_weights(self):
            return None

        def generate(self, prompts, params):
            out = []
            for prefix in prompts:
                calls.append((tuple(prefix), params.temperature))
                if params.temperature > 0:
                    toks = [7, 7, 0][: params.max_new_tokens]
                    out.append([Completion(toks, "", [-0.1] * len(toks), "stop")])
                    continue
                toks, top = [], []
                for s in range(len(prefix), len(prefix) + params.max_new_tokens):
                    ctx = list(prefix) + toks
                    if s == 0:
                        cands = [(1, math.log(0.5)), (3, math.log(0.4))]
                    elif ctx and ctx[0] == 3:
                        cands = [(1, math.log(0.5)), (5, math.log(0.4))]
                    else:
                        cands = [(1, math.log(0.9)), (3, math.log(0.05))]
                    toks.append(1)
                    top.append(cands)
                out.append([Completion(toks, "", [c[0][1] for c in top], "length", top=top)])
            return out

    from mmrl.rollout import ENGINES

    if "toy_tree" not in ENGINES:
        ENGINES.register("toy_tree")(ToyEngine)
    monkeypatch.setattr(latr, "continued", lambda policy, prompt, prefix: list(prefix))
    eng = ENGINES.get("latr")(_Toy(), base="toy_tree", window=1, rouge_l=1.1, suffix=1.1)
    [group] = eng._trees([[]], SamplingParams(n=3, temperature=1.0, max_new_tokens=4), 3)
    # the root [1, 1, 1, 1]; its child at 0 [3, 1, 1, 1]; the child's child at 1 [3, 5, 1, 1] (its first branch point)
    greedy = [c for c, t in calls if t == 0]
    assert greedy == [(), (3,), (3, 5)]
    # hand-off after each branch's window (1 token after its branch token; the root's first token)
    assert [c.token_ids for c in group] == [[1, 7, 7, 0], [3, 1, 7, 7], [3, 5, 1, 7]]
    assert group[2].logprobs[:2] == pytest.approx([math.log(0.4)] * 2)  # its branch tokens' T = 1 log-probs
    assert eng.take_stats()["latr/branches"] == 3


def test_a_run_away_from_unit_temperature_must_recompute_pi_old():
    """LATR's tree prefix carries log-probs at T = 1 (the branch points' distribution): at another temperature pi_old
    taken from the rollout would be wrong for those tokens, so pre-flight asks for a recompute."""
    from mmrl.config import ConfigError, load_config
    from mmrl.train.checks import check_components

    base = ["rollout.engine=latr", "rollout.temperature=0.7"]
    with pytest.raises(ConfigError, match="set algo.old_logprobs: recompute"):
        check_components(load_config(None, base))
    with pytest.raises(ConfigError, match="old_logprobs: interpolate"):
        check_components(load_config(None, [*base, "algo.old_logprobs=interpolate"]))
    check_components(load_config(None, [*base, "algo.old_logprobs=recompute"]))
    check_components(load_config(None, ["rollout.engine=latr", "rollout.temperature=1.0"]))
    check_components(load_config(None, ["rollout.engine=hf", "rollout.temperature=0.7"]))
