"""SALT (mmrl.algos.salt, docs/credit.md#salt) against values worked out by hand: trajectory advantages averaged over
the steps the group's trajectories share, with prefix and state merge keys; the single-turn fallback equals grpo;
options are checked; and a 2-step run on the multi-turn test env through the CLI.

The hand batch (docs/credit.md#salt has the same numbers): two tasks of G = 4 trajectories. A step is written
(state, action tokens) and leads to the next step's state; the last step of a trajectory leads nowhere.

    task 0   R   steps
      T0     1   (s0, 2) -> (s1, 2) -> (s3, 1)
      T1     1   (s0, 2) -> (s1, 2) -> (s3, 1)
      T2     0   (s0, 2) -> (s1, 1) -> (s4, 1)
      T3     0   (s0, 3) -> (s2, 2) -> (s1, 2) -> (s3, 1)
    task 1   1 0 0 0, every trajectory (s0, 2) -> (s1, 1): the same state names as task 0's, never merged with them

GRPO: task 0 mean 0.5, unbiased std sqrt(4 * 0.25 / 3) = 1/sqrt(3), A = +-a with a = 0.5 sqrt(3) = 0.866025;
task 1 mean 0.25, std sqrt((0.5625 + 3 * 0.0625) / 3) = 0.5, A = [1.5, -0.5, -0.5, -0.5].
"""

import math
from pathlib import Path

import pytest
import torch

from mmrl.algos import ADVANTAGES, SALT, AdvantageInput, Turn
from mmrl.algos.salt import merged_step_advantages, step_keys
from mmrl.cli import main
from mmrl.config import ConfigError, load_config
from mmrl.run.metrics import read_metrics
from mmrl.train.checks import check_components

ROOT = Path(__file__).resolve().parents[1]
TINY = str(ROOT / "assets" / "tiny-qwen2.5-vl")
T = 12
A = 0.5 / (1 / math.sqrt(3) + 1e-6)  # a, with grpo's eps
PATHS = [
    [("s0", 2), ("s1", 2), ("s3", 1)],
    [("s0", 2), ("s1", 2), ("s3", 1)],
    [("s0", 2), ("s1", 1), ("s4", 1)],
    [("s0", 3), ("s2", 2), ("s1", 2), ("s3", 1)],
    *[[("s0", 2), ("s1", 1)]] * 4,
]
REWARDS = [[1.0, 1.0, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0]]
TASK1 = [(r - 0.25) / (0.5 + 1e-6) for r in REWARDS[1]]  # [1.5, -0.5, -0.5, -0.5] with grpo's eps


def turns(paths=PATHS) -> list[list[Turn]]:
    """Each step's span of ``n`` tokens, one environment token after it."""
    out = []
    for row in paths:
        at, spans = 0, []
        for state, n in row:
            spans.append(Turn(at, at + n, 0.0, state))
            at += n + 1
        out.append(spans)
    return out


def make_input(rewards=REWARDS, paths=PATHS) -> AdvantageInput:
    r = torch.tensor(rewards)
    rows = turns(paths)
    mask = torch.zeros(len(rows), T)
    for i, row in enumerate(rows):
        for t in row:
            mask[i, t.start : t.end] = 1.0
    return AdvantageInput(r, list(range(r.shape[0])), -0.5 * mask, mask, turns=rows)


def paint(per_step: list[list[float]]) -> torch.Tensor:
    out = torch.zeros(len(PATHS), T)
    for i, (row, vals) in enumerate(zip(turns(), per_step)):
        for t, v in zip(row, vals):
            out[i, t.start : t.end] = v
    return out


