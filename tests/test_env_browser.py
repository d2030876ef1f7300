"""The browser GUI world (mmrl/envs/browser.py, recipes/gui_agent/): the app generator's determinism, the action
grammar, every app kind solved by its oracle through real Chromium with success judged from the page's state, wrong
sequences failing, exact click mapping per coordinate frame, state keys, hostile typed text kept offline and away
from files, garbage actions, a pool of parallel episodes with a worker restart and replay, and the data builder's
first screenshots equal to the env's."""

from __future__ import annotations

import json
import os
import secrets
import signal
from pathlib import Path

import pytest

from mmrl.envs import EnvPool
from mmrl.envs.browser import BrowserAppEnv, Invalid, close_shared_browser, parse_action, shared_browser
from mmrl.processors.geometry import original_to_frame
from mmrl.recipes.gui_agent.apps import KINDS, make_app
from mmrl.recipes.gui_agent.data import build
from mmrl.types import Sample

W, H = 480, 360
MODEL = (308, 224)  # a model-input size of another aspect than the 4:3 screen: x and y scale differently


def _sample(kind: str, seed: int, frame: str | None = None, **meta) -> Sample:
    if frame is not None:
        meta |= {"coordinate_frame": frame, "image_sizes": [[W, H]], "model_image_sizes": [list(MODEL)]}
    return Sample(id=f"{kind}-{seed}", messages=[], metadata={"app": kind, "seed": seed, **meta})


def _answer(action: dict) -> str:
    return f"<think>ok</think><answer>[{action!r}]</answer>"


def _click(x: float, y: float) -> str:
    return _answer({"action": "click", "coordinate": [x, y]})


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

    def make(kind: str, seed: int, frame: str | None = None, **options) -> BrowserAppEnv:
        env = BrowserAppEnv(workdir=tmp_path / f"ep{len(envs)}", **options)
        envs.append(env)
        env.first = env.reset(_sample(kind, seed, frame))
        return env

    yield make
    for env in envs:
        env.close()


def _oracle_run(env: BrowserAppEnv) -> tuple[list[dict], list]:
    actions, results = [], []
    while True:
        action = env.oracle_action()
        assert action is not None, (env.app.task, env.state)
        actions.append(action)
        results.append(env.step(_answer(action)))
        if results[-1].done:
            return actions, results


def _centre(env: BrowserAppEnv, ui: str) -> tuple[float, float, dict]:
    box = env.page.evaluate(
        "(id) => { const r = document.querySelector(`[data-ui='${id}']`).getBoundingClientRect();"
        " return {x1: r.left, y1: r.top, x2: r.right, y2: r.bottom}; }",
        ui,
    )
    return (box["x1"] + box["x2"]) / 2, (box["y1"] + box["y2"]) / 2, box


# ------------------------------------------------------------------------------------------- no browser needed


def test_generator_is_deterministic_and_self_contained():
    for kind in KINDS:
        a, b = make_app(kind, 3), make_app(kind, 3)
        assert (a.html, a.instruction, a.goal, a.initial) == (b.html, b.instruction, b.goal, b.initial)
        assert a.html != make_app(kind, 4).html  # the layout and content vary with the seed
        assert a.oracle(a.initial) == b.oracle(b.initial) is not None
        assert not a.success(a.initial)
        for needle in ("http:", "https:", "src=", "href=", "url(", "@import"):
            assert needle not in a.html, (kind, needle)
    styles = {make_app("settings", s).html.split("</style>")[0] for s in range(12)}
    assert len(styles) >= 8
    with pytest.raises(ValueError, match="unknown app kind"):
        make_app("spreadsheet", 0)


