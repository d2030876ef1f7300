"""The run report's HTML page: plots and a gallery of logged rollouts with what each reward saw.

The page is one file with no script and no network access (a Content-Security-Policy forbids both): plots and kept
renders are referenced relative to the run directory (they live there), input images and GUI overlays are embedded
as data URIs (they are made here, or live outside the run). Model text is hostile input: the template escapes every
value (jinja2 autoescape), and file names come from the run directory, never from the model.

What the reward saw:
- rendering rewards (``train.keep_renders``) keep ``renders/step-N/<id>-<j>/<id>-response.png`` next to
  ``<id>-reference.png``, or ``<id>-response.error.txt`` with the reason the response did not render; they are shown
  side by side, never re-rendered;
- rewards that judge a place in the image have an overlay, which each declares when it registers
  (:attr:`mmrl.rewards.base.RewardSpec.overlay`; drawn for the rewards the run used): ``gui_action`` draws the predicted click on the screenshot with the target box, ``pathology`` the predicted
  region over the tissue with the target region; each parses and maps coordinates with its reward's own functions,
  and the model-input size and coordinate frame are rebuilt from the run's ``model`` settings (its checkpoint's
  geometry and family frame, :class:`mmrl.model.checkpoint_files.ModelView`), since rollouts.jsonl keeps no sizes. A new reward
  declares its overlay in ``register_reward(name, overlay="module:function")``;
- videos are shown as key frames (``KEY_FRAMES`` of them, evenly spaced, read by the project's video processor).

Multi-turn episodes (a response with ``turns``, see :mod:`mmrl.rollout.episodes`) are shown as a strip under their response,
one cell per turn and one for the end. A turn's cell shows the screen its action was taken on: the sample's first
image for turn 0, else the last image of the latest earlier turn that had images (an invalid browser action shows
no new screen, so the next action is taken on the same one). Turn images are paths relative to the run directory,
opened like the inputs (a missing file is a placeholder). What the env's ``info`` says is drawn on that screen: a
click's ``point`` (page pixels) as a red dot; a zoom's ``box`` is in the FIRST image's pixels whatever the model was
looking at, so every zoom box of the episode is drawn, numbered by its turn, on each cell that shows the first image
(with the metadata's ``target_box`` in green), and each crop appears as the screen of the turn after it (or in
the end cell, when no turn came after). Below it: the action text, the turn's reward and ✓/✗ badges for
``target_hit``, ``zoom_hit`` and ``correct``. The end cell says how the episode ended and its return. Overlays of
single-turn rewards are not drawn for episodes: they would judge the last turn's text against the first screen.
"""

from __future__ import annotations

import base64
import io
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jinja2
import numpy as np
from PIL import Image, ImageDraw, ImageFont

from mmrl.model.checkpoint_files import ModelView
from mmrl.processors.image import thumbnail
from mmrl.rewards.base import REWARDS, reward_overlay
from mmrl.types import render_stem

THUMB_SIDE = 384  # longest side of an embedded image, in CSS pixels
STRIP_SIDE = 256  # longest side of a screen in an episode's strip
ACTION_LIMIT = 1500  # characters of a turn's action shown
KEY_FRAMES = 4  # frames shown per video
Overlay = Callable[[Image.Image, dict[str, Any], str, tuple[int, int]], "tuple[Image.Image, str] | None"]
TEXT_LIMIT = 4000  # characters of a response shown; the rest is cut with a note


@dataclass
class TurnCell:
    """One cell of an episode's strip: a turn (``turn`` its index) or the end (``turn`` None)."""

    turn: int | None
    image: str  # data URI; "" with ``image_path`` set: the file is missing; both "": no image for this cell
    image_path: str
    seen: str  # which screen the image is ("first image", "turn 2's image", ...)
    action: str = ""
    cut: int = 0  # characters of the action left out
    reward: float | None = None
    badges: list[tuple[str, bool]] = field(default_factory=list)  # (label, passed)
    note: str = ""  # "invalid action", the drawn click or zoom box, the end's error