def test_prefix_keys_hand_values():
    adv, stats = ADVANTAGES.get("salt")(10, key="prefix")(make_input())
    a = A
    expected = [
        [a / 3, a, a],  # (s0,2,s1) is shared by T0 T1 T2: (a + a - a) / 3; (s1,2,s3) after it by T0 T1: a
        [a / 3, a, a],
        [a / 3, -a, -a],  # its second step is its own
        [-a] * 4,  # T3's first step already differs (3 tokens, to s2): its whole branch is its own
        *[[0.0, TASK1[g]] for g in range(4)],  # task 1: a first step all four share gets the group mean, 0
    ]
    assert torch.allclose(adv, paint(expected), atol=1e-5)
    # 21 steps; in a node of 2+: task 0's T0 T1 (2 each) and T2's first, task 1's four first steps -> 9
    assert stats["salt/merged_steps"] == pytest.approx(9 / 21)
    # nodes: task 0 has 10 (the shared first step, T0/T1's second, T2's second, T3's three, four last steps),
    # task 1 has 5 (the shared first step, four last steps)
    assert stats["salt/distinct_steps"] == pytest.approx(15 / 21)
    # |A_it - A_i|: T0 and T1 2a/3 each, T2 4a/3 (first steps); task 1: 1.5 + 3 * 0.5 (first steps)
    assert stats["salt/adv_shift"] == pytest.approx((8 * a / 3 + sum(map(abs, TASK1))) / 21, abs=1e-6)
    assert stats["salt/turns_mean"] == pytest.approx(21 / 8)


def test_state_keys_merge_across_histories():
    adv, _ = ADVANTAGES.get("salt")(10, key="state")(make_input())
    a = A
    # (s1,2,s3) is taken by T0, T1 and, after another history, T3: (a + a - a) / 3
    expected = [
        [a / 3, a / 3, a],
        [a / 3, a / 3, a],
        [a / 3, -a, -a],
        [-a, -a, a / 3, -a],
        *[[0.0, TASK1[g]] for g in range(4)],
    ]
    assert torch.allclose(adv, paint(expected), atol=1e-5)


def test_rloo_base():
    adv, _ = ADVANTAGES.get("salt")(10, base="rloo", key="prefix")(make_input())
    # task 0: A = 1 - 1/3 = 2/3 or 0 - 2/3 = -2/3; task 1: [1, -1/3, -1/3, -1/3]
    b = 2 / 3
    expected = [
        [b / 3, b, b],
        [b / 3, b, b],
        [b / 3, -b, -b],
        [-b] * 4,
        [0.0, 1.0],  # the shared first step: (1 - 1/3 * 3) / 4 = 0, RLOO's mean is 0 too
        *[[0.0, -1 / 3]] * 3,
    ]
    assert torch.allclose(adv, paint(expected), atol=1e-6)


def test_pure_function_shared_unique_and_group_of_one():
    # three trajectories: step "x" shared by all, "y" by the first two, the rest unique
    keys = [["x", "y", "p"], ["x", "y", "q"], ["x", "r"]]
    adv, sizes = merged_step_advantages([1.0, 0.5, -1.5], keys)
    assert adv == [[0.0, 0.75, 1.0], [0.0, 0.75, 0.5], [0.0, -1.5]]  # x: 0/3; y: (1 + 0.5) / 2
    assert sizes == [[3, 2, 1], [3, 2, 1], [3, 1]]
    # a trajectory passing one node twice counts once in its mean
    adv, sizes = merged_step_advantages([1.0, -1.0], [["x", "x"], ["x"]])
    assert adv == [[0.0, 0.0], [0.0]] and sizes == [[2, 2], [2]]
    # a group of one: every step is its own, A = A_i
    adv, sizes = merged_step_advantages([0.7], [["x", "y", "z"]])
    assert adv == [[0.7, 0.7, 0.7]] and sizes == [[1, 1, 1]]
    with pytest.raises(ValueError, match="set rollout.n >= 2"):
        ADVANTAGES.get("salt")(10)(make_input([[1.0], [0.0]], [[("s0", 1)], [("s0", 1)]]))


def test_step_keys():
    row = turns([[("s0", 2), ("s1", 3), ("s2", 1)]])[0]
    assert step_keys(row, 5, "state") == [("s0", 2, "s1"), ("s1", 3, "s2"), ("last step of", 5)]
    assert step_keys(row, 5) == [
        (("s0", 2, "s1"),),
        (("s0", 2, "s1"), ("s1", 3, "s2")),
        (("s0", 2, "s1"), ("s1", 3, "s2"), ("last step of", 5)),
    ]
    assert step_keys([], 0) == []  # an episode that ended before its first action


