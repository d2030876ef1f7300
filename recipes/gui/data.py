"""Synthetic GUI screens with exact element boxes and UI-R1-style action instructions (the gui recipe's data).

Each screen is an HTML page composed from a seeded RNG (an app bar with icons, a search field, form fields,
button rows, a list, a tab bar or sidebar, or a phone home screen of app icons) and rendered by Chromium
through :class:`ScreenRenderer`, a :class:`mmrl.rewards.html_sandbox.HtmlRenderer` (network blocked, rlimits)
that takes a full-viewport colour screenshot and measures every element marked ``data-gui`` with
``getBoundingClientRect`` in the same page. Boxes are in screenshot pixels (CSS pixels times the screen's
device scale factor). An element is a target only when it lies wholly inside the viewport and
``elementFromPoint`` at its centre lands on it, so a box is never hidden under a sticky bar or cut by the
screen's edge.

Instructions and answers follow UI-R1's action schema (docs/rewards.md#domain-rewards) as the ``gui_action`` reward reads
it:

- click ("tap Settings", "click the search icon"): ``{"action": "click", "bbox": [x1, y1, x2, y2]}``;
- input_text ("type 'hello' in the search field"): ``{"action": "input_text", "text": "hello"}`` plus the
  field's ``bbox``;
- scroll ("scroll down"): ``{"action": "scroll", "text": "down"}`` (GUI-R1 carries the direction as the text);
- navigate_back ("go back"): ``{"action": "navigate_back"}``;
- open_app, on home screens ("open the Camera app"): ``{"action": "open_app", "text": "Camera"}``.

Everything is drawn from ``random.Random(seed)`` and Chromium renders the same page to the same pixels, so
``build(folder, seed=s)`` reproduces the same records and images.
"""

from __future__ import annotations

import contextlib
import html as html_lib
import json
import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mmrl.model.checkpoint_files import ModelView
from mmrl.processors.geometry import original_to_model
from mmrl.rewards.html_sandbox import ChromiumCrash, HtmlRenderer, LeftOut

logger = logging.getLogger("mmrl.recipes.gui")

ACTIONS = ("click", "input_text", "scroll", "navigate_back", "open_app")
PROMPT = (
    "<image>You are operating a {device} screen. Instruction: {instruction}\n"
    "First think inside <think></think>, then give the action inside <answer></answer> as "
    "[{{'action': one of 'click', 'input_text', 'scroll', 'navigate_back', 'open_app', "
    "'coordinate': [x, y], 'input_text': text}}]: a coordinate for click, the text to type for input_text, "
    "'up' or 'down' for scroll, the app's name for open_app."
)


@dataclass(frozen=True)
class Screen:
    """A viewport in CSS pixels and its device scale factor: the screenshot is ``width * scale`` wide."""

    name: str
    device: str  # "phone" or "desktop": the layout family and the instruction verb (tap / click)
    width: int
    height: int
    scale: float = 1.0

    @property
    def pixel_size(self) -> tuple[int, int]:
        return round(self.width * self.scale), round(self.height * self.scale)


SCREENS = {
    s.name: s
    for s in (
        Screen("phone", "phone", 360, 640),
        Screen("phone_hidpi", "phone", 360, 640, 1.5),
        Screen("phone_tall", "phone", 412, 892),
        Screen("desktop", "desktop", 1024, 640),
        Screen("desktop_wide", "desktop", 1280, 800),
    )
}
DEFAULT_WEIGHTS = {"click": 0.5, "input_text": 0.2, "scroll": 0.1, "navigate_back": 0.1, "open_app": 0.1}

