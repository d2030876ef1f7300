"""The ``panel`` app (recipes/gui_agent/apps.py, the tiny gui_agent recipe's kind): tasks cued by colour and
position, not text. Its generator (fixed colours, layouts that move every tile per press, the oracle over states),
then through real Chromium: the oracle solves it with every click on its target, the tiles are large and drawn in
their colours, they move after a press, a wrong tile or an early Done cannot succeed, and the data builder writes
panel records and single-screen SFT demos. ``panel_cue`` (the tiny recipe's kind): the page marks the oracle's next
control on every screen, clicks through the mark reach it, and no mark is shown once the task cannot be met."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from mmrl.envs.browser import BrowserAppEnv, close_shared_browser
from mmrl.recipes.gui_agent.apps import BUILDERS, COLOURS, KINDS, TINY_KINDS, make_app
from mmrl.recipes.gui_agent.data import build, build_tiny_panel
from mmrl.types import Sample

W, H = 480, 360
SEEDS = range(10)


def _answer(action: dict) -> str:
    return f"<think>ok</think><answer>[{action!r}]</answer>"


def _rgb(hex_colour: str) -> tuple[int, int, int]:
    return tuple(int(hex_colour[i : i + 2], 16) for i in (1, 3, 5))


def _press(state: dict, target: str) -> dict:
    """What the page does on a click, for the generator tests (the browser tests check the page itself)."""
    data = json.loads(json.dumps(state["data"]))
    if not data["done"]:
        if target == "done":
            data["done"] = True
        else:
            data["pressed"].append(target.removeprefix("tile-"))
    return {**state, "data": data}


@pytest.fixture(scope="module", autouse=True)
def _close_the_shared_browser():
    """Later test modules start Playwright in this thread; one live sync instance per thread is all it allows."""
    yield
    close_shared_browser()


@pytest.fixture
def make_env(tmp_path: Path):
    if not Path("/usr/bin/chromium").exists():
        pytest.fail("/usr/bin/chromium is not installed: run bash scripts/setup.sh")
    envs: list[BrowserAppEnv] = []

    def make(seed: int, kind: str = "panel", **options) -> BrowserAppEnv:
        env = BrowserAppEnv(workdir=tmp_path / f"ep{len(envs)}", **options)
        envs.append(env)
        env.first = env.reset(Sample(id=f"panel-{seed}", messages=[], metadata={"app": kind, "seed": seed}))
        return env

    yield make
    for env in envs:
        env.close()


def _tiles(env: BrowserAppEnv) -> dict[str, dict]:
    """Each tile's page box and centre, by colour id."""
    return env.page.evaluate(
        "() => Object.fromEntries([...document.querySelectorAll('[data-ui^=\"tile-\"]')].map(e => {"
        " const r = e.getBoundingClientRect();"
        " return [e.dataset.ui.slice(5), {w: r.width, h: r.height, x: r.left + r.width / 2, y: r.top + r.height / 2}];"
        "}))"
    )


def _pixel(png: str, x: float, y: float) -> np.ndarray:
    with Image.open(png) as im:
        return np.asarray(im.convert("RGB"))[int(y), int(x)].astype(int)


# ------------------------------------------------------------------------------------------- no browser needed


def test_panel_is_a_tiny_kind_with_fixed_colours_and_moving_layouts():
    assert TINY_KINDS == ("panel_cue",) and "panel" not in KINDS and "panel" in BUILDERS
    seen = {"cols": set(), "n": set(), "seq": set(), "place": set()}
    for seed in range(200):
        app = make_app("panel", seed)
        assert (
            app.html == make_app("panel", seed).html
            and app.instruction == make_app("panel", seed).instruction
        )
        cfg = json.loads(app.html.split("id='cfg'>")[1].split("</script>")[0])
        ids = [t["id"] for t in cfg["tiles"]]
        assert all(t["rgb"] == COLOURS[t["id"]] for t in cfg["tiles"])  # a colour word is always one RGB
        n, slots = len(ids), 2 * cfg["cols"]
        assert 4 <= n <= min(6, slots) and len(cfg["layouts"]) == n + 1
        for before, after in zip(cfg["layouts"], cfg["layouts"][1:]):
            assert sorted(set(after)) == sorted(after) and all(0 <= s < slots for s in after)
            assert all(a != b for a, b in zip(before, after)), (seed, before, after)  # every tile moves
        seq = app.goal["pressed"]
        assert app.goal["done"] is True and len(set(seq)) == len(seq) and set(seq) <= set(ids)
        assert app.instruction.split(" ", 1)[1] == ", then ".join([*seq, "Done"]) + "."
        seen["cols"].add(cfg["cols"]), seen["n"].add(n), seen["seq"].add(len(seq))
        seen["place"].add(cfg["done_place"])
    assert seen == {
        "cols": {2, 3},
        "n": {4, 5, 6},
        "seq": {1, 2, 3},
        "place": {"bar", "flex-start", "center", "flex-end"},
    }
    assert len({make_app("panel", s).html.split("</style>")[0] for s in range(12)}) >= 6