def test_single_turn_fallback_is_grpo_and_rloo():
    torch.manual_seed(0)
    rewards = torch.rand(3, 4).round(decimals=1)
    rewards[1] = 0.5  # a group with equal rewards
    lengths = torch.tensor([5, 3, 1, 6, 0, 2, 4, 6, 6, 1, 2, 3])
    mask = (torch.arange(6)[None] < lengths[:, None]).float()  # [12, 6]
    inp = AdvantageInput(rewards, [7, 8, 9], -0.5 * mask, mask)
    for base in ("grpo", "rloo"):
        flat, _ = ADVANTAGES.get(base)(10)(inp)  # [12]
        adv, stats = ADVANTAGES.get("salt")(10, base=base)(inp)
        assert torch.equal(adv, flat[:, None] * mask), base
        assert stats["salt/merged_steps"] == 0 and stats["salt/adv_shift"] == 0


def test_options_state_and_registration():
    assert ADVANTAGES.get("salt") is SALT and "salt" in ADVANTAGES.names()
    est = ADVANTAGES.get("salt")(10, eps=1e-6)
    assert (est.base, est.key, est.min_group_size, est.needs_entropy) == ("grpo", "state", 2, False)
    assert est.state_dict() == {}
    with pytest.raises(ValueError, match="keeps no state"):
        est.load_state_dict({"nodes": {}})
    with pytest.raises(ValueError, match=r"base must be 'grpo' or 'rloo' \(algo.advantage_options.base\)"):
        ADVANTAGES.get("salt")(10, base="dr_grpo")
    with pytest.raises(ValueError, match=r"key must be 'prefix' or 'state'"):
        ADVANTAGES.get("salt")(10, key="history")
    cfg = [f"model.path={TINY}", "data.train=x.jsonl", "rewards=[{name: exact_match}]", "algo.advantage=salt"]
    check_components(load_config(None, [*cfg, "algo.advantage_options={base: rloo, key: state}"]))
    with pytest.raises(ConfigError, match="unknown option 'keys'; did you mean 'key'"):
        check_components(load_config(None, [*cfg, "algo.advantage_options={keys: state}"]))


def test_two_steps_on_the_multi_turn_test_env(tmp_path):
    """The parity env shows every episode of a task the same screens, so the prefix keys merge steps of equal
    length: the first steps of a group share a node whenever two trajectories typed as many tokens."""
    from mmrl.recipes.shapes.data import build

    build(tmp_path / "data", n_train=8, n_eval=4, seed=5)
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(
        f"""
model: {{path: {TINY}, min_pixels: 3136, max_pixels: 3136}}
data: {{train: data/train.jsonl}}
rollout: {{n: 4, max_new_tokens: 5, batch_size: 8, env: 'trainer_envs:ParityEnv',
  episode: {{env_options: {{steps: 2}}, max_turns: 2, env_workers: 1}}}}
algo: {{epochs: 1, mini_batches: 1, advantage: salt}}
optim: {{lr: 0.001, micro_batch_size: 8}}
train: {{prompts_per_step: 2, progress: false, seed: 3, save_every: 0}}
"""
    )
    out = tmp_path / "run"
    assert main(["train", str(cfg), "--output-dir", str(out), "--max-steps", "2"]) == 0
    rows = [r for r in read_metrics(out / "metrics.jsonl") if "loss" in r]
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        assert math.isfinite(r["loss"]) and r["salt/turns_mean"] == 2.0
        assert 0.0 <= r["salt/merged_steps"] <= 0.5  # last steps are never merged: half the steps at most