# Inline SVG paths on a 24x24 grid, drawn with the current text colour.
_SVG = {
    "back": '<path d="M15 5 8 12l7 7" fill="none" stroke="currentColor" stroke-width="2.5"/>',
    "search": '<circle cx="10" cy="10" r="6" fill="none" stroke="currentColor" stroke-width="2.5"/>'
    '<path d="m15 15 6 6" stroke="currentColor" stroke-width="2.5"/>',
    "menu": '<path d="M3 6h18M3 12h18M3 18h18" stroke="currentColor" stroke-width="2.5"/>',
    "more": '<circle cx="12" cy="5" r="2" fill="currentColor"/>'
    '<circle cx="12" cy="12" r="2" fill="currentColor"/><circle cx="12" cy="19" r="2" fill="currentColor"/>',
    "add": '<path d="M12 4v16M4 12h16" stroke="currentColor" stroke-width="2.5"/>',
    "close": '<path d="m5 5 14 14M19 5 5 19" stroke="currentColor" stroke-width="2.5"/>',
    "home": '<path d="M3 11 12 3l9 8v10h-6v-6H9v6H3z" fill="currentColor"/>',
    "share": '<circle cx="6" cy="12" r="3" fill="currentColor"/><circle cx="18" cy="5" r="3" '
    'fill="currentColor"/><circle cx="18" cy="19" r="3" fill="currentColor"/>'
    '<path d="m6 12 12-7M6 12l12 7" stroke="currentColor" stroke-width="2"/>',
    "delete": '<path d="M5 7h14M9 7V4h6v3M7 7l1 13h8l1-13" fill="none" stroke="currentColor" '
    'stroke-width="2"/>',
}
# Unicode glyphs (DejaVu Sans has them) for the other icons.
_GLYPHS = {
    "settings": "\u2699",
    "favorite": "\u2665",
    "star": "\u2605",
    "edit": "\u270e",
    "music": "\u266a",
}
ICONS = tuple(_SVG) + tuple(_GLYPHS)


def _names(joined: str) -> tuple[str, ...]:
    return tuple(joined.split("|"))


LISTS = {
    "Settings": _names(
        "Wi-Fi|Bluetooth|Display|Sound|Battery|Storage|Privacy|Location|Accounts|Notifications|"
        "Security|Language|Date and time|Accessibility|About phone"
    ),
    "Contacts": _names(
        "Ana Lima|Ben Okafor|Chloe Martin|David Chen|Elena Rossi|Farid Haddad|Grace Kim|"
        "Hugo Silva|Ines Costa|Jonas Berg|Kira Novak|Liam Walsh|Mia Tanaka|Noah Schmidt"
    ),
    "Music": _names(
        "Morning Light|Blue Harbour|Paper Planes|Slow River|Neon Nights|Old Friends|Golden Hour|"
        "Rainfall|City Lights|Open Road|Quiet Storm|Summer Air"
    ),
    "Files": _names(
        "Documents|Downloads|Pictures|Videos|Music files|Invoices|Recipes|Travel plans|Backups|"
        "Screenshots|Reports|Drafts"
    ),
    "Mail": _names(
        "Inbox|Starred|Sent|Drafts folder|Archive|Spam|Trash|Receipts|Newsletters|Work|Family|Travel"
    ),
    "Shop": _names(
        "Shoes|Jackets|Backpacks|Watches|Sunglasses|Hats|Scarves|Gloves|Belts|Wallets|Socks|T-shirts"
    ),
}
BUTTONS = _names(
    "Save|Cancel|Send|Submit|Next|Done|Edit|Delete|Share|Log in|Sign up|Apply|Reset|Add|Continue|"
    "Download|Refresh|Skip|Confirm|Upload|Buy now|Follow|Play|Pause"
)
FIELDS = _names("Name|Email|Phone|Password|Address|City|Message|Username|Title|Note|Company|Website")
TEXTS = _names(
    "hello|coffee shops|Ana Lima|meeting at 5|pizza near me|ana@example.com|weather tomorrow|"
    "flights to Lisbon|happy birthday|blue jacket|12 Main Street|see you soon|project notes|"
    "running shoes|jazz playlist"
)
TABS = _names("Home|Explore|Library|Profile|Favorites|Inbox|Updates|Friends")
APPS = _names(
    "Camera|Clock|Maps|Mail|Photos|Music|Calendar|Weather|Notes|Phone|Messages|Files|Calculator|"
    "Browser|Store|Podcasts|Wallet|Fitness|News|Translate"
)
THEMES = (  # primary, background, text
    ("#1565c0", "#ffffff", "#202124"),
    ("#2e7d32", "#fafafa", "#1b1b1b"),
    ("#6a1b9a", "#ffffff", "#222"),
    ("#c62828", "#fffdf7", "#262626"),
    ("#37474f", "#f4f6f8", "#111"),
    ("#00838f", "#ffffff", "#1d1d1d"),
)

