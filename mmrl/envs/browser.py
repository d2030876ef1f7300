"""The ``browser_app`` env: multi-step tasks in small generated web apps (settings, form, list, shop, mail) that run
in sandboxed Chromium with real state. The model sees a screenshot, acts (click, type, scroll, back), sees the next
screenshot; success is judged from the app's state (``window.__state``), never from text.

The app. The sample's metadata names it: ``app`` (a kind) and ``seed`` (an int); the generator (option ``apps``,
``module:function``, default :func:`mmrl.recipes.gui_agent.apps.make_app`) builds it again from these two alone:
an object with ``html`` (the whole page, self-contained), ``task``, ``instruction``, ``success(state) -> bool`` and
``oracle(state) -> Step | None`` (:class:`mmrl.recipes.gui_agent.apps.Step`: the next correct action, by element
id). When the metadata also has ``task`` or ``instruction``, they must equal the generator's (else the data was
built by another version: rebuild it). ``viewport`` ``[w, h]`` (default 480 x 360) is the page's size in CSS pixels
at device scale 1, so screenshot pixels are page pixels.

The browser. One Chromium per worker process (:class:`mmrl.rewards.html_sandbox.HtmlRenderer`'s launch: every
request aborted by a route handler and counted in ``blocked_requests``, the proxy a dead local port, host names
resolving to nothing, rlimits on every Chromium process) and a context and page per live episode, reused by the
next episode after a navigation to ``about:blank`` (:class:`AppBrowser`), JavaScript on for the app's own script.
A crash of the page's renderer or of the browser is survived (:meth:`HtmlRenderer.retry_crashes`): the episode
opens a new page (in a new browser when it died), does its valid actions so far again, and retries its reset, step
or oracle query; after ``crash_retries`` more crashes in a row it raises
:class:`~mmrl.rewards.html_sandbox.ChromiumCrash` naming the sample, the step and every crash, which ends that
episode alone (the pool's ``info["error"]``). A relaunch takes the other live episodes' pages along (the old
Playwright driver stops); each opens a new page and replays its actions before its next step or oracle query.
The page is set from a string, never a URL, so no ``file:`` page exists and Chromium refuses ``file:`` loads from
it. Typed text is untrusted: it only reaches the page through key events into the focused text
field, and the app shows text from its state as text nodes only, so markup or URLs typed stay text.

The first observation. The data builder (:mod:`mmrl.recipes.gui_agent.data`) pre-renders the first screenshot into
the record: the sample's own image IS the first screen, and :meth:`reset` returns no image. It renders the page
anew and, with ``check_first_image`` (the default), checks that its pixels equal the sample's image (Chromium and
fonts draw the same page to the same pixels on one machine; a mismatch means the data came from another machine
or version: the error says to rebuild it). A sample without images gets the live screenshot as the first
observation's image instead (appended to the first user turn, :mod:`mmrl.envs.base`).

Actions: one per turn, in the text after the last ``</think>``: the first ``<answer>...</answer>`` (or, without the
tag, the whole text) is read as JSON or a Python literal (:func:`mmrl.rewards.gui.parse_literal`): a list of
action dicts in the gui recipe's schema, or one dict; the FIRST action wins, the rest is ignored:

- ``{'action': 'click', 'coordinate': [x, y]}`` (``tap``; ``point`` for ``coordinate``);
- ``{'action': 'input_text', 'input_text': 'text'}`` (``type``; ``text`` for ``input_text``): replaces the content
  of the focused text field (select all, then type; empty text clears it); with a ``coordinate`` it first clicks
  there (a tap on the field, as a phone agent types). Control characters are dropped and the text is cut at
  ``max_text_chars``. With no text field focused nothing is typed (the observation says so);
- ``{'action': 'scroll', 'direction': 'down'}`` (``up``/``down``; also in ``input_text``/``text``, GUI-R1's form):
  one mouse-wheel notch at ``coordinate`` or the screen's centre; the app scrolls a fixed step;
- ``{'action': 'navigate_back'}`` (``back``): the app's back (its header button does the same).

Coordinates are in the model's frame of the screenshot (:mod:`mmrl.model.geometry`): ``coordinate_frame``
(``model_pixels`` when absent), ``image_sizes[0]`` (must equal the viewport) and ``model_image_sizes[0]`` (the size
the model saw; without it ``model_pixels`` are page pixels), mapped exactly with
:func:`mmrl.processors.geometry.frame_to_original`; Playwright clicks at the mapped (fractional) page pixel. A point off the
screen, an unknown action, or anything unparseable is invalid: reward 0, ``info["invalid"]``, the observation says
what was wrong and shows no new image; the state is unchanged. ``open_app`` is unknown here.

Steps. After each action the env waits for the app's re-render (two animation frames), reads the state, and
screenshots the viewport (``step-NN.png`` in the episode's folder). The episode ends with reward 1 as soon as the
task's success predicate holds over the state, or with reward 0 at ``max_steps`` actions (invalid ones count), or
(option ``unreachable: end``) right after an action the app's oracle cannot finish the task from.
With ``step_reward`` > 0 every step whose action was the oracle's next one (``target_hit``) earns that much on top
(a process reward the world's oracle can give: dense per-step credit for a model whose episodes rarely succeed).

``state_key`` (GiGPO's anchor state): a hash of the app (kind, seed), ``window.__state`` (page, data, selections,
draft text), the scroll offset and the focused text field: equal keys for equal states however they were reached,
not a hash of pixels.

``info`` per step: ``action``, ``valid``/``invalid``, ``hit`` (a pointing action landed on an interactive element,
by ``elementFromPoint`` before the action; None for others), ``target_hit`` (the action is the oracle's next one:
the element it would click, a scroll its way, back when it goes back, the field and text it would type),
``success``, ``steps``, ``blocked_requests`` (this episode's), ``point`` (the page-pixel point ``[x, y]`` a pointing
action was mapped to, for a report to draw the click; None for others), and ``reason`` on the last step.

The oracle. :meth:`BrowserAppEnv.oracle_action` gives the oracle's next action in page pixels (data builders,
tests); :meth:`BrowserAppEnv.oracle` writes it as the model should (:func:`action_response`): its coordinate mapped
to the model's frame with the sizes of the sample's metadata (whole numbers; 3 decimals in ``relative_1``), as
``<think></think><answer>[{...}]</answer>`` (the action dict's repr); None when the task is done or the oracle
cannot finish it from this state (a wrong order in the shop).
"""