@dataclass
class EpisodeView:
    cells: list[TurnCell]
    end: str
    ret: float | None  # the episode's return
    turns: int


@dataclass
class ResponseView:
    index: int
    text: str
    cut: int  # characters left out
    finish: str
    reward: float | None
    parts: dict[str, Any]
    renders: list[tuple[str, str]] = field(default_factory=list)  # (caption, relative path)
    render_errors: list[tuple[str, str]] = field(default_factory=list)  # (caption, message)
    overlay: str | None = None  # data URI
    overlay_caption: str = ""
    episode: EpisodeView | None = None  # a multi-turn response's strip


@dataclass
class GroupView:
    step: int
    position: int
    id: str
    prompt: str
    answer: str | None  # None: the record has no reference (an env judges it)
    images: list[tuple[str, str]]  # (data URI or "", caption)
    responses: list[ResponseView]
    mean_reward: float | None

    @property
    def shows_inputs_seen(self) -> bool:
        """Whether any reward of the group left something to show (renders, render errors, a click)."""
        return any(r.renders or r.render_errors or r.overlay for r in self.responses)


def data_uri(img: Image.Image) -> str:
    """A PNG data URI of ``img`` (thumbnails only: the page stays a few MB for a bounded gallery)."""
    buf = io.BytesIO()
    img.save(buf, format="PNG", optimize=True)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def _resolve(path: str, out: Path) -> Path | None:
    """Image paths in rollouts.jsonl are as the trainer saw them: absolute, or relative to where it ran."""
    p = Path(path)
    for cand in (p, Path.cwd() / p, out / p, out.parent / p):
        if cand.is_file():
            return cand
    return None


def _open(path: str, out: Path) -> Image.Image | None:
    found = _resolve(path, out)
    if found is None:
        return None
    try:
        with Image.open(found) as im:
            return im.convert("RGB")
    except (OSError, ValueError):
        return None


def _renders(out: Path, step: int, b: int, j: int, sample_id: str, view: ResponseView) -> None:
    folder = out / "renders" / f"step-{step}" / f"{render_stem(sample_id)}-{j}"
    stem = render_stem(sample_id)
    for name, caption in (("response", "response render"), ("reference", "target render")):
        png, err = folder / f"{stem}-{name}.png", folder / f"{stem}-{name}.error.txt"
        if png.is_file():
            view.renders.append((caption, png.relative_to(out).as_posix()))
        elif err.is_file():
            view.render_errors.append((f"{caption} failed", err.read_text(errors="replace")[:TEXT_LIMIT]))


def overlays(reward_names: list[str]) -> list[Overlay]:
    """The overlays the rewards a run used declared when they registered (:func:`mmrl.rewards.base.reward_overlay`)."""
    found = (reward_overlay(name) for name in dict.fromkeys(reward_names))
    return [fn for fn in found if fn is not None]


def _key_frames(path: str, out: Path) -> list[tuple[str, str]]:
    """``KEY_FRAMES`` evenly spaced frames of a video as (data URI, caption), or one ("", message) entry saying why
    there are none."""
    from mmrl.processors.video import load_video

    found = _resolve(path, out)
    if found is None:
        return [("", f"video not found: {path}")]
    try:
        video = load_video(found, fps=1000.0, min_frames=2, max_frames=64)
    except Exception as e:  # an unreadable video is reported on the page, never fatal to the report
        return [("", f"video {path} unreadable: {e}")]
    frames = video.frames  # [T, H, W, 3] uint8
    pick = sorted({round(i) for i in np.linspace(0, len(frames) - 1, min(KEY_FRAMES, len(frames)))})
    return [
        (
            data_uri(thumbnail(Image.fromarray(frames[i]), THUMB_SIDE)[0]),
            f"{path} frame {video.frame_indices[i]}",
        )
        for i in pick
    ]