@pytest.mark.parametrize(
    "text, expected",
    [
        (
            "<think>x</think><answer>[{'action': 'click', 'coordinate': [10, 20]}]</answer>",
            ("click", (10, 20), None),
        ),
        ('<answer>{"action": "tap", "point": [1.5, 2]}</answer>', ("click", (1.5, 2), None)),
        (
            "<answer>[{'action': 'click', 'coordinate': [1, 2]}, {'action': 'navigate_back'}]</answer>",
            ("click", (1, 2), None),
        ),
        ("<answer>[{'action': 'input_text', 'input_text': 'hi'}]", ("input_text", None, "hi")),
        (
            "<answer>[{'action': 'type', 'text': 'a', 'coordinate': [3, 4]}]</answer>",
            ("input_text", (3, 4), "a"),
        ),
        ("<answer>[{'action': 'scroll', 'direction': 'Down'}]</answer>", ("scroll", None, "down")),
        ("<answer>[{'action': 'scroll', 'input_text': 'up'}]</answer>", ("scroll", None, "up")),
        ("<answer>[{'action': 'navigate_back'}]</answer>", ("back", None, None)),
        ("[{'action': 'back'}]", ("back", None, None)),
        (
            "<answer>[{'action': 'back'}]</answer> <answer>[{'action': 'click', 'coordinate': [1, 1]}]</answer>",
            ("back", None, None),
        ),
    ],
)
def test_parse_action(text, expected):
    a = parse_action(text)
    assert (a.kind, a.point, a.text) == expected


GARBAGE = [
    "",
    "I will click the button.",
    "<answer>",
    "<answer>[]</answer>",
    "<answer>[1, 2]</answer>",
    "<answer>[{'action': 'fly'}]</answer>",
    "<answer>[{'action': 'open_app', 'text': 'Mail'}]</answer>",
    "<answer>[{'action': 'click'}]</answer>",
    "<answer>[{'action': 'click', 'coordinate': ['a', 5]}]</answer>",
    "<answer>[{'action': 'click', 'coordinate': [NaN, 5]}]</answer>",
    "<answer>[{'action': 'click', 'coordinate': [True, 5]}]</answer>",
    "<answer>[{'action': 'scroll', 'direction': 'left'}]</answer>",
    "<answer>[{'action': 'input_text'}]</answer>",
    "<answer>" + "[" * 3000 + "</answer>",
    "<answer>" + "1" * 5000 + "</answer>",
    "\x00\x01<answer>\udcff</answer>",
]


@pytest.mark.parametrize("text", GARBAGE)
def test_garbage_is_invalid_with_a_reason(text):
    with pytest.raises(Invalid):
        parse_action(text)


# ------------------------------------------------------------------------------------------------- Chromium

chromium = pytest.mark.chromium


@chromium
@pytest.mark.parametrize("kind", KINDS)
def test_the_oracle_solves_every_kind_through_the_browser(make_env, kind):
    for seed in range(3):
        env = make_env(kind, seed)
        assert env.first.images and Path(env.first.images[0]).read_bytes()[:4] == b"\x89PNG"
        actions, results = _oracle_run(env)
        assert 2 <= len(actions) <= 6, (kind, seed, env.app.task, actions)
        assert [r.reward for r in results] == [0.0] * (len(results) - 1) + [1.0]
        assert results[-1].info["success"] and results[-1].info["reason"] == "success"
        assert all(r.info["target_hit"] and r.info["valid"] for r in results)
        assert all(r.info["hit"] for r, a in zip(results, actions) if "coordinate" in a)
        assert env.app.success(env.state) and env.state["data"] == env.app.goal  # judged from the DOM's state
        assert all(len(Path(r.observation.images[0]).read_bytes()) > 1000 for r in results[:-1])


@chromium
@pytest.mark.parametrize("kind", KINDS)
def test_a_wrong_sequence_does_not_succeed(make_env, kind):
    """The oracle's actions but the last, then back and scrolls until max_steps: never a success."""
    plan, _ = _oracle_run(make_env(kind, 1))
    env = make_env(kind, 1, max_steps=len(plan) + 2)
    for action in plan[:-1]:
        assert not env.step(_answer(action)).done
    wrong = [env.step(_answer({"action": a})) for a in ("navigate_back", "navigate_back")]
    last = env.step(_answer({"action": "scroll", "direction": "up"}))
    assert (
        [r.reward for r in [*wrong, last]] == [0.0] * 3 and last.done and last.info["reason"] == "max_steps"
    )
    assert not env.app.success(env.state)