from __future__ import annotations

import atexit
import hashlib
import importlib
import io
import json
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from mmrl.envs.base import Env, Observation, StepResult, register_env
from mmrl.processors.geometry import DEFAULT_FRAME, frame_to_original, original_to_frame
from mmrl.rewards.gui import parse_literal
from mmrl.rewards.html_sandbox import HtmlRenderer
from mmrl.types import Sample

T = TypeVar("T")
DEFAULT_VIEWPORT = (480, 360)
DEFAULT_APPS = "mmrl.recipes.gui_agent.apps:make_app"
EXPECTED = (
    "expected <answer>[{'action': 'click', 'coordinate': [x, y]}]</answer>; actions: click (coordinate), "
    "input_text (input_text, optional coordinate), scroll (direction 'up' or 'down'), navigate_back"
)
ALIASES = {
    "click": "click",
    "tap": "click",
    "input_text": "input_text",
    "type": "input_text",
    "scroll": "scroll",
    "navigate_back": "back",
    "back": "back",
}
MAX_ANSWER_CHARS = 4000
_ANSWER = re.compile(r"<answer>", re.IGNORECASE)
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")

_STATE_JS = """() => {
  const a = document.activeElement;
  const field = a && a.tagName === "INPUT" ? a.dataset.ui || "?" : null;
  return JSON.stringify({state: window.__state, scroll: Math.round(window.scrollY), focus: field});
}"""
_UI_AT_JS = """([x, y]) => {
  const e = document.elementFromPoint(x, y), t = e && e.closest("[data-ui]");
  return t ? t.dataset.ui : null;
}"""
_MEASURE_JS = """(id) => {
  const e = document.querySelector('[data-ui="' + CSS.escape(id) + '"]');
  if (!e) return null;
  const r = e.getBoundingClientRect(), x = r.left + r.width / 2, y = r.top + r.height / 2;
  const on = x >= 0 && y >= 0 && x < innerWidth && y < innerHeight;
  const top = on ? document.elementFromPoint(x, y) : null;
  return {x, y, visible: !!top && top.closest("[data-ui]") === e};
}"""
_FOCUSED_JS = (
    "() => { const a = document.activeElement; return a && a.tagName === 'INPUT' ? a.dataset.ui : null }"
)
_SETTLE_JS = "() => new Promise(r => requestAnimationFrame(() => requestAnimationFrame(() => r(0))))"