def _number(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def _coords(v: Any, n: int) -> tuple[float, ...] | None:
    """``v`` as ``n`` numbers (a point, a box), or None when it is not that."""
    if not isinstance(v, (list, tuple)) or len(v) != n:
        return None
    nums = [float(x) for x in v if _number(x) is not None and np.isfinite(x)]
    return tuple(nums) if len(nums) == n else None


_RED, _GREEN, _WHITE = (220, 0, 0), (0, 170, 0), (255, 255, 255)
_BADGES = (("target_hit", "target"), ("zoom_hit", "zoom hit"), ("correct", "correct"))


def _draw_screen(
    screen: Image.Image,
    point: tuple[float, ...] | None,
    zooms: list[tuple[int, tuple[float, ...]]],
    current: int,
    target: tuple[float, ...] | None,
) -> str:
    """A strip thumbnail of ``screen`` with a click ``point`` (its pixels) as a red dot, and, when given (the
    first image), the episode's ``zooms`` (turn, box in its pixels) numbered in red, turn ``current``'s thicker, over
    the ``target`` box in green."""
    thumb, _ = thumbnail(screen, STRIP_SIDE)
    sx, sy = thumb.width / screen.width, thumb.height / screen.height
    draw = ImageDraw.Draw(thumb)
    if target is not None:
        draw.rectangle(
            [target[0] * sx, target[1] * sy, target[2] * sx, target[3] * sy], outline=_GREEN, width=2
        )
    font = ImageFont.load_default(size=13)
    for k, (x1, y1, x2, y2) in zooms:
        draw.rectangle([x1 * sx, y1 * sy, x2 * sx, y2 * sy], outline=_RED, width=3 if k == current else 1)
        _, _, w, h = draw.textbbox((0, 0), str(k), font=font)
        x, y = (
            x1 * sx,
            (y1 * sy - h - 2 if y1 * sy >= h + 2 else y2 * sy),
        )  # the turn's number above, else below
        draw.rectangle([x, y, x + w + 4, y + h + 2], fill=_RED)
        draw.text((x + 2, y + 1), str(k), fill=_WHITE, font=font)
    if point is not None:
        px, py = point[0] * sx, point[1] * sy
        draw.ellipse([px - 7, py - 7, px + 7, py + 7], fill=_RED, outline=_WHITE, width=2)
    return data_uri(thumb)


def _turn_note(
    info: dict[str, Any],
    point: tuple[float, ...] | None,
    box: tuple[float, ...] | None,
    on_first: bool,
    size: tuple[int, int] | None,
) -> str:
    action = str(info.get("action") or "action")
    if info.get("invalid") or action == "invalid":
        return "invalid action: the screen stays"
    if point is not None:
        off = size is not None and not (0 <= point[0] <= size[0] and 0 <= point[1] <= size[1])
        return f"{action} at ({point[0]:g}, {point[1]:g}){' (off screen)' if off else ''}"
    if box is not None:
        where = "" if on_first else " (drawn on the first image)"
        return f"{action} [{', '.join(f'{v:g}' for v in box)}]{where}"
    return action


def _screens(first: str, turns: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """(path, what it is) of the screen each turn acted on, then of the screen after the last turn."""
    out = [(first, "the first image")]
    for k, turn in enumerate(turns):
        images = turn.get("images")
        new = [str(p) for p in images] if isinstance(images, list) else []
        out.append((new[-1], f"turn {k}'s image") if new else out[-1])
    return out


def episode_view(row: dict[str, Any], response: dict[str, Any], out: Path) -> EpisodeView | None:
    """The strip of a multi-turn ``response`` (one with ``turns``; None for a single-turn one), see the module
    docstring for which screen each cell shows and what is drawn on it."""
    if not isinstance(response.get("turns"), list):
        return None
    turns = [t for t in response["turns"] if isinstance(t, dict)]
    episode = response.get("episode") if isinstance(response.get("episode"), dict) else {}
    meta = row.get("metadata") if isinstance(row.get("metadata"), dict) else {}
    # the env's info, with its per-step verdict (the record keeps target_hit beside info; older logs inside it)
    infos = [
        (t.get("info") if isinstance(t.get("info"), dict) else {})
        | ({"target_hit": t["target_hit"]} if isinstance(t.get("target_hit"), bool) else {})
        for t in turns
    ]
    zooms = [(k, b) for k, info in enumerate(infos) if (b := _coords(info.get("box"), 4)) is not None]
    target = _coords(meta.get("target_box"), 4)
    first = str((row.get("images") or [""])[0])
    screens = _screens(first, turns)
    opened = {path: _open(path, out) if path else None for path, _ in screens}
    cells = []
    for k, (turn, info, (path, seen)) in enumerate(zip(turns, infos, screens)):
        im, on_first = opened[path], path == first
        point, box = _coords(info.get("point"), 2), _coords(info.get("box"), 4)
        boxes, goal = (zooms, target) if on_first else ([], None)  # in the first image's pixels
        shown = "" if im is None else _draw_screen(im, point, boxes, k, goal)
        action = str(turn.get("action", ""))
        cells.append(
            TurnCell(
                turn=k,
                image=shown,
                image_path=path,
                seen=seen,
                action=action[:ACTION_LIMIT],
                cut=max(0, len(action) - ACTION_LIMIT),
                reward=_number(turn.get("reward")),
                badges=[(label, info[key]) for key, label in _BADGES if isinstance(info.get(key), bool)],
                note=_turn_note(info, point, box, on_first, im.size if im is not None else None),
            )
        )
    path, seen = screens[-1] if len(screens) > 1 and screens[-1] != screens[-2] else ("", "")
    final = opened.get(path)  # the screen the last turn brought, never acted on
    image = _draw_screen(final, None, [], -1, None) if final is not None else ""
    cells.append(
        TurnCell(turn=None, image=image, image_path=path, seen=seen, note=str(episode.get("error") or ""))
    )
    return EpisodeView(
        cells=cells,
        end=str(episode.get("end", "?")),
        ret=_number(episode.get("return")),
        turns=len(turns),
    )


def group_view(
    row: dict[str, Any], position: int, out: Path, model: ModelView, draw: list[Overlay] | None = None
) -> GroupView:
    """One logged group: its inputs, every response with its reward and parts, and what the reward saw (``draw``:
    the overlays of the run's rewards, see :func:`overlays`)."""
    step, sid, answer = int(row.get("step", 0)), str(row.get("id", "?")), row.get("answer")
    loaded = [(p, _open(str(p), out)) for p in row.get("images") or []]
    images = [(data_uri(thumbnail(im, THUMB_SIDE)[0]) if im else "", str(p)) for p, im in loaded]
    for v in row.get("videos") or []:
        images += _key_frames(str(v), out)
    screen = loaded[0][1] if loaded else None
    responses = []
    for j, r in enumerate(row.get("responses") or []):
        text = str(r.get("text", ""))
        parts = r.get("parts") or {}
        view = ResponseView(
            index=j,
            text=text[:TEXT_LIMIT],
            cut=max(0, len(text) - TEXT_LIMIT),
            finish=str(r.get("finish", "")),
            reward=_number(r.get("reward")),
            parts=parts if isinstance(parts, dict) else {},
        )
        _renders(out, step, position, j, sid, view)
        view.episode = episode_view(row, r, out)
        for fn in (draw or []) if screen is not None and view.episode is None else []:
            shown = fn(screen, row, text, model)
            if shown is not None:
                view.overlay, view.overlay_caption = data_uri(thumbnail(shown[0], THUMB_SIDE)[0]), shown[1]
                break
        responses.append(view)
    scores = [v.reward for v in responses if v.reward is not None]
    return GroupView(
        step=step,
        position=position,
        id=sid,
        prompt=str(row.get("prompt") or ""),
        answer=None if answer is None else answer if isinstance(answer, str) else json.dumps(answer),
        images=images,
        responses=responses,
        mean_reward=sum(scores) / len(scores) if scores else None,
    )


def gallery(
    rollouts: list[dict[str, Any]],
    out: Path,
    model: ModelView,
    max_steps: int,
    reward_names: list[str] | None = None,
) -> list[GroupView]:
    """The groups of the ``max_steps`` latest logged steps, latest first, in the order each step logged them;
    ``model`` is how the run's model saw images (:meth:`ModelView.of_model` of its ``model`` settings); ``reward_names`` the run's rewards (their
    overlays are drawn; None: every reward's that declares one, each drawing only the rows it can read)."""
    draw = overlays(reward_names if reward_names is not None else REWARDS.names())
    by_step: dict[int, list[dict[str, Any]]] = {}
    for row in rollouts:
        by_step.setdefault(int(row.get("step", 0)), []).append(row)
    views = []
    for step in sorted(by_step, reverse=True)[:max_steps]:
        views += [group_view(row, b, out, model, draw) for b, row in enumerate(by_step[step])]
    return views


_TEMPLATE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="Content-Security-Policy"
 content="default-src 'none'; img-src data: file: 'self'; style-src 'unsafe-inline'">
<title>mmrl report: {{ name }}</title>
<style>
body { font: 14px/1.4 system-ui, sans-serif; margin: 1.5em; color: #222; }
table { border-collapse: collapse; } td, th { border: 1px solid #ccc; padding: 2px 6px; vertical-align: top; }
pre { white-space: pre-wrap; word-break: break-word; margin: 0; max-height: 24em; overflow: auto;
      background: #f6f6f6; padding: 4px; }
.plots img { max-width: 600px; margin: 4px; border: 1px solid #ddd; }
.group { border: 1px solid #bbb; border-radius: 6px; padding: 10px; margin: 14px 0; }
.inputs img { max-width: 384px; min-width: 112px; image-rendering: pixelated; border: 1px solid #ddd; }
.saw img { max-width: 384px; border: 1px solid #ddd; margin-right: 6px; }
.saw figure { display: inline-block; margin: 0 8px 4px 0; vertical-align: top; }
.good { color: #070; } .bad { color: #a00; } .muted { color: #777; }
.strip { display: flex; gap: 8px; overflow-x: auto; padding: 2px 0 6px; max-width: calc(100vw - 100px); }
.cell { flex: 0 0 auto; width: 262px; border: 1px solid #ccc; border-radius: 4px; padding: 4px; background: #fafafa;
        font-size: 12px; }
.cell.end { width: auto; min-width: 170px; max-width: 262px; background: #eef0f8; }
.cell img { display: block; max-width: 256px; max-height: 256px; min-width: 96px; border: 1px solid #ddd; }
.cell pre { max-height: 9em; font-size: 12px; margin: 3px 0; }
.missing { width: 256px; height: 96px; display: flex; align-items: center; justify-content: center; text-align: center;
           background: #eee; border: 1px dashed #bbb; color: #a00; word-break: break-all; }
.badge { border: 1px solid currentColor; border-radius: 3px; padding: 0 3px; white-space: nowrap; }
</style></head><body>
<h1>Run report: {{ name }}</h1>
<table>{% for k, v in summary %}<tr><th>{{ k }}</th><td>{{ v }}</td></tr>{% endfor %}</table>
<h2>Curves</h2>
<div class="plots">{% for p in plots %}<img src="{{ p }}" alt="{{ p }}">{% endfor %}
{% if not plots %}<p class="muted">no metrics logged yet</p>{% endif %}</div>
<h2>Sample rollouts</h2>
<p class="muted">{{ groups|length }} logged groups of the {{ shown_steps }} latest logged steps (of {{ total_steps }}),
latest first.</p>
{% for g in groups %}<div class="group">
<h3>step {{ g.step }} &middot; group {{ g.position }} &middot; {{ g.id }}
{% if g.mean_reward is not none %}&middot; mean reward {{ "%.3f"|format(g.mean_reward) }}{% endif %}</h3>
<div class="inputs">{% for uri, path in g.images %}{% if uri %}<img src="{{ uri }}" alt="input image"
 title="{{ path }}">{% else %}<span class="bad">image not found: {{ path }}</span>{% endif %}{% endfor %}</div>
<p><b>prompt</b></p><pre>{{ g.prompt }}</pre>
{% if g.answer is not none %}<p><b>answer</b></p><pre>{{ g.answer }}</pre>{% endif %}
<table><tr><th>#</th><th>reward</th><th>parts</th><th>response</th>
{% if g.shows_inputs_seen %}<th>what the reward saw</th>{% endif %}</tr>
{% for r in g.responses %}<tr>
<td>{{ r.index }}</td>
<td class="{{ 'good' if r.reward and r.reward > 0 else 'bad' }}">{{ "%.3f"|format(r.reward)
 if r.reward is not none else "none" }}</td>
<td>{% for k, v in r.parts.items() %}{{ k }}: {{ "%.3f"|format(v) if v is number else v }}<br>{% endfor %}</td>
<td><pre>{{ r.text }}</pre>{% if r.cut %}<span class="muted">({{ r.cut }} more characters)</span>{% endif %}
<span class="muted">finish: {{ r.finish }}</span></td>
{% if g.shows_inputs_seen %}<td class="saw">{% for cap, src in r.renders %}<figure><img src="{{ src }}" alt="{{ cap }}">
<figcaption>{{ cap }}</figcaption></figure>{% endfor %}
{% for cap, msg in r.render_errors %}<p class="bad">{{ cap }}:</p><pre>{{ msg }}</pre>{% endfor %}
{% if r.overlay %}<figure><img src="{{ r.overlay }}" alt="prediction and target drawn on the input">
<figcaption>{{ r.overlay_caption }}</figcaption></figure>{% endif %}</td>{% endif %}
</tr>{% if r.episode %}<tr><td colspan="{{ 5 if g.shows_inputs_seen else 4 }}">
<div class="strip" title="episode of response {{ r.index }}">{% for c in r.episode.cells %}
<div class="cell{{ ' end' if c.turn is none }}">
{% if c.image %}<img src="{{ c.image }}" alt="{{ 'episode screen' if c.turn is not none else 'final screen' }}"
 title="{{ c.image_path }}">{% elif c.image_path %}<div class="missing">image not found: {{ c.image_path }}</div>
{% elif c.turn is not none %}<div class="missing">no screen logged</div>{% endif %}
{% if c.turn is not none %}<div><b>turn {{ c.turn }}</b> <span class="muted">on {{ c.seen }}</span> &middot;
reward {{ "%.3f"|format(c.reward) if c.reward is not none else "none" }}
{% for label, ok in c.badges %}<span class="badge {{ 'good' if ok else 'bad' }}">{{ label }}
{{- " ✓" if ok else " ✗" }}</span> {% endfor %}</div>
<pre>{{ c.action }}</pre>{% if c.cut %}<span class="muted">({{ c.cut }} more characters)</span>{% endif %}
<div class="muted">{{ c.note }}</div>
{% else %}{% if c.image %}<div class="muted">{{ c.seen }}, not acted on</div>{% endif %}
<div><b>end: {{ r.episode.end }}</b></div>
<div>return {{ "%.3f"|format(r.episode.ret) if r.episode.ret is not none else "none" }}
&middot; {{ r.episode.turns }} turn{{ "s" if r.episode.turns != 1 }}</div>
{% if c.note %}<pre class="bad">{{ c.note }}</pre>{% endif %}{% endif %}
</div>{% endfor %}</div></td></tr>{% endif %}{% endfor %}</table></div>
{% endfor %}
{% if not groups %}<p class="muted">no rollouts logged yet (rollouts.jsonl is empty or missing)</p>{% endif %}
</body></html>
"""


def render_page(
    name: str,
    summary: list[tuple[str, str]],
    plots: list[str],
    groups: list[GroupView],
    shown_steps: int,
    total_steps: int,
) -> str:
    """The page's HTML; every value is escaped by the template."""
    env = jinja2.Environment(autoescape=True, undefined=jinja2.StrictUndefined)
    return env.from_string(_TEMPLATE).render(
        name=name,
        summary=summary,
        plots=plots,
        groups=groups,
        shown_steps=shown_steps,
        total_steps=total_steps,
    )