_MEASURE_JS = """(toBottom) => {
  if (toBottom) window.scrollTo(0, document.documentElement.scrollHeight);
  const vw = window.innerWidth, vh = window.innerHeight;
  const boxes = Array.from(document.querySelectorAll('[data-gui]')).map(e => {
    const r = e.getBoundingClientRect();
    const hit = document.elementFromPoint(r.left + r.width / 2, r.top + r.height / 2);
    const inside = r.width > 0 && r.height > 0 && r.left >= 0 && r.top >= 0
                   && r.right <= vw && r.bottom <= vh;
    return {id: e.dataset.gui, x1: r.left, y1: r.top, x2: r.right, y2: r.bottom,
            visible: inside && hit !== null && (hit === e || e.contains(hit))};
  });
  return {boxes, scrollY: window.scrollY,
          maxScroll: document.documentElement.scrollHeight - vh};
}"""


@dataclass
class Shot:
    """One rendered screen: the PNG bytes, every ``data-gui`` element's box in screenshot pixels (``visible``
    when it is wholly on screen and hit-tests to itself), and how far the page can still scroll each way."""

    png: bytes
    boxes: dict[str, dict[str, Any]]
    can_scroll_down: bool
    can_scroll_up: bool


class ScreenRenderer(HtmlRenderer):
    """The project's Chromium renderer, for trusted generated pages: full-viewport colour screenshots at a
    screen's size and scale, with element boxes measured in the same page. One browser context per screen is
    kept and its page reused (the pages come from this module, so no state can leak between untrusted inputs);
    requests stay blocked by the parent's route handler and proxy."""

    def __init__(self, **kwargs: Any):
        super().__init__(**kwargs)
        self._pages: dict[Screen, Any] = {}

    def close(self) -> None:
        self._pages = {}
        super().close()

    def _forget(self, screen: Screen) -> None:
        """Drop ``screen``'s page after a crash (its context closed if the browser still runs): the next shot
        opens a new one."""
        page = self._pages.pop(screen, None)
        if page is not None and not self._browser_dead:
            self._guarded(page.context.close)

    def page(self, screen: Screen):
        """The reused Playwright page for ``screen`` (it keeps the last page shot on it, scrolled as it
        was)."""
        self.ensure_browser()  # a relaunch forgets the pages (close)
        if screen not in self._pages:
            context = self._browser.new_context(
                viewport={"width": screen.width, "height": screen.height},
                device_scale_factor=screen.scale,
                java_script_enabled=False,
                service_workers="block",
                accept_downloads=False,
            )
            context.route("**/*", self._abort)
            self._pages[screen] = context.new_page()
        return self._pages[screen]

    def shoot(
        self, html: str, screen: Screen, *, scrolled_to_bottom: bool = False, timeout_ms: int = 15000
    ) -> Shot:
        """Render ``html`` on ``screen`` (scrolled to the bottom when asked) and measure its ``data-gui``
        elements. A crash of Chromium is retried on a new page (:meth:`retry_crashes`), then raises
        :class:`ChromiumCrash`; any other failure raises RuntimeError; both name the screen."""

        def attempt() -> tuple[dict[str, Any], bytes]:
            page = self.page(screen)
            page.set_content(html, timeout=timeout_ms, wait_until="load")
            data = page.evaluate(_MEASURE_JS, scrolled_to_bottom)
            return data, page.screenshot(timeout=timeout_ms, animations="disabled", caret="hide")

        try:
            data, png = self.retry_crashes(attempt, f"screen {screen.name!r}", lambda: self._forget(screen))
        except ChromiumCrash:
            raise
        except Exception as e:  # Playwright's Error/TimeoutError: start afresh next time
            self._browser_dead = True
            raise RuntimeError(
                f"screen {screen.name!r}: Chromium failed to render a generated page: {e}"
            ) from e
        s = screen.scale
        boxes = {
            b["id"]: {
                "bbox": [round(b[k] * s, 2) for k in ("x1", "y1", "x2", "y2")],
                "visible": b["visible"],
            }
            for b in data["boxes"]
        }
        return Shot(png, boxes, data["maxScroll"] - data["scrollY"] > 8, data["scrollY"] > 8)