def test_the_panel_oracle_follows_the_sequence_and_gives_up_when_it_cannot_be_met():
    for seed in range(50):
        app = make_app("panel", seed)
        seq, state, steps = app.goal["pressed"], app.initial, []
        while (step := app.oracle(state)) is not None:
            steps.append(step.target)
            state = _press(state, step.target)
        assert steps == [f"tile-{c}" for c in seq] + ["done"] and app.success(state)
        wrong = next(t for t in json.loads(app.html.split("id='cfg'>")[1].split("</script>")[0])["tiles"]
                     if t["id"] != seq[0])  # fmt: skip
        assert app.oracle(_press(app.initial, f"tile-{wrong['id']}")) is None
        early = _press(app.initial, "done")
        assert app.oracle(early) is None and not app.success(early)


def test_panel_cue_is_the_panel_with_its_task_sequence_for_the_page():
    for seed in range(50):
        app = make_app("panel_cue", seed)
        cfg = json.loads(app.html.split("id='cfg'>")[1].split("</script>")[0])
        assert cfg["cue"] == app.goal["pressed"] and cfg["kind"] == "panel_cue"
        assert "cue" not in json.loads(
            make_app("panel", seed).html.split("id='cfg'>")[1].split("</script>")[0]
        )


# ------------------------------------------------------------------------------------------------- Chromium

chromium = pytest.mark.chromium


@chromium
def test_the_oracle_solves_panel_tasks_on_large_tiles_drawn_in_their_colours(make_env):
    for seed in SEEDS:
        env = make_env(seed)
        screens, results, actions = [env.first.images[0]], [], []
        while True:
            tiles = _tiles(env)
            assert all(b["w"] >= 130 and b["h"] >= 105 for b in tiles.values()), (seed, tiles)
            for colour, b in tiles.items():  # the screenshot shows each tile's own colour at its centre
                assert np.abs(_pixel(screens[-1], b["x"], b["y"]) - _rgb(COLOURS[colour])).max() <= 3, (
                    seed,
                    colour,
                )
            actions.append(env.oracle_action())
            results.append(env.step(_answer(actions[-1])))
            if results[-1].done:
                break
            screens.append(results[-1].observation.images[0])
        assert 2 <= len(actions) <= 4 and len(actions) == len(env.app.goal["pressed"]) + 1
        assert [r.reward for r in results] == [0.0] * (len(results) - 1) + [1.0]
        assert all(r.info["target_hit"] and r.info["hit"] and r.info["valid"] for r in results), seed
        assert env.state["data"] == env.app.goal and env.oracle_action() is None


@chromium
def test_tiles_move_after_every_press(make_env):
    for seed in SEEDS:
        env = make_env(seed)
        before = _tiles(env)
        result = env.step(_answer(env.oracle_action()))
        assert not result.done
        after = _tiles(env)
        assert before.keys() == after.keys()
        for colour in before:  # every colour's centre is elsewhere on the new screen
            assert (before[colour]["x"], before[colour]["y"]) != (after[colour]["x"], after[colour]["y"])
        x, y = after[env.state["data"]["pressed"][0]]["x"], after[env.state["data"]["pressed"][0]]["y"]
        shot = result.observation.images[0]
        assert np.abs(_pixel(shot, x, y) - _rgb(COLOURS[env.state["data"]["pressed"][0]])).max() <= 3


@chromium
def test_a_wrong_tile_or_an_early_done_never_succeeds(make_env):
    for seed in (0, 1, 2):
        env = make_env(seed, max_steps=4)
        seq = env.app.goal["pressed"]
        wrong = next(c for c in _tiles(env) if c != seq[0])
        x, y = _tiles(env)[wrong]["x"], _tiles(env)[wrong]["y"]
        first = env.step(_answer({"action": "click", "coordinate": [x, y]}))
        assert not first.done and not first.info["target_hit"] and env.state["data"]["pressed"] == [wrong]
        assert env.oracle_action() is None  # the goal cannot be reached any more
        results = [first]
        for colour in seq:  # the right sequence afterwards does not repair it
            b = _tiles(env)[colour]
            results.append(env.step(_answer({"action": "click", "coordinate": [b["x"], b["y"]]})))
        while not results[-1].done:
            results.append(env.step(_answer({"action": "click", "coordinate": _centre_of_done(env)})))
        assert [r.reward for r in results] == [0.0] * len(results) and results[-1].info[
            "reason"
        ] == "max_steps"

        env = make_env(seed, max_steps=3)
        early = env.step(_answer({"action": "click", "coordinate": _centre_of_done(env)}))
        assert env.state["data"] == {"pressed": [], "done": True} and env.oracle_action() is None
        b = _tiles(env)[seq[0]]
        late = env.step(_answer({"action": "click", "coordinate": [b["x"], b["y"]]}))
        assert env.state["data"]["pressed"] == []  # Done locked the panel
        last = env.step(_answer({"action": "navigate_back"}))
        assert [r.reward for r in (early, late, last)] == [0.0] * 3 and last.info["reason"] == "max_steps"


