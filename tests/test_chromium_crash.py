"""Chromium crashing on purpose mid-use, against every Chromium user (rewards/html_sandbox.py's retry_crashes): the
HTML renderer behind the rendering rewards, the gui data builder (recipes/gui/data.py) and the ``browser_app`` env
(mmrl/envs/browser.py) with the gui_agent builder on top of it.

A crash is made where the incident happened, in ``Page.screenshot``: before the armed calls, the page is sent to
``chrome://crash`` (its renderer dies) or the browser's main process is SIGKILLed; the real screenshot then raises
Playwright's own error. Each user retries the item on a new page (a new browser when it died) and produces what a
run without the crash produces; ``1 + crash_retries`` crashes in a row fail that item alone, with a reason naming
the crash; a timeout on hostile HTML is not retried.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

import psutil
import pytest

from mmrl.envs import EnvPool
from mmrl.envs.browser import BrowserAppEnv, close_shared_browser
from mmrl.recipes.gui import data as gui_data
from mmrl.recipes.gui_agent.data import build as build_agent_data
from mmrl.rewards.html_sandbox import ChromiumCrash, HtmlRenderer, LeftOut, crash_reason
from mmrl.types import Sample


def _crash_renderer(page) -> None:
    try:
        page.goto("chrome://crash", timeout=5000)
    except (
        Exception
    ):  # the navigation itself reports the crash (or an abort); the next call on the page fails
        pass


def _kill_browser() -> None:
    """SIGKILL this process's Chromium main process (the Playwright driver's child without a ``--type``)."""
    mains = []
    for p in psutil.Process().children(recursive=True):
        try:
            if "chrom" in p.name().lower() and not any(a.startswith("--type=") for a in p.cmdline()):
                mains.append(p)
        except psutil.NoSuchProcess:
            pass
    assert mains, "no Chromium main process to kill"
    for p in mains:
        p.kill()
    psutil.wait_procs(mains, timeout=5)


@pytest.fixture
def crash_at(monkeypatch):
    """``crash_at(how, calls, when=None)``: ``Page.screenshot`` first crashes Chromium (``how``: ``renderer`` or
    ``browser``) on its ``calls``-th calls (1-based; only pages for which ``when(page)`` holds are counted);
    returns the list of calls made so far (its length is the count)."""
    from playwright.sync_api import Page

    original = Page.screenshot

    def arm(how: str, calls, when=None) -> list:
        made: list = []

        def screenshot(self, *args, **kwargs):
            if when is None or when(self):
                made.append(self)
                if len(made) in calls:
                    _crash_renderer(self) if how == "renderer" else _kill_browser()
            return original(self, *args, **kwargs)

        monkeypatch.setattr(Page, "screenshot", screenshot)
        return made

    return arm


@pytest.fixture(scope="module", autouse=True)
def _close_the_shared_browser():
    """Later test modules start Playwright in this thread; one live sync instance per thread is all it allows."""
    yield
    close_shared_browser()


# ------------------------------------------------------------------------------------------- no browser needed


def test_crash_reasons_are_playwrights_crash_errors_only():
    from playwright._impl._errors import TargetClosedError
    from playwright.sync_api import Error, TimeoutError

    assert crash_reason(TargetClosedError()).startswith("TargetClosedError: Target page, context or browser")
    assert crash_reason(Error("Page.screenshot: Target crashed \nCall log:\n  - taking page screenshot"))
    assert crash_reason(Error("Browser.new_context: Browser has been closed"))
    assert crash_reason(Error("Page.set_content: Page crashed"))
    assert crash_reason(TimeoutError("Page.set_content: Timeout 3000ms exceeded. Page crashed")) is None
    assert crash_reason(Error("Page.evaluate: ReferenceError: x is not defined")) is None
    assert crash_reason(RuntimeError("Target crashed")) is None  # not Playwright's


def test_left_out_skips_crashed_items_and_stops_a_broken_chromium(caplog):
    left_out = LeftOut("builder", in_a_row=2)
    done = []
    for i, crash in enumerate([True, False, True, False]):
        with left_out.item(f"item-{i}"):
            if crash:
                raise ChromiumCrash("page: Chromium crashed 3 times in a row: renderer crashed (...)")
            done.append(i)
    assert done == [1, 3] and left_out.items == ["item-0", "item-2"]
    assert "item-0 left out: page: Chromium crashed 3 times" in caplog.text
    with pytest.raises(ValueError):  # any other error is the builder's: it propagates
        with left_out.item("item-4"):
            raise ValueError("a bug")
    with pytest.raises(RuntimeError, match="Chromium crashed on 2 items in a row"):
        for i in (5, 6):
            with left_out.item(f"item-{i}"):
                raise ChromiumCrash("page: Chromium crashed")


# ------------------------------------------------------------------------------------------------- Chromium

chromium = pytest.mark.chromium


@pytest.fixture(autouse=True)
def _needs_chromium(request):
    if request.node.get_closest_marker("chromium") and not Path("/usr/bin/chromium").exists():
        pytest.fail("/usr/bin/chromium is not installed: run bash scripts/setup.sh")


@chromium
@pytest.mark.parametrize("how", ["renderer", "browser"])
def test_the_html_renderer_scores_every_item_through_a_crash(crash_at, how):
    with HtmlRenderer() as r:
        made = crash_at(how, {2})
        results = [r.render(f"<p>item {i}</p>", extract_text=True) for i in range(3)]
        assert [res.ok for res in results] == [True] * 3, [res.error for res in results]
        assert [res.text.strip() for res in results] == ["item 0", "item 1", "item 2"]
        assert len(made) == 4 and r.crashes == 1 and r.restarts == (1 if how == "browser" else 0)


@chromium
@pytest.mark.parametrize("how", ["renderer", "browser"])
def test_the_html_renderer_fails_an_item_after_its_retries_and_scores_the_next(crash_at, how):
    with HtmlRenderer(crash_retries=1) as r:
        made = crash_at(how, {1, 2})
        failed = r.render("<p>doomed</p>")
        word = "renderer crashed" if how == "renderer" else "browser died"
        assert not failed.ok and failed.error.startswith(
            "ChromiumCrash: page: Chromium crashed 2 times in a row"
        )
        assert failed.error.count(word) == 2, failed.error
        assert ("Target crashed" if how == "renderer" else "closed") in failed.error
        after = r.render("<p>next</p>", extract_text=True)
        assert after.ok and after.text.strip() == "next" and len(made) == 3 and r.crashes == 2


@chromium
def test_a_timeout_on_hostile_html_fails_closed_and_is_not_retried():
    with HtmlRenderer(javascript=True, crash_retries=5) as r:
        t0 = time.monotonic()
        result = r.render(
            "<p>x</p><script>setTimeout(() => { while (true) {} }, 0)</script>", timeout_ms=1500
        )
        assert not result.ok and "ChromiumCrash" not in result.error and r.crashes == 0
        assert r.restarts == 1 and time.monotonic() - t0 < 10  # the watchdog's one kill, not six tries
        assert r.render("<p>still works</p>", extract_text=True).ok


def _gui_build(folder: Path, renderer: gui_data.ScreenRenderer) -> dict[str, Path]:
    return gui_data.build(folder, n_train=4, n_eval=2, seed=5, renderer=renderer)


@chromium
@pytest.mark.parametrize("how", ["renderer", "browser"])
def test_the_gui_builder_produces_every_record_through_crashes(tmp_path, crash_at, how):
    with gui_data.ScreenRenderer() as renderer:
        clean = _gui_build(tmp_path / "clean", renderer)
        made = crash_at(how, {2, 5})
        crashed = _gui_build(tmp_path / "crashed", renderer)
        assert renderer.crashes == 2 and len(made) == 8
    for split in ("train", "eval"):
        assert crashed[split].read_text() == clean[split].read_text()
    images = sorted(p.name for p in (tmp_path / "clean/images").iterdir())
    assert len(images) == 6 and images == sorted(p.name for p in (tmp_path / "crashed/images").iterdir())
    for name in images:
        assert (tmp_path / "crashed/images" / name).read_bytes() == (
            tmp_path / "clean/images" / name
        ).read_bytes()


@chromium
def test_the_gui_builder_leaves_out_a_record_chromium_keeps_crashing_under(tmp_path, crash_at, caplog):
    with gui_data.ScreenRenderer(crash_retries=1) as renderer:
        crash_at("renderer", {1, 2})
        with caplog.at_level(logging.WARNING):
            paths = gui_data.build(tmp_path / "a", n_train=3, n_eval=0, seed=5, renderer=renderer)
        ids = [json.loads(line)["id"] for line in paths["train"].read_text().splitlines()]
        assert ids == ["gui-train-00001", "gui-train-00002"]
        assert "gui-train-00000 left out: screen" in caplog.text and "Target crashed" in caplog.text
        crash_at("renderer", set(range(1, 100)))  # Chromium that never renders: the build stops
        with pytest.raises(RuntimeError, match="Chromium crashed on 3 items in a row"):
            gui_data.build(tmp_path / "b", n_train=5, n_eval=0, seed=5, renderer=renderer)


def _oracle_episode(env: BrowserAppEnv, sample: Sample) -> tuple[list[str], list[float]]:
    keys, rewards = [env.reset(sample).state_key], []
    while True:
        result = env.step(f"<answer>[{env.oracle_action()!r}]</answer>")
        rewards.append(result.reward)
        if result.done:
            return keys, rewards
        keys.append(result.observation.state_key)


@chromium
@pytest.mark.parametrize("how", ["renderer", "browser"])
def test_a_browser_episode_goes_on_through_crashes(tmp_path, crash_at, how):
    """Crashes in the reset's and a step's screenshot, and one between steps: the episode replays its actions on a
    new page and reaches the same states and the same success as without them."""
    sample = Sample(id="shop-3", messages=[], metadata={"app": "shop", "seed": 3})
    clean = BrowserAppEnv(workdir=tmp_path / "clean")
    keys, rewards = _oracle_episode(clean, sample)
    clean.close()
    assert rewards[-1] == 1.0 and len(keys) >= 3

    env = BrowserAppEnv(workdir=tmp_path / "crashed")
    made = crash_at(how, {1, 3})
    first = env.reset(sample)
    got, got_rewards = [first.state_key], []
    while True:
        if len(got) == 2:  # between steps, outside any screenshot
            _crash_renderer(env.page) if how == "renderer" else _kill_browser()
        result = env.step(f"<answer>[{env.oracle_action()!r}]</answer>")
        got_rewards.append(result.reward)
        if result.done:
            break
        got.append(result.observation.state_key)
    env.close()
    assert got == keys and got_rewards == rewards and len(made) == len(keys) + 2
    assert (tmp_path / "crashed/step-01.png").read_bytes() == (tmp_path / "clean/step-01.png").read_bytes()


@chromium
def test_the_other_live_episodes_go_on_after_a_relaunch_under_one(tmp_path):
    """Two live episodes of one process share its browser. It dies under the first one's step, which relaunches it
    (a new Playwright driver: the second one's page went with the old one, and a call on it raises "Event loop is
    closed", which names no crash). The second one opens a new page and replays its actions before its next
    oracle query and step, and both reach the states and rewards of episodes run without the crash."""
    samples = [
        Sample(id="shop-3", messages=[], metadata={"app": "shop", "seed": 3}),
        Sample(id="mail-0", messages=[], metadata={"app": "mail", "seed": 0}),
    ]
    clean = []
    for s in samples:
        env = BrowserAppEnv(workdir=tmp_path / f"clean-{s.id}")
        clean.append(_oracle_episode(env, s))
        env.close()
    envs = [BrowserAppEnv(workdir=tmp_path / f"crashed-{s.id}") for s in samples]
    got = [([env.reset(s).state_key], []) for env, s in zip(envs, samples)]
    ended = [False, False]
    turn = 0
    while not all(ended):
        if turn == 1:  # each has taken one step; the browser dies before the first one's second
            _kill_browser()
        for i, env in enumerate(envs):
            if ended[i]:
                continue
            result = env.step(f"<answer>[{env.oracle_action()!r}]</answer>")
            assert "error" not in result.info, result.info
            got[i][1].append(result.reward)
            ended[i] = result.done
            if not result.done:
                got[i][0].append(result.observation.state_key)
        turn += 1
    for env in envs:
        env.close()
    assert [list(g) for g in got] == [list(c) for c in clean]
    assert all(len(keys) >= 3 for keys, _ in clean)  # both were live when the browser died


@chromium
def test_a_browser_episode_chromium_keeps_crashing_under_fails_alone_with_the_reason(tmp_path, crash_at):
    """In a pool of two live episodes, the one whose page always crashes ends with the crash as its error; the
    other, sharing the browser, succeeds."""
    doomed = Sample(id="doomed", messages=[], metadata={"app": "settings", "seed": 2, "viewport": [412, 600]})
    fine = Sample(id="fine", messages=[], metadata={"app": "mail", "seed": 0})
    made = crash_at("renderer", set(range(2, 100)), when=lambda page: page.viewport_size["width"] == 412)
    with EnvPool(tmp_path / "pool", workers=0, timeout_s=60) as pool:
        starts = pool.reset([(s.id, "browser_app", {}, s) for s in (doomed, fine)])
        assert all("error" not in s.info for s in starts)
        ends: dict[str, object] = {}
        while len(ends) < 2:
            live = [eid for eid in ("doomed", "fine") if eid not in ends]
            for eid, result in pool.step(pool.oracle(live)).items():
                if result.done:
                    ends[eid] = result
    assert ends["fine"].reward == 1.0 and "error" not in ends["fine"].info
    error = ends["doomed"].info["error"]
    assert "ChromiumCrash" in error and "sample 'doomed' (app 'settings' seed 2): step 1" in error, error
    assert "Chromium crashed 3 times in a row" in error and "Target crashed" in error
    assert len(made) == 4  # the reset's screenshot, then three crashed tries of the first step


@chromium
def test_the_gui_agent_builder_survives_a_crash(tmp_path, crash_at):
    clean = build_agent_data(tmp_path / "clean", n_train=3, n_eval=0, n_sft=1, seed=2)
    crash_at("renderer", {2, 6})
    crashed = build_agent_data(tmp_path / "crashed", n_train=3, n_eval=0, n_sft=1, seed=2)
    for split in ("train", "sft"):
        assert crashed[split].read_text() == clean[split].read_text()
    for p in (tmp_path / "clean/images").iterdir():
        assert (tmp_path / "crashed/images" / p.name).read_bytes() == p.read_bytes()