@dataclass
class Element:
    """An element the instructions can name: ``id`` is its ``data-gui`` value."""

    id: str
    kind: str  # button, icon, field, list_item, tab, app
    name: str


@dataclass
class Layout:
    html: str
    kind: str  # app, form, desktop, home
    elements: list[Element] = field(default_factory=list)
    has_back: bool = False


class _Builder:
    """Collects marked elements while a layout's HTML is written."""

    def __init__(self) -> None:
        self.elements: list[Element] = []

    def mark(self, kind: str, name: str) -> str:
        eid = f"e{len(self.elements)}"
        self.elements.append(Element(eid, kind, name))
        return f'data-gui="{eid}"'

    def icon(self, name: str, size: int, glyph_font: int) -> str:
        label = html_lib.escape(name)
        if name in _SVG:
            body = f'<svg width="{size - 12}" height="{size - 12}" viewBox="0 0 24 24">{_SVG[name]}</svg>'
        else:
            body = f'<span style="font-size:{glyph_font}px;line-height:1">{_GLYPHS[name]}</span>'
        return f'<button class="icon" aria-label="{label}" {self.mark("icon", name)}>{body}</button>'

    def button(self, name: str, alt: bool) -> str:
        cls = "btn alt" if alt else "btn"
        return f'<button class="{cls}" {self.mark("button", name)}>{html_lib.escape(name)}</button>'

    def field(self, name: str, search: bool) -> str:
        label = "" if search else f"<label>{html_lib.escape(name)}</label>"
        hint = "Search" if search else f"Enter {name.lower()}"
        kind_name = "search" if search else name
        return f'{label}<input class="field" placeholder="{hint}" {self.mark("field", kind_name)}>'


def _style(
    rng: random.Random, device: str, metrics: dict[str, int] | None = None
) -> tuple[str, dict[str, int]]:
    """The page's CSS in a random theme; sizes are drawn at random unless ``metrics`` fixes them."""
    primary, bg, fg = rng.choice(THEMES)
    m = metrics or {
        "font": rng.choice((13, 14, 15, 16) if device == "phone" else (13, 14, 15)),
        "icon": rng.choice((36, 40, 44, 48)),
        "pad": rng.choice((8, 10, 12, 14)),
        "radius": rng.choice((0, 4, 8, 18)),
        "row": rng.choice((10, 12, 14, 16)),
    }
    css = f"""*{{box-sizing:border-box}}
body{{margin:0;font-family:'DejaVu Sans',sans-serif;font-size:{m["font"]}px;background:{bg};color:{fg}}}
.bar{{display:flex;align-items:center;gap:4px;padding:6px 8px;background:{primary};color:#fff;
 position:sticky;top:0;z-index:2}}
.bar h1{{font-size:{m["font"] + 4}px;flex:1;margin:0 6px;font-weight:600}}
.icon{{width:{m["icon"]}px;height:{m["icon"]}px;display:inline-flex;align-items:center;justify-content:center;
 border:none;background:none;color:inherit;padding:0;border-radius:50%}}
.btn{{padding:{m["pad"]}px {m["pad"] * 2}px;border-radius:{m["radius"]}px;border:2px solid {primary};
 background:{primary};color:#fff;font:inherit;margin:6px}}
.btn.alt{{background:transparent;color:{primary}}}
.row{{display:flex;flex-wrap:wrap;padding:6px}}
label{{display:block;margin:10px 14px 4px;font-weight:600}}
.field{{display:block;margin:4px 14px;width:calc(100% - 28px);padding:{m["pad"]}px;font:inherit;
 border:1px solid #999;border-radius:{min(m["radius"], 8)}px;background:#fff}}
ul{{list-style:none;margin:0;padding:0}}
li{{padding:{m["row"]}px 16px;border-bottom:1px solid #ddd}}
li span{{display:inline-block}}
.nav{{display:flex;position:fixed;bottom:0;left:0;right:0;background:{bg};border-top:1px solid #bbb;
 z-index:2}}
.nav div{{flex:1;text-align:center;padding:10px 2px;color:{primary}}}
.side{{width:200px;background:{primary};color:#fff;min-height:100vh;padding-top:10px;flex:none}}
.side div{{padding:{m["row"]}px 18px}}
.grid{{display:grid;grid-template-columns:repeat(4,1fr);gap:18px 6px;padding:30px 12px}}
.app{{display:flex;flex-direction:column;align-items:center;font-size:12px;gap:6px}}
.app b{{width:52px;height:52px;border-radius:14px;display:flex;align-items:center;justify-content:center;
 color:#fff;font-size:22px}}
.fab{{position:fixed;right:18px;bottom:72px;width:56px;height:56px;border-radius:50%;background:{primary};
 color:#fff;border:none;display:flex;align-items:center;justify-content:center;z-index:2}}"""
    return css, m