@chromium
def test_a_wrong_order_in_the_shop_cannot_be_undone(make_env):
    env = make_env("shop", 1)  # "Add three Eggs to the basket and check out"
    assert env.app.task == "one"
    product = next(iter(env.app.goal["orders"][0]))
    assert not env.step(_click(*_centre(env, f"inc-{product}")[:2])).done
    assert not env.step(_click(*_centre(env, "cart")[:2])).done
    result = env.step(_click(*_centre(env, "checkout")[:2]))  # one, not three
    assert not result.done and not result.info["success"] and env.state["data"]["orders"] == [{product: 1}]
    assert env.oracle_action() is None


@chromium
@pytest.mark.parametrize("seed", [3, 4])
def test_unreachable_end_stops_at_the_action_that_lost_the_task(make_env, seed):
    """A wrong tile on a panel cannot be taken back: with ``unreachable: end`` that press ends the episode with 0 and
    reason ``unreachable``; by default the episode goes on; a right press, and Done too early, behave likewise."""
    tiles = make_env("panel_cue", seed).page.evaluate(
        "() => [...document.querySelectorAll(\"[data-ui^='tile-']\")].map(e => e.dataset.ui)"
    )
    strict, lenient = (make_env("panel_cue", seed, unreachable=u, max_steps=8) for u in ("end", "continue"))
    right = strict.app.oracle(strict.state).target
    wrong = next(t for t in tiles if t != right)
    first = strict.step(_click(*_centre(strict, right)[:2]))
    assert not first.done and first.info["target_hit"] and first.reward == 0.0
    lost = strict.step(_click(*_centre(strict, wrong)[:2]))
    assert lost.done and lost.observation is None and lost.reward == 0.0
    assert (
        lost.info["reason"] == "unreachable"
        and not lost.info["target_hit"]
        and strict.oracle_action() is None
    )
    go_on = lenient.step(_click(*_centre(lenient, wrong)[:2]))
    assert not go_on.done and lenient.oracle_action() is None
    fresh = make_env("panel_cue", seed, unreachable="end")
    early = fresh.step(_click(*_centre(fresh, "done")[:2]))
    assert early.done and early.info["reason"] == "unreachable"
    plan, results = _oracle_run(make_env("panel_cue", seed, unreachable="end"))
    assert results[-1].info["reason"] == "success" and len(plan) == len(results)
    with pytest.raises(ValueError, match="option 'unreachable' must be 'continue' or 'end'"):
        BrowserAppEnv.check_options({"unreachable": "stop"})


@chromium
@pytest.mark.parametrize("frame", ["model_pixels", "relative_1000", "original_pixels"])
def test_clicks_map_exactly_from_each_frame(make_env, frame):
    env = make_env("settings", 4, frame)  # "In Privacy settings, turn off Ad tracking and turn on Location"
    section = next(s for s in env.app.goal if len(env.app.goal[s]) >= 2)
    x, y, _ = _centre(env, f"nav-{section}")
    env.step(_click(*original_to_frame(x, y, frame, (W, H), MODEL)))
    assert env.state["page"] == section
    keys = [k for k, v in env.state["data"][section].items() if isinstance(v, bool)]
    for key in keys[:2]:
        x, y, box = _centre(env, f"t-{section}-{key}")
        before = json.loads(json.dumps(env.state["data"]))
        fx, fy = original_to_frame(x, y, frame, (W, H), MODEL)
        assert env._to_page((fx, fy)) == pytest.approx((x, y), abs=1e-9)  # the inverse map, exactly
        env.step(_click(round(fx), round(fy)))  # as a model writes it: whole numbers in its frame
        before[section][key] = not before[section][key]
        assert env.state["data"] == before, "the click toggled something else"
        # 1 px inside the element's right edge toggles it back; 1 px outside it does nothing
        inside = original_to_frame(box["x2"] - 1, y, frame, (W, H), MODEL)
        env.step(_click(*inside))
        before[section][key] = not before[section][key]
        assert env.state["data"] == before
        outside = original_to_frame(box["x2"] + 1, y, frame, (W, H), MODEL)
        result = env.step(_click(*outside))
        assert env.state["data"] == before and result.info["hit"] is False


