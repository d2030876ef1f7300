import logging
import os
from pathlib import Path

import pytest

from mmrl.rewards.base import (
    REWARDS,
    RewardSpec,
    call_reward,
    load_reward,
    load_reward_module,
    register_reward,
    validate_options,
)
from mmrl.rewards.compose import CompositeReward, RewardConfig
from mmrl.types import RewardInput, RewardResult

PLUGIN = Path(__file__).resolve().parent / "reward_plugin_example.py"


def _x(i, response, reference="x", **metadata):
    return RewardInput(id=f"s{i}", response=response, reference=reference, metadata=metadata)


def test_registry_has_builtins_and_rejects_duplicates():
    for name in [
        "format_think_answer",
        "math_verify",
        "mc_letter",
        "exact_match",
        "overlong_penalty",
        "gui_action",
    ]:
        assert name in REWARDS
    assert load_reward("pathology") is REWARDS.get("pathology")
    with pytest.raises(ValueError, match="already registered"):
        register_reward("exact_match")(lambda batch: [])
    with pytest.raises(KeyError, match="did you mean 'exact_match'.*path/to/file.py:function"):
        load_reward("exact_mach")


def test_unknown_option_names_reward_option_and_nearest():
    with pytest.raises(ValueError) as e:
        CompositeReward([RewardConfig("gui_action", options={"point_radis": 10})])
    assert str(e.value) == (
        "reward 'gui_action': unknown option 'point_radis'; did you mean 'point_radius'? "
        "(valid options: point_radius, scheme, text_f1_threshold)"
    )
    spec = load_reward("format_think_answer")
    with pytest.raises(ValueError, match="option 'require_think' expects true or false"):
        validate_options(spec, {"require_think": "yes"})
    with pytest.raises(ValueError, match=r"option 'scheme' must be one of \['ui_r1', 'gui_r1'\]"):
        validate_options(load_reward("gui_action"), {"scheme": "uir1"})
    assert validate_options(load_reward("overlong_penalty"), {"max_length": 100, "buffer": 20}) == {
        "max_length": 100,
        "buffer": 20,
    }


def test_load_from_file_plain_and_decorated():
    plain = load_reward(f"{PLUGIN}:plain_length")
    assert (plain.name, plain.heavy) == ("plain_length", False)
    out = plain.fn([_x(0, "three short words")], scale=2.0)
    assert out[0].score == 6.0
    heavy = load_reward(f"{PLUGIN}:sleepy")
    assert heavy is REWARDS.get("plugin_sleepy") and heavy.heavy
    with pytest.raises(KeyError, match="no function 'nope'.*plain_length"):
        load_reward(f"{PLUGIN}:nope")
    with pytest.raises(FileNotFoundError, match="reward file not found"):
        load_reward("/no/such/file.py:fn")
    with pytest.raises(TypeError, match="parameter 'scale' must be keyword-only with a default"):
        validate_options(load_reward(f"{PLUGIN}:positional_option"), {})


def test_composite_weights_and_does_not_apply():
    configs = [
        RewardConfig("format_think_answer", weight=1.0),
        RewardConfig("exact_match", weight=3.0),
        RewardConfig("plugin_when_reference", weight=2.0),
    ]
    batch = [
        _x(0, "<think>t</think><answer>Paris</answer>", "paris"),  # format 1, em 1, when_ref 0.5
        _x(1, "<answer>Rome</answer>", "paris"),  # format 0, em 0, when_ref 0.5
        _x(2, "<think>t</think><answer>Rome</answer>", None),  # format 1; em and when_ref do not apply
    ]
    with CompositeReward(configs) as comp:
        out = comp(batch)
    assert out[0].score == pytest.approx((1.0 * 1 + 3.0 * 1 + 2.0 * 0.5) / 6.0)
    assert out[0].parts == {"format_think_answer": 1.0, "exact_match": 1.0, "plugin_when_reference": 0.5}
    assert out[1].score == pytest.approx((1.0 * 0 + 3.0 * 0 + 2.0 * 0.5) / 6.0)
    assert (out[2].score, out[2].parts, out[2].applied) == (1.0, {"format_think_answer": 1.0}, True)

    with CompositeReward([RewardConfig("plugin_when_reference")]) as comp:
        none_applies = comp([_x(2, "anything", None)])[0]
    assert (none_applies.score, none_applies.applied, none_applies.parts) == (0.0, False, {})