def _page(css: str, body: str) -> str:
    head = f'<meta charset="utf-8"><style>{css}</style>'
    return f"<!doctype html><html><head>{head}</head><body>{body}</body></html>"


def _pick_names(rng: random.Random, pool: tuple[str, ...], k: int, used: set[str]) -> list[str]:
    """``k`` names from ``pool`` not yet used on this screen, so every instruction names one element."""
    free = [n for n in pool if n.lower() not in used]
    names = rng.sample(free, min(k, len(free)))
    used.update(n.lower() for n in names)
    return names


def _app_bar(
    b: _Builder, rng: random.Random, title: str, m: dict[str, int], back: bool, used: set[str]
) -> str:
    icons = _pick_names(rng, tuple(i for i in ICONS if i != "back"), rng.randint(1, 3), used)
    left = b.icon("back", m["icon"], m["font"] + 8) if back else b.icon("menu", m["icon"], m["font"] + 8)
    used.add("back" if back else "menu")
    right = "".join(b.icon(i, m["icon"], m["font"] + 8) for i in icons if i != "menu")
    return f'<div class="bar">{left}<h1>{html_lib.escape(title)}</h1>{right}</div>'


def _list(b: _Builder, rng: random.Random, title: str, used: set[str], n: tuple[int, int]) -> str:
    items = _pick_names(rng, LISTS[title], rng.randint(*n), used)
    return (
        "<ul>"
        + "".join(f"<li {b.mark('list_item', it)}><span>{html_lib.escape(it)}</span></li>" for it in items)
        + "</ul>"
    )


def _buttons(b: _Builder, rng: random.Random, used: set[str], n: tuple[int, int]) -> str:
    names = _pick_names(rng, BUTTONS, rng.randint(*n), used)
    return '<div class="row">' + "".join(b.button(x, alt=rng.random() < 0.4) for x in names) + "</div>"


def _fields(b: _Builder, rng: random.Random, used: set[str], n: tuple[int, int]) -> str:
    return "".join(b.field(x, search=False) for x in _pick_names(rng, FIELDS, rng.randint(*n), used))