def _cue(env: BrowserAppEnv) -> dict | None:
    """The marked control (its data-ui id) and the mark's centre, or None when the page shows no mark."""
    return env.page.evaluate(
        "() => { const m = document.querySelectorAll('.cue'); if (m.length !== 1) return m.length ? 'many' : null;"
        " const r = m[0].getBoundingClientRect();"
        " return {ui: m[0].closest('[data-ui]').dataset.ui, x: r.left + r.width / 2, y: r.top + r.height / 2}; }"
    )


@chromium
def test_panel_cue_marks_the_oracles_next_control_on_every_screen(make_env):
    for seed in SEEDS:
        env = make_env(seed, "panel_cue")
        shot, steps = env.first.images[0], 0
        while env.oracle_action() is not None:
            cue, target = _cue(env), env.app.oracle(env.state).target
            assert cue is not None and cue["ui"] == target, (seed, cue, target)
            # drawn: white at the mark's centre, its black ring 18 px out, on the marked control
            assert (_pixel(shot, cue["x"], cue["y"]) >= 250).all()
            assert (_pixel(shot, cue["x"] + 18, cue["y"]) <= 30).all()
            result = env.step(_answer({"action": "click", "coordinate": [cue["x"], cue["y"]]}))
            assert result.info["target_hit"] and result.info["hit"], seed  # the mark does not catch the click
            steps += 1
            if result.done:
                break
            shot = result.observation.images[0]
        assert result.reward == 1.0 and steps == len(env.app.goal["pressed"]) + 1
        # a wrong first press: the task cannot be met, and no mark is left to follow
        env = make_env(seed, "panel_cue", max_steps=4)
        wrong = next(c for c in _tiles(env) if c != env.app.goal["pressed"][0])
        b = _tiles(env)[wrong]
        env.step(_answer({"action": "click", "coordinate": [b["x"], b["y"]]}))
        assert env.oracle_action() is None and _cue(env) is None


def _centre_of_done(env: BrowserAppEnv) -> list[float]:
    return env.page.evaluate(
        "() => { const r = document.querySelector('[data-ui=\"done\"]').getBoundingClientRect();"
        " return [r.left + r.width / 2, r.top + r.height / 2]; }"
    )


@chromium
def test_build_tiny_panel_writes_panel_records_and_single_screen_demos(tmp_path):
    paths = build_tiny_panel(tmp_path / "d", n_train=3, n_eval=2, n_sft=3, seed=1)
    train = [json.loads(line) for line in paths["train"].read_text().splitlines()]
    assert len(train) == 3 and {r["metadata"]["app"] for r in train} == {"panel_cue"}
    assert all(r["metadata"]["viewport"] == [W, H] and r["prompt"].count("Done") == 1 for r in train)
    sft = [json.loads(line) for line in paths["sft"].read_text().splitlines()]
    episodes = {r["id"].rsplit("-s", 1)[0] for r in sft}
    assert len(episodes) == 3 and 6 <= len(sft) <= 12
    for rec in sft:
        x, y = rec["metadata"]["reference"]["coordinate"]
        assert (
            rec["answer"]
            == f"<think></think><answer>[{{'action': 'click', 'coordinate': [{x}, {y}]}}]</answer>"
        )
        assert (tmp_path / "d" / rec["images"][0]).exists()
    with pytest.raises(ValueError, match="unknown app kind"):
        build(tmp_path / "e", n_train=1, n_eval=0, n_sft=0, kinds=("panel", "spreadsheet"))


@pytest.mark.chromium
def test_step_reward_pays_each_oracle_step(tmp_path):
    """``step_reward``: an action that is the oracle's next one earns it on top of the outcome reward; others do not."""

    env = BrowserAppEnv(workdir=tmp_path / "e", max_steps=6, step_reward=0.25)
    try:
        env.reset(Sample(id="p", messages=[], metadata={"app": "panel", "seed": 2, "viewport": [480, 360]}))
        wrong = env.step(
            "<answer>[{'action': 'click', 'coordinate': [470, 355]}]</answer>"
        )  # a corner: no tile
        assert wrong.reward == 0.0 and wrong.info["target_hit"] is False
        rewards = []
        while True:
            r = env.step(env.oracle())
            rewards.append(r.reward)
            if r.done:
                break
        assert rewards[:-1] == [0.25] * (len(rewards) - 1) and rewards[-1] == 1.25
    finally:
        env.close()
        close_shared_browser()