class Invalid(ValueError):
    """A malformed action; the message is what the model is told."""


@dataclass(frozen=True)
class Action:
    """A parsed action: ``kind`` is click, input_text, scroll or back; ``point`` in the model's frame; ``text`` the
    text to type or the scroll direction."""

    kind: str
    point: tuple[float, float] | None = None
    text: str | None = None


def parse_action(text: str) -> Action:
    """The first action of a turn (module docstring); raises :class:`Invalid` saying what was wrong."""
    text = str(text).rsplit("</think>", 1)[-1]
    m = _ANSWER.search(text)
    body = re.split(r"</answer>", text[m.end() :], maxsplit=1, flags=re.IGNORECASE)[0] if m else text
    body = body.strip()
    if len(body) > MAX_ANSWER_CHARS:
        raise Invalid(f"the answer is longer than {MAX_ANSWER_CHARS} characters")
    value = parse_literal(body) if body else None
    if value is None:
        raise Invalid("the answer is not a list of actions" if m else "no <answer>...</answer> found")
    first = value[0] if isinstance(value, list) and value else value
    if not isinstance(first, dict) or not isinstance(first.get("action"), str):
        raise Invalid("an action is a dict with an 'action' name")
    name = first["action"].strip().lower()
    kind = ALIASES.get(name)
    if kind is None:
        raise Invalid(f"unknown action {name[:40]!r}")
    raw = first.get("coordinate", first.get("point"))
    point = _pair(raw)
    if raw is not None and point is None:
        raise Invalid("a coordinate is two numbers [x, y]")
    if kind == "click" and point is None:
        raise Invalid("click needs 'coordinate': [x, y]")
    if kind == "input_text":
        typed = first.get("input_text", first.get("text"))
        if not isinstance(typed, str):
            raise Invalid("input_text needs the text to type: 'input_text': '...'")
        return Action(kind, point, typed)
    if kind == "scroll":
        way = first.get("direction", first.get("input_text", first.get("text")))
        way = way.strip().lower() if isinstance(way, str) else ""
        if way not in ("up", "down"):
            raise Invalid("scroll needs 'direction': 'up' or 'down'")
        return Action(kind, point, way)
    return Action(kind, point if kind == "click" else None)


def _pair(value: Any) -> tuple[float, float] | None:
    if isinstance(value, (list, tuple)) and len(value) == 2:
        if all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in value):
            return float(value[0]), float(value[1])
    return None


def action_response(
    action: dict[str, Any], frame: str, viewport: tuple[int, int], model_size: tuple[int, int]
) -> str:
    """The full-marks response for an oracle ``action`` (page pixels): its coordinate in ``frame`` for a model that
    sees the ``viewport`` at ``model_size`` (whole numbers; 3 decimals in ``relative_1``), then
    ``<think></think><answer>[action]</answer>``."""
    out = dict(action)
    if "coordinate" in out:
        x, y = original_to_frame(*out["coordinate"], frame, viewport, model_size)
        digits = 3 if frame == "relative_1" else 0
        out["coordinate"] = [round(x, digits), round(y, digits)] if digits else [round(x), round(y)]
    return f"<think></think><answer>[{out!r}]</answer>"