def _phone_app(rng: random.Random) -> Layout:
    b, used = _Builder(), set()
    css, m = _style(rng, "phone")
    title = rng.choice(tuple(LISTS))
    back = rng.random() < 0.7
    parts = [_app_bar(b, rng, title, m, back, used)]
    if rng.random() < 0.6:
        parts.append('<div style="height:8px"></div>' + b.field("search", search=True))
    form = rng.random() < 0.35
    if form:
        parts += [_fields(b, rng, used, (2, 4)), _buttons(b, rng, used, (1, 3))]
    parts.append(_list(b, rng, title, used, (3, 12) if form else (5, 14)))
    if rng.random() < 0.5:
        parts.append(_buttons(b, rng, used, (1, 2)))
    if rng.random() < 0.5:
        tabs = _pick_names(rng, TABS, rng.randint(3, 4), used)
        parts.append(
            '<div class="nav">' + "".join(f"<div {b.mark('tab', t)}>{t}</div>" for t in tabs) + "</div>"
        )
        parts.append('<div style="height:60px"></div>')
    if rng.random() < 0.3 and "add" not in used:
        used.add("add")
        parts.append(
            f'<button class="fab" aria-label="add" {b.mark("icon", "add")}>'
            f'<svg width="26" height="26" viewBox="0 0 24 24">{_SVG["add"]}</svg></button>'
        )
    return Layout(_page(css, "".join(parts)), "form" if form else "app", b.elements, back)


def _desktop_app(rng: random.Random) -> Layout:
    b, used = _Builder(), set()
    css, m = _style(rng, "desktop")
    title = rng.choice(tuple(LISTS))
    back = rng.random() < 0.5
    side_names = _pick_names(rng, TABS, rng.randint(3, 6), used)
    side = '<div class="side">' + "".join(f"<div {b.mark('tab', t)}>{t}</div>" for t in side_names) + "</div>"
    main = [_app_bar(b, rng, title, m, back, used)]
    main.append(
        '<div style="display:flex;gap:8px;align-items:center">' + _buttons(b, rng, used, (2, 4)) + "</div>"
    )
    if rng.random() < 0.6:
        main.append('<div style="max-width:420px">' + b.field("search", search=True) + "</div>")
    columns = [_list(b, rng, title, used, (4, 14))]
    if rng.random() < 0.6:
        columns.append(
            f'<div style="flex:1">{_fields(b, rng, used, (2, 4))}{_buttons(b, rng, used, (1, 2))}</div>'
        )
    cols = "".join(f'<div style="flex:1;min-width:0">{c}</div>' for c in columns)
    main.append(f'<div style="display:flex">{cols}</div>')
    body = f'<div style="display:flex">{side}<div style="flex:1">{"".join(main)}</div></div>'
    return Layout(_page(css, body), "desktop", b.elements, back)


def _home(rng: random.Random) -> Layout:
    b = _Builder()
    css, _ = _style(rng, "phone")
    apps = rng.sample(APPS, rng.randint(8, 16))
    tiles = "".join(
        f'<div class="app" {b.mark("app", a)}><b style="background:{rng.choice(THEMES)[0]}">{a[0]}</b>'
        f"<span>{a}</span></div>"
        for a in apps
    )
    time_text = f"{rng.randint(6, 22)}:{rng.randint(0, 59):02d}"
    clock = f'<div style="text-align:center;font-size:44px;padding-top:40px">{time_text}</div>'
    return Layout(_page(css, clock + f'<div class="grid">{tiles}</div>'), "home", b.elements, False)


def make_layout(rng: random.Random, screen: Screen, *, home: bool = False) -> Layout:
    """A random screen for ``screen``'s device: an app or form screen, or on phones a home screen of app icons
    (when ``home``, else one time in six)."""
    if screen.device == "desktop":
        return _desktop_app(rng)
    return _home(rng) if home or rng.random() < 1 / 6 else _phone_app(rng)


def _click_instruction(rng: random.Random, el: Element, verb: str) -> str:
    name = el.name
    templates = {
        "button": (f"{verb} {name}", f"{verb} the {name} button", f"press {name}"),
        "icon": (f"{verb} the {name} icon",),
        "field": (f"{verb} the {name} field",),
        "list_item": (f"{verb} {name}", f"open {name}", f"select {name}"),
        "tab": (f"{verb} the {name} tab", f"switch to {name}"),
        "app": (f"{verb} the {name} icon",),
    }
    return rng.choice(templates[el.kind])