def test_raising_reward_scores_zero_and_is_logged_with_sample_id(caplog):
    configs = [RewardConfig("plugin_flaky", weight=1.0), RewardConfig("exact_match", weight=1.0)]
    batch = [_x(0, "x"), _x(1, "boom"), _x(2, "y")]
    with caplog.at_level(logging.WARNING, logger="mmrl.rewards"), CompositeReward(configs) as comp:
        out = comp(batch)
    assert [r.parts.get("plugin_flaky") for r in out] == [1.0, 0.0, 1.0]
    assert out[0].parts["plugin_flaky/seen"] == 1.0 and "plugin_flaky/seen" not in out[1].parts
    assert [r.score for r in out] == [1.0, 0.0, 0.5]
    assert out[1].errors[0]["id"] == "s1" and out[1].errors[0]["reward"] == "plugin_flaky"
    assert "ValueError: cannot score 'boom'" in out[1].errors[0]["error"]
    assert out[0].errors == [] and comp.stats()["errors"] == {"plugin_flaky": 1}
    assert any("'s1'" in rec.getMessage() and "plugin_flaky" in rec.getMessage() for rec in caplog.records)


def test_call_reward_checks_result_count():
    spec = RewardSpec(name="short", fn=lambda batch: [RewardResult(score=1.0)])
    out = call_reward(spec.fn, spec.name, [_x(0, "a"), _x(1, "b")], {})
    # The batch call returned 1 result for 2 inputs; retried alone, each item returns exactly one result.
    assert [r.score for r in out] == [1.0, 1.0]
    bad = call_reward(lambda batch: [], "empty", [_x(0, "a")], {})
    assert bad[0].score == 0.0 and "returned 0 results for 1 inputs" in bad[0].error


def test_cache_hits_counted_and_duplicates_computed_once():
    module = load_reward_module(PLUGIN)
    module.SCORED.clear()
    batch = [_x(0, "aa"), _x(1, "aa"), _x(2, "bbb"), _x(3, "aa", reference="other")]
    with CompositeReward([RewardConfig(f"{PLUGIN}:counted_length")]) as comp:
        first = comp(batch)
        second = comp(batch)
        stats = comp.stats()
    assert [r.score for r in first] == [2.0, 2.0, 3.0, 2.0] == [r.score for r in second]
    assert module.SCORED == ["s0", "s2", "s3"]  # s1 repeats s0 (same response and reference)
    assert stats["cache_misses"] == 3 and stats["cache_hits"] == 1 + 4 and stats["cache_size"] == 3


def test_pool_timeout_crash_and_rebuild(caplog):
    """A hung item scores 0 with "timeout", a crashing item 0 with "worker process died"; the rest score."""
    batch = [_x(0, "a"), _x(1, "hang"), _x(2, "bb"), _x(3, "crash"), _x(4, "dddd")]
    cfg = RewardConfig(f"{PLUGIN}:sleepy", options={"seconds": 60.0})
    with caplog.at_level(logging.WARNING, logger="mmrl.rewards"):
        with CompositeReward([cfg], num_workers=2, timeout_s=8.0, chunk_size=2) as comp:
            assert comp([_x(9, "warm")])[0].score == 4.0  # starts the workers before deadlines matter
            out = comp(batch)
            again = comp([_x(5, "eeeee")])
            stats = comp.stats()
    assert [r.score for r in out] == [1.0, 0.0, 2.0, 0.0, 4.0]
    assert out[1].errors == [{"id": "s1", "reward": "plugin_sleepy", "error": "timeout"}]
    assert "worker process died" in out[3].errors[0]["error"]
    assert again[0].score == 5.0 and again[0].parts["plugin_sleepy/pid"] != os.getpid()
    assert stats["timeouts"] == 1 and stats["pool_restarts"] >= 2
    assert stats["errors"] == {"plugin_sleepy": 2}