def resolve_apps(ref: str) -> Callable[[str, int], Any]:
    """The app generator named ``module:function``; raises ValueError saying why it cannot be used."""
    module_name, sep, attr = ref.partition(":")
    try:
        fn = getattr(importlib.import_module(module_name), attr) if sep else None
    except ImportError as e:
        raise ValueError(f"env 'browser_app': apps module {module_name!r} cannot be imported: {e}") from None
    if not callable(fn):
        raise ValueError(f"env 'browser_app': option apps={ref!r} must name a function as 'module:function'")
    return fn


class AppBrowser(HtmlRenderer):
    """The process's Chromium for the apps: :class:`HtmlRenderer`'s launch and limits, a context and page per live
    episode (JavaScript on, every request aborted by the route handler of the episode that holds the page).

    Pages are reused. Opening a page costs Chromium a new renderer process: an episode's reset took 211 ms with a
    new page and 69 ms with a reused one, and its CPU time (Chromium's included) 170 ms against 104 ms, on the
    2-core machine (``benchmarks/env_reset.py``). So a released episode's page goes to a free list (at most
    :attr:`keep`), navigated at once to ``about:blank``: a new document and window, so none of the last app's
    script, timers, listeners, globals or focus survives, and its opaque origin keeps no storage (the apps are set
    from strings, so they have none either). The next episode takes it, sizes its viewport and routes its requests
    to its own handler. A page that fails any of this is closed, never reused;
    the free list dies with the browser (a relaunch starts empty)."""

    # Free pages kept per process: a worker of the tiny gui_agent recipe holds 32 episodes at once (8 x 8 over 2
    # workers); with 16 kept, half its resets open new pages (runs of that recipe from two warm starts took about
    # 20 s a step with 16 and 11 s with 32, on the 2-core machine alone; not a controlled comparison). An idle
    # page holds about 35 MB (two renderer processes of ~18 MB unshared memory each, measured), and the evaluation
    # pool's workers keep theirs too, so a run's idle pages are at most 32 x 35 MB per env worker.
    keep = 32

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self._free: list[tuple[Any, Any, list]] = []
        self._live: dict[int, tuple[Any, Any, list]] = {}  # id(context) -> (context, page, [route handler])

    def open(self, viewport: tuple[int, int], route: Callable[[Any], None]) -> tuple[Any, Any]:
        """A context and page of ``viewport`` ``(w, h)`` at device scale 1, reused when one is free; (re)launches
        Chromium if needed."""
        self.ensure_browser()
        size = {"width": viewport[0], "height": viewport[1]}
        while self._free:
            held = self._free.pop()
            try:
                held[1].set_viewport_size(size)
            except Exception:
                self._close(held[0])
                continue
            held[2][0] = route
            self._live[id(held[0])] = held
            return held[0], held[1]
        context = self._browser.new_context(
            viewport=size,
            device_scale_factor=1,
            java_script_enabled=True,
            service_workers="block",
            accept_downloads=False,
            reduced_motion="reduce",
        )
        handler = [route]
        context.route("**/*", lambda request: handler[0](request))
        held = (context, context.new_page(), handler)
        self._live[id(context)] = held
        return held[0], held[1]

    def holds(self, context: Any) -> bool:
        """Whether ``context`` is a live context of the running browser. A relaunch (after a crash under any episode
        of this process) stops the old Playwright driver, so the other live episodes' pages are gone with it: a call
        on one raises Playwright's "Event loop is closed", which names no crash. Those episodes open a new page and
        replay their actions before they act (:meth:`BrowserAppEnv._live`)."""
        return self._browser is not None and not self._browser_dead and context.browser is self._browser

    def close_context(self, context: Any) -> None:
        """Release ``context``: its page goes back to the free list after a navigation to ``about:blank``, or the
        context is closed (the browser is killed, and relaunched for the next episode, if that hangs). A context
        of a browser that has since been relaunched is only forgotten."""
        if context.browser is not self._browser:
            return
        held = self._live.pop(id(context), None)
        if held is None or len(self._free) >= self.keep or self._browser_dead:
            self._close(context)
            return
        held[2][0] = _refuse
        if self._guarded(lambda: held[1].goto("about:blank", timeout=self.close_timeout_s * 1000)):
            self._free.append(held)
        else:
            self._close(context)

    def close(self) -> None:
        self._free.clear()
        self._live.clear()
        super().close()

    def _close(self, context: Any) -> None:
        if not self._guarded(context.close):
            self._browser_dead = True