def _task(
    rng: random.Random, action: str, layout: Layout, shot: Shot, verb: str
) -> tuple[str, dict, Element | None]:
    """(instruction, reference answer, target element) for ``action`` on this screen, or raises LookupError
    when the screen offers no such action (the caller draws another)."""
    on_screen = [e for e in layout.elements if shot.boxes[e.id]["visible"]]
    if action == "click":
        el = rng.choice(on_screen)
        return _click_instruction(rng, el, verb), {"action": "click", "bbox": shot.boxes[el.id]["bbox"]}, el
    if action == "input_text":
        fields = [e for e in on_screen if e.kind == "field"]
        if not fields:
            raise LookupError
        el, text = rng.choice(fields), rng.choice(TEXTS)
        where = "the search field" if el.name == "search" else f"the {el.name} field"
        instruction = rng.choice((f"type '{text}' in {where}", f"enter '{text}' in {where}"))
        return instruction, {"action": "input_text", "text": text, "bbox": shot.boxes[el.id]["bbox"]}, el
    if action == "scroll":
        directions = [d for d, ok in (("down", shot.can_scroll_down), ("up", shot.can_scroll_up)) if ok]
        if not directions:
            raise LookupError
        d = rng.choice(directions)
        return rng.choice((f"scroll {d}", f"scroll {d} the page")), {"action": "scroll", "text": d}, None
    if action == "navigate_back":
        if layout.kind == "home":
            raise LookupError
        text = rng.choice(("go back", "go back to the previous screen", "return to the previous page"))
        return text, {"action": "navigate_back"}, None
    apps = [e for e in on_screen if e.kind == "app"]
    if not apps:
        raise LookupError
    el = rng.choice(apps)
    return (
        rng.choice((f"open the {el.name} app", f"launch {el.name}")),
        {"action": "open_app", "text": el.name},
        el,
    )


def make_record(
    rng: random.Random,
    renderer: ScreenRenderer,
    screen: Screen,
    rid: str,
    weights: dict[str, float],
    *,
    layouts: Callable[..., Layout] = make_layout,
    prompt: str = PROMPT,
) -> tuple[dict[str, Any], bytes]:
    """One record (image path ``images/<rid>.png``) and its PNG. The action is drawn first: open_app needs a
    home screen, scrolling up a page rendered scrolled down. An action the screen cannot offer becomes a
    click. ``layouts(rng, screen, home=...)`` draws the screen (:func:`make_layout` or
    :func:`.tiny.make_tiny_layout`); ``prompt`` is formatted with ``device`` and ``instruction``."""
    action = rng.choices(list(weights), weights=list(weights.values()))[0]
    layout = layouts(rng, screen, home=action == "open_app")
    shot = renderer.shoot(layout.html, screen, scrolled_to_bottom=action == "scroll" and rng.random() < 0.4)
    verb = "tap" if screen.device == "phone" else "click"
    while True:
        try:
            instruction, answer, target = _task(rng, action, layout, shot, verb)
            break
        except LookupError:
            action = "click"
    elements = [
        {"id": e.id, "kind": e.kind, "name": e.name, "bbox": shot.boxes[e.id]["bbox"]}
        for e in layout.elements
        if shot.boxes[e.id]["visible"]
    ]
    meta = {
        "source": "gui-synth",
        "screen": screen.name,
        "device": screen.device,
        "layout": layout.kind,
        "action": answer["action"],
        "instruction": instruction,
        "image_size": list(screen.pixel_size),
        "target": None if target is None else {"id": target.id, "kind": target.kind, "name": target.name},
        "elements": elements,
    }
    rec = {
        "id": rid,
        "prompt": prompt.format(device=screen.device, instruction=instruction),
        "images": [f"images/{rid}.png"],
        "answer": answer,
        "metadata": meta,
    }
    return rec, shot.png