@chromium
@pytest.mark.parametrize("frame", ["model_pixels", "relative_1", "original_pixels"])
def test_the_oracle_writes_its_actions_in_the_models_frame_and_solves_the_task(make_env, frame):
    """The oracle's text, parsed by the env and mapped back from the model's frame, hits every target and solves
    the task; ``info["point"]`` is the page pixel each pointing action landed on (within the frame's rounding)."""
    for kind, seed in [("form", 0), ("settings", 4), ("mail", 2)]:
        env = make_env(kind, seed, frame)
        while True:
            page = env.oracle_action()
            text = env.oracle()
            assert text.startswith("<think></think><answer>[{'action': ") and text.endswith("}]</answer>")
            result = env.step(text)
            assert result.info["target_hit"] and result.info["valid"], (kind, seed, text, result.info)
            if "coordinate" in page:
                unit = (W / MODEL[0], H / MODEL[1]) if frame == "model_pixels" else (W / 1000, H / 1000)
                unit = (0, 0) if frame == "original_pixels" else unit
                assert all(
                    abs(a - b) <= u / 2 + 1e-6
                    for a, b, u in zip(result.info["point"], page["coordinate"], unit)
                ), (result.info["point"], page)
            else:
                assert result.info["point"] is None
            if result.done:
                assert result.reward == 1.0 and env.oracle_action() is None
                break


@chromium
def test_state_keys_follow_the_state_not_the_path(make_env):
    envs = [make_env("settings", 4) for _ in range(3)]
    section = next(s for s in envs[0].app.goal if len(envs[0].app.goal[s]) >= 2)
    a, b = [k for k, v in envs[0].state["data"][section].items() if isinstance(v, bool)][:2]

    def click(env, ui):
        return env.step(_click(*_centre(env, ui)[:2]))

    click(envs[0], f"nav-{section}")
    envs[0].step(_answer({"action": "navigate_back"}))  # a detour
    for ui in (f"nav-{section}", f"t-{section}-{a}", f"t-{section}-{b}"):
        click(envs[0], ui)
    for ui in (f"nav-{section}", f"t-{section}-{b}", f"t-{section}-{a}"):
        click(envs[1], ui)
    for ui in (f"nav-{section}", f"t-{section}-{a}"):
        click(envs[2], ui)
    assert envs[0].state == envs[1].state and envs[0].state_key == envs[1].state_key
    assert envs[2].state_key != envs[0].state_key
    key = envs[2].state_key
    result = envs[2].step("<answer>nonsense</answer>")
    assert result.info["invalid"] and result.observation.state_key == key and result.observation.images == []
    assert make_env("settings", 5).first.state_key != make_env("settings", 4).first.state_key


@chromium
def test_typed_hostile_text_stays_text_offline_and_reads_no_file(make_env, server, tmp_path):
    address, hits = server
    secret = "CANARY" + secrets.token_hex(8)
    canary = tmp_path / "canary.html"
    canary.write_text(f"<p>{secret}</p>")
    env = make_env("form", 1, max_text_chars=200, max_steps=12)  # three text fields
    keys = [
        f["key"]
        for f in json.loads(env.page.evaluate("document.getElementById('cfg').textContent"))["fields"]
    ]
    hostile = [
        f"<img src=x onerror=\"window.__pwned=1;fetch('http://{address}/img')\">",
        f"<script>window.__pwned=2;fetch('http://{address}/script')</script>",
        f"file://{canary}",
    ]
    env.step(_click(*_centre(env, "open")[:2]))
    for key, text in zip(keys, hostile):
        x, y, _ = _centre(env, f"f-{key}")
        result = env.step(_answer({"action": "input_text", "coordinate": [x, y], "input_text": text + "\n"}))
        assert result.info["valid"] and env.state["ui"]["draft"][key] == text  # the newline was dropped
    env.step(_click(*_centre(env, "submit")[:2]))
    entry = env.state["data"]["submitted"][0]
    assert [entry[k] for k in keys] == hostile[: len(keys)]
    shown = env.page.evaluate("document.body.innerText")
    assert all(text in shown for text in hostile[: len(keys)])  # shown as text, never parsed as markup
    assert env.page.evaluate("window.__pwned") is None
    assert env.page.evaluate("document.querySelectorAll('img').length") == 0
    assert env.page.evaluate("document.scripts.length") == 3  # the app's own: state, config, code
    x, y = env.page.evaluate(
        "(t) => { const e = [...document.querySelectorAll('.grow')].find(e => e.textContent.includes(t));"
        " const r = e.getBoundingClientRect(); return [r.left + 20, r.top + r.height / 2]; }",
        "file://",
    )
    env.step(_click(x, y))  # a click on the typed "link" loads nothing
    assert env.page.url == "about:blank" and secret not in env.page.content()
    blocked = env.blocked_requests
    # positive control: a request the page itself makes is aborted by the route and counted, and never arrives
    env.page.evaluate(f"fetch('http://{address}/control').catch(() => 0)")
    env.page.evaluate(
        f"fetch('file://{canary}').then(r => r.text()).then(t => window.__read = t).catch(() => 0)"
    )
    env._settle()
    env.page.wait_for_timeout(200)
    assert env.blocked_requests > blocked and env.page.evaluate("window.__read") is None
    assert hits == [], f"requests reached the server: {hits}"
    assert canary.read_text() == f"<p>{secret}</p>"