def test_recorded_action_keys_merge_on_the_action_itself():
    """Turns that carry their action's key (the episode driver's digest of its token ids) merge on (state, action):
    two actions of equal length in one state stay apart even when the next screens are equal, and equal last steps
    merge."""
    a = [Turn(0, 2, 0.0, "s0", "click-1"), Turn(2, 4, 0.0, "s1", "type-x")]
    b = [Turn(0, 2, 0.0, "s0", "click-2"), Turn(2, 4, 0.0, "s1", "type-x")]  # same length, same next screen
    c = [Turn(0, 2, 0.0, "s0", "click-1"), Turn(2, 4, 0.0, "s1", "type-x")]
    assert step_keys(a, 0, "state") == [("s0", "click-1"), ("s1", "type-x")]
    ka, kb, kc = (step_keys(r, i, "prefix") for i, r in enumerate((a, b, c)))
    assert ka[0] != kb[0] and ka == kc  # a and c took the same steps; b another first action
    # state keys: the last steps of all three are one node (same state, same action)
    adv, sizes = merged_step_advantages(
        [1.0, -1.0, 0.5], [step_keys(r, i, "state") for i, r in enumerate((a, b, c))]
    )
    assert adv[0] == [pytest.approx(0.75), pytest.approx(0.5 / 3)]  # first: a and c; last: all three
    assert adv[1] == [-1.0, pytest.approx(0.5 / 3)]
    assert sizes[0] == [2, 3] and sizes[1] == [1, 3]


def test_the_episode_driver_records_each_turns_action_key():
    from mmrl.model.prompt import EncodedPrompt
    from mmrl.rollout.base import Completion
    from mmrl.rollout.episodes import Trajectory
    from mmrl.types import Sample

    t = Trajectory.start("e", Sample("s", []), EncodedPrompt("s", torch.tensor([1])), "s0")
    t.add_completion(Completion([5, 6], "", [0.0, 0.0], "stop"))
    u = Trajectory.start("f", Sample("s", []), EncodedPrompt("s", torch.tensor([1])), "s0")
    u.add_completion(Completion([5, 7], "", [0.0, 0.0], "stop"))
    v = Trajectory.start("g", Sample("s", []), EncodedPrompt("s", torch.tensor([1])), "s0")
    v.add_completion(Completion([5, 6], "", [0.0, 0.0], "stop"))
    ka, kb, kc = (x.turns[0].action_key for x in (t, u, v))
    assert ka and ka == kc and ka != kb


def test_prefix_merging_leaves_the_on_policy_gradient_episode_grpos():
    """With ``key: prefix`` the trajectories of a node share its whole history and its action, so a policy gives
    their step tokens the same log-probs; averaging A over the node keeps its sum, and the on-policy token-mean
    gradient (ratio 1) equals episode-level GRPO's. ``key: state`` merges steps of different histories and moves it
    (docs/credit.md#salt; on gui_agent the logged losses of the two agree to 1e-6 until sampling first parts)."""
    inp = make_input()
    rows = turns()
    grpo = paint(
        [[A if r else -A for _ in row] for row, r in zip(PATHS[:4], REWARDS[0])] + [[v] * 2 for v in TASK1]
    )

    def gradient(adv: torch.Tensor) -> torch.Tensor:
        # one log-prob parameter per (task, history and action so far, token): what a policy can tell apart
        index: dict = {}
        ids = torch.zeros(len(rows), T, dtype=torch.long)
        for i, row in enumerate(rows):
            for turn, key in zip(row, step_keys(row, i % 4, "prefix")):
                for k in range(turn.start, turn.end):
                    ids[i, k] = index.setdefault((i // 4, key, k - turn.start), len(index) + 1)
        theta = torch.zeros(len(index) + 1, requires_grad=True)
        logp = theta[ids] * inp.mask
        (-(adv * logp).sum() / inp.mask.sum()).backward()
        return theta.grad

    prefix, _ = ADVANTAGES.get("salt")(10, key="prefix")(inp)
    state, _ = ADVANTAGES.get("salt")(10)(inp)  # the default
    assert not torch.allclose(prefix, grpo)  # the step advantages differ ...
    assert torch.allclose(gradient(prefix), gradient(grpo), atol=1e-6)  # ... the gradient does not
    assert not torch.allclose(gradient(state), gradient(grpo), atol=1e-3)