def target_response(
    answer: dict[str, Any],
    *,
    image_size: tuple[int, int] | None = None,
    model_size: tuple[int, int] | None = None,
    think: str = "",
    view: ModelView | None = None,
) -> str:
    """The response that earns full marks for ``answer``: the box's centre in UI-R1's answer format, written in the
    model's coordinate frame: ``view``'s (:meth:`mmrl.model.checkpoint_files.ModelView.to_frame`: model pixels for Qwen2.5-VL,
    0-1000 for Qwen3-VL and Qwen3.5, ...) when given with ``image_size``, else model pixels of ``model_size`` when
    both sizes are given, else original pixels. For supervised warm starts and for checking references against the
    reward."""
    action: dict[str, Any] = {"action": answer["action"]}
    box = answer.get("bbox")
    if answer["action"] == "click" and box is not None:
        x, y = (box[0] + box[2]) / 2, (box[1] + box[3]) / 2
        if image_size and view is not None:
            x, y = view.to_frame(x, y, *image_size)
        elif image_size and model_size:
            x, y = original_to_model(x, y, image_size, model_size)
        action["coordinate"] = [round(x), round(y)]
    if answer.get("text") is not None:
        action["input_text"] = answer["text"]
    return f"<think>{think}</think><answer>[{action!r}]</answer>"


def _write_jsonl(path: Path, lines: list[str]) -> None:
    tmp = path.with_suffix(".jsonl.tmp")
    tmp.write_text("\n".join(lines) + "\n")
    tmp.replace(path)


def build(
    folder: str | Path,
    *,
    n_train: int = 2000,
    n_eval: int = 200,
    seed: int = 0,
    screens: tuple[str, ...] = ("phone", "desktop"),
    action_weights: dict[str, float] | None = None,
    renderer: ScreenRenderer | None = None,
) -> dict[str, Path]:
    """Write ``train.jsonl``, ``eval.jsonl`` (held out: its own seed) and ``images/`` under ``folder``.

    Screens are drawn uniformly from ``screens`` (names in :data:`SCREENS`); actions by ``action_weights``
    (default :data:`DEFAULT_WEIGHTS`; an action a screen cannot offer, such as scrolling a page that fits,
    becomes a click). ``renderer``: a running :class:`ScreenRenderer` to reuse (Playwright's sync API allows
    one per thread), else one is started and closed here. Logs the rendering rate in screenshots/s.

    A record Chromium crashes under again and again (:meth:`ScreenRenderer.shoot`) is left out with a warning
    (:class:`~mmrl.rewards.html_sandbox.LeftOut`; the records after it then differ from a clean build's, since its
    random draws stop at the screenshot); three such records in a row stop the build."""
    weights = action_weights or DEFAULT_WEIGHTS
    unknown = [a for a in weights if a not in ACTIONS] + [s for s in screens if s not in SCREENS]
    if unknown:
        raise ValueError(
            f"gui data: unknown action or screen name(s) {unknown}; actions: {ACTIONS}, "
            f"screens: {sorted(SCREENS)}"
        )
    root = Path(folder)
    (root / "images").mkdir(parents=True, exist_ok=True)
    paths: dict[str, Path] = {}
    t0, shots, left_out = time.perf_counter(), 0, LeftOut("gui data")
    with contextlib.nullcontext(renderer) if renderer is not None else ScreenRenderer() as renderer:
        for split, n, s in (("train", n_train, seed), ("eval", n_eval, seed + 1_000_003)):
            rng = random.Random(s)
            lines = []
            for i in range(n):
                screen = SCREENS[rng.choice(screens)]
                with left_out.item(f"gui-{split}-{i:05d}"):
                    rec, png = make_record(rng, renderer, screen, f"gui-{split}-{i:05d}", weights)
                    (root / rec["images"][0]).write_bytes(png)
                    lines.append(json.dumps(rec))
                    shots += 1
            paths[split] = root / f"{split}.jsonl"
            _write_jsonl(paths[split], lines)
    seconds = time.perf_counter() - t0
    logger.info(
        "gui data: %d screenshots in %.1f s (%.2f screenshots/s)", shots, seconds, shots / max(seconds, 1e-9)
    )
    if left_out.items:
        logger.warning("gui data: left out after Chromium crashes: %s", ", ".join(left_out.items))
    return paths