@chromium
def test_garbage_actions_are_invalid_and_never_raise(make_env):
    env = make_env("mail", 2, "relative_1000", max_steps=len(GARBAGE) + 3)
    key = env.first.state_key
    for text in [*GARBAGE, None, 12, "<answer>[{'action': 'click', 'coordinate': [1001, 5]}]</answer>"]:
        result = env.step(text)
        assert result.info["invalid"] and not result.info["valid"] and result.reward == 0.0, text
        if result.done:
            assert result.info["reason"] == "max_steps"
            break
        assert result.observation.text.startswith("invalid action:") and result.observation.state_key == key
    assert result.done
    nothing = make_env("mail", 2).step(_answer({"action": "input_text", "input_text": "hello"}))
    assert nothing.info["valid"] and "Nothing was typed" in nothing.observation.text
    # invalid: end (a strict action API): the first malformed action ends the episode with nothing
    strict = make_env("mail", 2, invalid="end", max_steps=8).step(GARBAGE[0])
    assert strict.done and strict.reward == 0.0 and strict.observation is None
    assert strict.info["invalid"] and strict.info["reason"] == "invalid"
    with pytest.raises(ValueError, match="option 'invalid' must be 'retry' or 'end'"):
        BrowserAppEnv.check_options({"invalid": "skip"})


@chromium
def test_episodes_run_in_parallel_in_a_pool_and_replay_after_a_restart(tmp_path, make_env):
    apps = [("settings", 2), ("shop", 2), ("mail", 0), ("list", 1)]
    plans, keys = {}, {}
    for kind, seed in apps:  # the oracle's actions and the states they reach, in this process
        env = make_env(kind, seed)
        keys[kind] = [env.first.state_key]
        plans[kind], results = _oracle_run(env)
        keys[kind] += [r.observation.state_key for r in results[:-1]]
    with EnvPool(tmp_path / "pool", workers=2, timeout_s=60) as pool:
        starts = pool.reset([(kind, "browser_app", {}, _sample(kind, seed)) for kind, seed in apps])
        assert [s.observation.state_key for s in starts] == [keys[k][0] for k, _ in apps]
        rewards: dict[str, float] = {}
        for i in range(max(len(p) for p in plans.values())):
            if i == 2:  # kill a worker between steps: its episodes are rebuilt by replaying their actions
                os.kill(pool._procs[0].proc.pid, signal.SIGKILL)
                pool._procs[0].proc.join(timeout=10)
            out = pool.step(
                {k: _answer(plans[k][i]) for k in plans if i < len(plans[k]) and k not in rewards}
            )
            for kind, result in out.items():
                assert "error" not in result.info, result.info
                if result.done:
                    rewards[kind] = result.reward
                else:
                    assert result.observation.state_key == keys[kind][i + 1]
        assert rewards == {kind: 1.0 for kind, _ in apps}
        stats = pool.stats()
        assert (
            stats["restarts"] == 1 and stats["replays"] >= 1 and stats["lost"] == 0 and stats["failed"] == 0
        )