def _refuse(route: Any) -> None:
    """A free page's route handler: nothing loads while no episode holds the page."""
    route.abort()


_shared: AppBrowser | None = None


def shared_browser() -> AppBrowser:
    """This process's :class:`AppBrowser`, started on first use and closed at exit (a pool worker's is killed
    with its process group)."""
    global _shared
    if _shared is None:
        _shared = AppBrowser(javascript=True)
        atexit.register(_shared.close)
    return _shared


def close_shared_browser() -> None:
    """Close this process's browser; the next episode starts a new one. Playwright's sync API allows one live
    instance per thread, so a process that runs episodes in-process (``EnvPool(workers=0)``) must close it before
    anything else there renders with Playwright (a report gallery, a rendering reward)."""
    global _shared
    if _shared is not None:
        atexit.unregister(_shared.close)
        _shared.close()
        _shared = None


@register_env("browser_app")
class BrowserAppEnv(Env):
    """See the module docstring. Options: ``max_steps`` (actions per episode, invalid ones included),
    ``max_text_chars`` (typed text is cut here), ``check_first_image`` (reset checks the sample's image against
    the live screen), ``apps`` (the generator, ``module:function``), ``timeout_ms`` (page load and screenshot),
    ``step_reward`` (added to a step's reward when the action was the oracle's next one: a process reward from the
    world's own oracle, 0 by default), ``invalid`` (``retry``: a malformed action is told what was wrong and uses
    a step; ``end``: it ends the episode with reward 0 and ``info["reason"] = "invalid"``, so a policy cannot stall
    on malformed actions to keep a later chance open), ``unreachable`` (``continue``: the episode goes on to
    ``max_steps`` after the task became impossible; ``end``: it ends after the action that made the task impossible,
    by the app's oracle (a wrong tile pressed, Done too early, a wrong order checked out), with
    ``info["reason"] = "unreachable"``, so no actions are sampled, trained or counted on a screen where nothing can
    be right)."""

    deterministic = True
    points_on_latest_image = True  # clicks on the latest screenshot, mapped with the first one's model size

    def __init__(
        self,
        *,
        workdir: Path,
        max_steps: int = 8,
        max_text_chars: int = 100,
        check_first_image: bool = True,
        apps: str = DEFAULT_APPS,
        timeout_ms: int = 10_000,
        step_reward: float = 0.0,
        invalid: str = "retry",
        unreachable: str = "continue",
    ) -> None:
        super().__init__(workdir=workdir)
        options = {
            "max_steps": max_steps,
            "max_text_chars": max_text_chars,
            "timeout_ms": timeout_ms,
            "step_reward": step_reward,
            "apps": apps,
            "invalid": invalid,
            "unreachable": unreachable,
        }
        self.check_options(options)
        self.max_steps, self.max_text_chars, self.timeout_ms = max_steps, max_text_chars, timeout_ms
        self.check_first_image, self.make_app = check_first_image, resolve_apps(apps)
        self.step_reward = float(step_reward)
        self.end_on_invalid = invalid == "end"
        self.end_unreachable = unreachable == "end"
        self.context = self.page = None
        self.steps = self.blocked_requests = 0
        self.state: dict[str, Any] = {}
        self.state_key = ""
        self.history: list[tuple[Action, tuple[float, float] | None]] = []  # valid actions done, for a replay
        self.what = ""

    @classmethod
    def check_options(cls, options: Mapping[str, Any]) -> None:
        for key, low in {"max_steps": 1, "max_text_chars": 1, "timeout_ms": 100, "step_reward": 0}.items():
            if key in options and not options[key] >= low:
                raise ValueError(f"env 'browser_app': option {key!r} must be >= {low}, got {options[key]!r}")
        if "apps" in options:
            resolve_apps(options["apps"])
        if options.get("invalid", "retry") not in ("retry", "end"):
            raise ValueError(
                f"env 'browser_app': option 'invalid' must be 'retry' or 'end', got {options['invalid']!r}"
            )
        if options.get("unreachable", "continue") not in ("continue", "end"):
            raise ValueError(
                "env 'browser_app': option 'unreachable' must be 'continue' or 'end', "
                f"got {options['unreachable']!r}"
            )

    # -- the episode --------------------------------------------------------------------------------------------

    def reset(self, sample: Sample) -> Observation:
        meta = sample.metadata or {}
        kind, seed = meta.get("app"), meta.get("seed")
        if not isinstance(kind, str) or not isinstance(seed, int) or isinstance(seed, bool):
            raise ValueError(
                f"sample {sample.id!r}: the browser_app env needs metadata 'app' (an app kind) and 'seed' (an int)"
            )
        self.app = self.make_app(kind, seed)
        for key in ("task", "instruction"):
            if key in meta and meta[key] != getattr(self.app, key):
                raise ValueError(
                    f"sample {sample.id!r}: metadata {key} {meta[key]!r} is not what the app generator makes now "
                    f"({getattr(self.app, key)!r}); rebuild the data with this version"
                )
        self.viewport = tuple(int(v) for v in meta.get("viewport") or DEFAULT_VIEWPORT)
        given = meta.get("image_sizes")
        if given and tuple(given[0]) != self.viewport:
            raise ValueError(
                f"sample {sample.id!r}: metadata image_sizes[0] is {list(given[0])} but the viewport is "
                f"{list(self.viewport)}; coordinates would be mapped wrongly"
            )
        self.frame = meta.get("coordinate_frame") or DEFAULT_FRAME
        model = meta.get("model_image_sizes")
        self.model_size = tuple(model[0]) if model else self.viewport
        self.tag = f"{kind}|{seed}"
        self.steps = self.blocked_requests = 0
        self.history = []
        self.what = f"sample {sample.id!r} (app {kind!r} seed {seed})"
        png = shared_browser().retry_crashes(self._first, f"{self.what}: reset")
        images: list[str] = []
        if not sample.images:
            images = [str(png)]
        elif self.check_first_image:
            _check_same_screen(sample, png)
        return Observation(text="", images=images, state_key=self.state_key)

    def step(self, action_text: str) -> StepResult:
        self.steps += 1
        try:
            action = parse_action(action_text)
            point = self._to_page(action.point) if action.point is not None else None
        except Invalid as bad:
            return self._invalid(str(bad))
        what = f"{self.what}: step {self.steps}"
        result = shared_browser().retry_crashes(
            lambda: self._live(self._act, action, point), what, self._load
        )
        self.history.append((action, point))
        return result

    def _act(self, action: Action, point: tuple[float, float] | None) -> StepResult:
        """The rest of :meth:`step` for a valid action: everything it does in the page."""
        expected, wanted = self._next()
        at = self.page.evaluate(_UI_AT_JS, list(point)) if point is not None else None
        focused = self.page.evaluate(_FOCUSED_JS)
        note = self._perform(action, point)
        self._settle()
        self._read()
        success = bool(self.app.success(self.state))
        info = {
            "action": action.kind,
            "valid": True,
            "invalid": False,
            "hit": None if point is None else at is not None,
            "target_hit": _matches(expected, wanted, action, at, focused),
            "success": success,
            "steps": self.steps,
            "blocked_requests": self.blocked_requests,
            "point": None if point is None else [float(point[0]), float(point[1])],
        }
        lost = not success and self.end_unreachable and self.app.oracle(self.state) is None
        if success or lost or self.steps >= self.max_steps:
            info["reason"] = "success" if success else "unreachable" if lost else "max_steps"
            return StepResult(None, float(success) + self._progress(info), True, info)
        png = self._shoot()
        text = f"{note}{self._left()}"
        return StepResult(
            Observation(text=text, images=[str(png)], state_key=self.state_key),
            self._progress(info),
            False,
            info,
        )

    def close(self) -> None:
        if self.context is not None:
            shared_browser().close_context(self.context)
        self.context = self.page = None

    def oracle_action(self) -> dict[str, Any] | None:
        """The oracle's next action in the gui schema, coordinates in page pixels (the ``original_pixels``
        frame); a scroll when its element is off screen; None when the task is done or cannot be finished."""
        what = f"{self.what}: the oracle after step {self.steps}"
        return shared_browser().retry_crashes(lambda: self._live(self._next)[1], what, self._load)

    def oracle(self) -> str | None:
        """The oracle's next action as the model writes it, in its frame (module docstring); None when there is
        none."""
        action = self.oracle_action()
        return None if action is None else action_response(action, self.frame, self.viewport, self.model_size)

    # -- helpers ------------------------------------------------------------------------------------------------

    def _live(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` on a page of the running browser: when the browser was relaunched since this episode's page
        was opened (a crash under another episode of this process), the page is opened again and the episode's
        actions replayed first, as after a crash under this one."""
        if self.context is None or not shared_browser().holds(self.context):
            self._load()
        return fn(*args)

    def _first(self) -> Path:
        self._load()
        return self._shoot()

    def _load(self) -> None:
        """A page showing the app, with the episode's actions so far done again: the start of an episode, and its
        way back after a crash (the apps are deterministic, so the replay reaches the same state); reads it."""
        if self.context is not None:
            shared_browser().close_context(self.context)
            self.context = self.page = None
        self.context, self.page = shared_browser().open(self.viewport, self._abort)
        self.page.set_content(self.app.html, wait_until="load", timeout=self.timeout_ms)
        self._settle()
        for action, point in self.history:
            self._perform(action, point)
            self._settle()
        self._read()

    def _next(self) -> tuple[Any, dict[str, Any] | None]:
        step = self.app.oracle(self.state)
        if step is None:
            return None, None
        if step.action == "back":
            return step, {"action": "navigate_back"}
        where = self.page.evaluate(_MEASURE_JS, step.target)
        if where is None:
            return step, None
        if not where["visible"]:
            return step, {
                "action": "scroll",
                "direction": "down" if where["y"] > self.viewport[1] / 2 else "up",
            }
        xy = [round(where["x"]), round(where["y"])]
        if step.action == "click":
            return step, {"action": "click", "coordinate": xy}
        return step, {"action": "input_text", "coordinate": xy, "input_text": step.text}

    def _progress(self, info: dict[str, Any]) -> float:
        """``step_reward`` for an action that was the oracle's next one (a process reward; 0 by default)."""
        return self.step_reward if info.get("target_hit") else 0.0

    def _to_page(self, point: tuple[float, float]) -> tuple[float, float]:
        x, y = frame_to_original(point[0], point[1], self.frame, self.viewport, self.model_size)
        w, h = self.viewport
        if not (math.isfinite(x) and math.isfinite(y) and 0 <= x < w and 0 <= y < h):
            raise Invalid(f"the point {[round(v, 3) for v in point]} lies outside the screen")
        return x, y

    def _perform(self, action: Action, point: tuple[float, float] | None) -> str:
        """Do ``action`` with Playwright's mouse and keyboard; a note for the observation when nothing happened."""
        page = self.page
        if action.kind == "back":
            page.evaluate("() => window.__app.back()")
            return ""
        if action.kind == "scroll":
            x, y = point or (self.viewport[0] / 2, self.viewport[1] / 2)
            page.mouse.move(x, y)
            page.mouse.wheel(0, 100 if action.text == "down" else -100)
            return ""
        if point is not None:
            page.mouse.click(*point)
        if action.kind == "click":
            return ""
        if page.evaluate(_FOCUSED_JS) is None:
            return "Nothing was typed: no text field has the focus (click one, or give input_text its coordinate). "
        text = _CONTROL.sub("", action.text)[: self.max_text_chars]
        page.keyboard.press("Control+A")
        if text:
            page.keyboard.type(text)
        else:
            page.keyboard.press("Backspace")
        return ""

    def _settle(self) -> None:
        self.page.evaluate(_SETTLE_JS)

    def _read(self) -> None:
        raw = json.loads(self.page.evaluate(_STATE_JS))
        self.state = raw["state"]
        canon = json.dumps(raw, sort_keys=True, ensure_ascii=False)
        self.state_key = hashlib.sha1(f"{self.tag}|{canon}".encode()).hexdigest()[:16]

    def _shoot(self) -> Path:
        png = self.page.screenshot(type="png", animations="disabled", caret="hide", timeout=self.timeout_ms)
        self.workdir.mkdir(parents=True, exist_ok=True)
        path = self.workdir / f"step-{self.steps:02d}.png"
        path.write_bytes(png)
        return path

    def _invalid(self, why: str) -> StepResult:
        info = {"action": "invalid", "valid": False, "invalid": True, "hit": None, "target_hit": False}
        info |= {
            "success": False,
            "steps": self.steps,
            "blocked_requests": self.blocked_requests,
            "point": None,
        }
        if self.end_on_invalid or self.steps >= self.max_steps:
            return StepResult(
                None, 0.0, True, info | {"reason": "invalid" if self.end_on_invalid else "max_steps"}
            )
        text = f"invalid action: {why}; {EXPECTED}. {self._left()}"
        return StepResult(Observation(text=text, images=[], state_key=self.state_key), 0.0, False, info)

    def _left(self) -> str:
        left = self.max_steps - self.steps
        return f"{left} action{'s' if left != 1 else ''} left."

    def _abort(self, route: Any) -> None:
        self.blocked_requests += 1
        route.abort()


def _matches(
    step: Any, wanted: dict[str, Any] | None, action: Action, at: str | None, focused: str | None
) -> bool:
    """The action is the oracle's next one (``step`` by element id, ``wanted`` as measured on the screen)."""
    if step is None or wanted is None:
        return False
    if wanted["action"] == "scroll":
        return action.kind == "scroll" and action.text == wanted["direction"]
    if step.action == "back":
        return action.kind == "back" or (action.kind == "click" and at == "back")
    if step.action == "click":
        return action.kind == "click" and at == step.target
    field = at if action.point is not None else focused
    return action.kind == "input_text" and field == step.target and action.text.strip() == step.text


def _check_same_screen(sample: Sample, png: Path) -> None:
    """The sample's first image shows the screen just rendered (byte-equal files, else equal pixels)."""
    import numpy as np
    from PIL import Image

    path = Path(sample.images[0])
    given = path.read_bytes()
    if given == png.read_bytes():
        return
    with Image.open(io.BytesIO(given)) as a, Image.open(png) as b:
        same = a.size == b.size and np.array_equal(np.asarray(a.convert("RGB")), np.asarray(b.convert("RGB")))
    if not same:
        raise ValueError(
            f"sample {sample.id!r}: its image {path.name} is not the app's first screen as Chromium draws it here "
            "(another machine, Chromium or font set made it); rebuild the data on this machine"
        )