@chromium
def test_the_builder_is_deterministic_and_its_first_images_are_the_envs(tmp_path):
    a = build(tmp_path / "a", n_train=5, n_eval=1, n_sft=2, seed=3)
    b = build(tmp_path / "b", n_train=5, n_eval=1, n_sft=2, seed=3)
    for split in ("train", "eval", "sft"):
        assert a[split].read_text() == b[split].read_text()
    images = sorted((tmp_path / "a/images").iterdir())
    assert [p.read_bytes() for p in images] == [(tmp_path / "b/images" / p.name).read_bytes() for p in images]
    train = [json.loads(line) for line in a["train"].read_text().splitlines()]
    assert [r["metadata"]["app"] for r in train] == list(KINDS)
    sft = [json.loads(line) for line in a["sft"].read_text().splitlines()]
    assert {r["metadata"]["app"] for r in sft} == {"settings", "form"} and 4 <= len(sft) <= 12
    assert all(r["answer"].startswith("<think></think><answer>[{'action': ") for r in sft)
    rec = train[1]
    sample = Sample(
        id=rec["id"], messages=[], images=[str(tmp_path / "a" / rec["images"][0])], metadata=rec["metadata"]
    )
    env = BrowserAppEnv(workdir=tmp_path / "ep")
    try:
        first = env.reset(sample)  # checks its live screen against the record's image
        assert first.images == [] and first.text == ""
        assert (tmp_path / "ep/step-00.png").read_bytes() == Path(sample.images[0]).read_bytes()
    finally:
        env.close()
    other = tmp_path / "a" / train[0]["images"][0]
    bad_image = Sample(id="x", messages=[], images=[str(other)], metadata=rec["metadata"])
    bad_task = Sample(id="y", messages=[], metadata=rec["metadata"] | {"instruction": "Do something else."})
    for i, sample in enumerate((bad_image, bad_task)):
        env = BrowserAppEnv(workdir=tmp_path / f"bad{i}")
        with pytest.raises(ValueError, match="rebuild the data"):
            env.reset(sample)
        env.close()


@chromium
def test_the_browser_is_shared_and_released_pages_are_reused_clean(make_env):
    """A finished episode's page goes back to the free list at ``about:blank`` (none of its app's globals, in a
    viewport the next episode re-sizes), the next episode takes it, and its screens and state are exactly a fresh
    page's; past ``keep`` free pages, released contexts are closed."""
    close_shared_browser()  # a new browser: no page yet that earlier tests released
    browser = shared_browser()
    fresh = make_env("mail", 4)
    assert not browser._free
    fresh_png, fresh_key = Path(fresh.first.images[0]).read_bytes(), fresh.first.state_key
    fresh_next = fresh.step(_answer(fresh.oracle_action()))
    other = BrowserAppEnv(workdir=fresh.workdir.parent / "other")  # another live episode, another viewport
    other.reset(_sample("settings", 7, viewport=[412, 600]))
    assert other.page.viewport_size == {"width": 412, "height": 600}
    contexts = len(browser._browser.contexts)
    page = fresh.page
    fresh.close()
    assert browser._free[-1][1] is page and page.url == "about:blank"
    assert (
        page.evaluate("() => typeof window.__state") == "undefined"
        and len(browser._browser.contexts) == contexts
    )
    reused = make_env("mail", 4)
    assert reused.page is page and shared_browser() is browser and len(browser._browser.contexts) == contexts
    assert Path(reused.first.images[0]).read_bytes() == fresh_png and reused.first.state_key == fresh_key
    again = reused.step(_answer(reused.oracle_action()))
    assert again.observation.state_key == fresh_next.observation.state_key
    assert (
        Path(again.observation.images[0]).read_bytes() == Path(fresh_next.observation.images[0]).read_bytes()
    )
    keep, browser.keep = browser.keep, len(browser._free)
    try:
        reused.close()  # the free list is full: this context is closed, not kept
        assert len(browser._browser.contexts) == contexts - 1 and page.is_closed()
    finally:
        browser.keep = keep
    other_page = other.page
    other.close()
    resized = make_env("mail", 4)  # takes the 412x600 page, sized back to the sample's viewport
    assert resized.page is other_page and other_page.viewport_size == {"width": W, "height": H}
    assert Path(resized.first.images[0]).read_bytes() == fresh_png
