"""Small multi-page web apps with a task each: the browser GUI world of the gui_agent recipe (:mod:`mmrl.envs.browser`
runs them in Chromium).

:func:`make_app` draws, from ``random.Random(f"{kind}:{seed}")`` alone, one app of a kind and one task on it:

- ``settings``: a home page of 3-4 sections (Display, Sound, Network, Privacy, ...), each a page of 2-3 switches
  and perhaps a level with -/+ (Brightness, Volume); Dark mode really darkens the app;
- ``form``: a home page with an open button and the entries submitted so far; the form page has 2-3 text fields,
  a choice of 2-3 options and Submit;
- ``list``: a to-do/grocery/packing list of 6-8 items (longer than the screen: scrolling is needed), filter tabs
  All/Active/Done, rows that select, Delete / Done (toggles done) / Add at the bottom, an add page with a field;
- ``shop``: products with price and -/qty/+, a Cart (n) button, the cart page with -/+, total and Checkout, an
  order-placed page;
- ``mail``: an inbox (star mark, sender, subject), a message page (Star/Unstar, Archive), a compose page with To and
  Subject;
- ``panel`` (:data:`TINY_KINDS`, for the tiny recipe; not in :data:`KINDS`): one page, a header bar and a grid of
  4-6 large coloured tiles plus a grey Done button. The task is a sequence ("Press green, then blue, then Done.") and
  the cue is the COLOUR, not text: a model too small to read glyphs can still learn it. Each press re-arranges the
  tiles (:func:`_panel` below), so every step needs a fresh look at the screen.
- ``panel_cue`` (the tiny recipe's, :data:`TINY_KINDS`): the same panel and task, and the page marks the next
  control of the task (a white disc ringed in black on the tile, or on Done) as a guided tour does. The tiny bases
  cannot learn which tile a colour word names (``benchmarks/panel_probe.py``: held-out accuracy at chance after
  1,000 supervised steps), so their world asks only to find the marked control on a re-arranged screen, press it
  and stop. A wrong press still ends the task's chance, and no mark is shown after one.

The page is one self-contained HTML string (CSS, the app's JSON state and its script, :mod:`.app_js`; nothing
external). Layout varies with the seed: palette, font size, button and row heights, corner radius, header order
(back button left or right), title alignment, section/product/message order, toggle style (knob or ON/OFF),
settings home as a list or a grid of tiles, the order of the bottom and action buttons. Controls are large (44-50
px buttons, 52-58 px rows) so a model that sees the screen at a small pixel budget can still find them.

A task is an instruction, a goal and an oracle. Success is ``state["data"] == goal`` (the whole data part of
``window.__state``: what was asked changed, nothing else did; the page shown and the ``ui`` part do not matter).
The oracle gives the next correct :class:`Step` from any state (also after a wrong action, when the goal can still
be reached): click an element by its ``data-ui`` id, type text into a field, or go back; None when the goal is
reached or can no longer be (a wrong entry submitted, a wrong message archived). The env turns a step into page
pixels, adding scrolls where the element is off screen. From the first state the oracle needs 2-6 actions (the
tests check every kind through the real browser).
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from mmrl.recipes.gui_agent.app_js import CSS, RUNTIME_JS

KINDS = ("settings", "form", "list", "shop", "mail")  # the GPU recipe's apps
TINY_KINDS = ("panel_cue",)  # the tiny recipe's: a marked control to find, no reading
NUMBERS = ("zero", "one", "two", "three", "four", "five")
SCROLL_STEP = 150  # px per wheel event (mmrl.envs.browser sends one per scroll action)

# primary, accent, background, text, lines, switch on, selected row
PALETTES = (
    ("#1565c0", "#e65100", "#ffffff", "#1b1b1b", "#cfd8dc", "#2e7d32", "#fff3e0"),
    ("#2e7d32", "#1565c0", "#fbfbf7", "#1b1b1b", "#d7dccf", "#1565c0", "#e3f2fd"),
    ("#6a1b9a", "#00796b", "#ffffff", "#212121", "#ddd3e6", "#00796b", "#e0f2f1"),
    ("#b71c1c", "#283593", "#fafafa", "#1b1b1b", "#e0d6d6", "#2e7d32", "#e8eaf6"),
    ("#37474f", "#c2185b", "#f5f7f8", "#151515", "#cfd8dc", "#00897b", "#fce4ec"),
    ("#00695c", "#5d4037", "#f3f8f7", "#1b1b1b", "#c9dcd8", "#f57c00", "#efebe9"),
)
FONTS = ("'DejaVu Sans', sans-serif", "'DejaVu Sans Condensed', 'DejaVu Sans', sans-serif")


@dataclass(frozen=True)
class Step:
    """One oracle action: ``click`` the element ``target`` (a ``data-ui`` id), ``input_text`` ``text`` into the
    field ``target`` (replacing what it holds), or ``back``."""

    action: str
    target: str | None = None
    text: str | None = None


Oracle = Callable[[dict[str, Any]], "Step | None"]


@dataclass(frozen=True)
class App:
    """One generated app and its task: ``html`` is the whole page, ``initial`` its first ``window.__state``."""

    kind: str
    seed: int
    task: str  # the template's name
    instruction: str
    html: str
    initial: dict[str, Any]
    goal: dict[str, Any]
    oracle: Oracle

    def success(self, state: dict[str, Any]) -> bool:
        """The task is done: the state's data equals the goal."""
        return isinstance(state, dict) and state.get("data") == self.goal


def make_app(kind: str, seed: int) -> App:
    """The app of ``kind`` (a key of :data:`BUILDERS`) and its task for ``seed``; the same pair gives the same
    app."""
    if kind not in BUILDERS:
        raise ValueError(f"unknown app kind {kind!r}; one of {', '.join(BUILDERS)}")
    rng = random.Random(f"{kind}:{seed}")
    style = _style(rng)
    cfg, state, (task, instruction, goal, oracle) = BUILDERS[kind](rng)
    cfg = {"kind": kind, "scroll_step": SCROLL_STEP, "back_label": rng.choice(BACK_LABELS), **cfg}
    html = _page(CSS.format(**style), cfg, state)
    return App(kind, seed, task, instruction, html, json.loads(json.dumps(state)), goal, oracle)


BACK_LABELS = ("\u2190 Back", "\u2039 Back", "Back")


def _style(rng: random.Random) -> dict[str, Any]:
    primary, accent, bg, fg, line, on, select_bg = rng.choice(PALETTES)
    font_px = rng.choice((16, 17, 18))
    return {
        "primary": primary,
        "accent": accent,
        "bg": bg,
        "fg": fg,
        "line": line,
        "on": on,
        "select_bg": select_bg,
        "font": rng.choice(FONTS),
        "font_px": font_px,
        "title_px": font_px + 3,
        "bar_dir": rng.choice(("row", "row-reverse")),
        "title_align": rng.choice(("left", "center")),
        "btn_px": rng.choice((44, 46, 48)),
        "row_px": rng.choice((52, 54, 56, 58)),
        "radius": rng.choice((4, 8, 12, 22)),
        "label_px": rng.choice((96, 104, 112)),
    }


def _json(value: Any) -> str:
    """JSON safe inside a <script> element."""
    return json.dumps(value).replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def _page(css: str, cfg: dict[str, Any], state: dict[str, Any]) -> str:
    return (
        "<!doctype html><html><head><meta charset='utf-8'><style>"
        + css
        + "</style></head><body><div id='app'></div>"
        + f"<script type='application/json' id='init'>{_json(state)}</script>"
        + f"<script type='application/json' id='cfg'>{_json(cfg)}</script>"
        + f"<script>{RUNTIME_JS}</script></body></html>"
    )


def _quote(text: str) -> str:
    return f"'{text}'"


def _upper(text: str) -> str:
    return text[:1].upper() + text[1:]


def _join(parts: list[str]) -> str:
    return parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]


# ---------------------------------------------------------------------------------------------------- settings

SECTIONS = {
    "display": ("Display", ("dark_mode", "Dark mode", "large_text", "Large text", "night_light", "Night light",
                            "auto_rotate", "Auto-rotate"), ("brightness", "Brightness")),
    "sound": ("Sound", ("mute", "Mute", "vibrate", "Vibrate", "key_clicks", "Key clicks", "dnd",
                        "Do not disturb"), ("volume", "Volume")),
    "network": ("Network", ("wifi", "Wi-Fi", "bluetooth", "Bluetooth", "airplane", "Airplane mode", "hotspot",
                            "Hotspot"), None),
    "privacy": ("Privacy", ("location", "Location", "camera", "Camera access", "ad_tracking", "Ad tracking",
                            "history", "Search history"), None),
    "battery": ("Battery", ("saver", "Battery saver", "percent", "Show percentage", "adaptive",
                            "Adaptive battery"), None),
    "notifications": ("Notifications", ("badges", "App badges", "previews", "Message previews", "lock_screen",
                                        "On lock screen"), None),
}  # fmt: skip
LEVEL_MAX = 10


def _settings(rng: random.Random):
    ids = rng.sample(sorted(SECTIONS), rng.randint(3, 4))
    if rng.random() < 0.6 and "display" not in ids:  # dark mode is the classic task
        ids[0] = "display"
    rng.shuffle(ids)
    sections, data, names = [], {}, {}
    for sid in ids:
        title, flat, level = SECTIONS[sid]
        pairs = list(zip(flat[::2], flat[1::2]))
        chosen = rng.sample(pairs, min(len(pairs), rng.randint(2, 3)))
        if sid == "display" and ("dark_mode", "Dark mode") not in chosen:
            chosen[0] = ("dark_mode", "Dark mode")
        items = [{"id": k, "name": n} for k, n in chosen]
        data[sid] = {k: rng.random() < 0.4 for k, _ in chosen}
        if level is not None and rng.random() < 0.6:
            items.append({"id": level[0], "name": level[1], "max": LEVEL_MAX})
            data[sid][level[0]] = rng.randint(2, 8)
        sections.append({"id": sid, "name": title, "items": items})
        names.update({(sid, it["id"]): it["name"] for it in items})
    cfg = {
        "root": "home",
        "title": rng.choice(("Settings", "Device settings", "Preferences")),
        "sections": sections,
        "grid": rng.random() < 0.4,
        "switch": rng.choice(("knob", "pill")),
    }
    state = {"page": "home", "data": data, "ui": {}}
    task = _settings_task(rng, sections, data, names)
    return cfg, state, task


def _settings_task(rng: random.Random, sections, data, names):
    title = {s["id"]: s["name"] for s in sections}
    toggles = [(s["id"], it["id"]) for s in sections for it in s["items"] if "max" not in it]
    levels = [(s["id"], it["id"]) for s in sections for it in s["items"] if "max" in it]
    goal = json.loads(json.dumps(data))

    def flip(sid: str, key: str) -> str:
        goal[sid][key] = not data[sid][key]
        return f"turn {'on' if goal[sid][key] else 'off'} {names[sid, key]}"

    kinds = ["one", "two_same", "two_cross"] + ["level"] * bool(levels)
    if ("display", "dark_mode") in toggles and not data["display"]["dark_mode"]:
        kinds.append("dark_mode")
    kind = rng.choice(kinds)
    if kind == "dark_mode":
        text = f"{_upper(flip('display', 'dark_mode'))} in Display settings."
    elif kind == "one":
        sid, key = rng.choice(toggles)
        text = f"{_upper(flip(sid, key))} in {title[sid]} settings."
    elif kind == "two_same":
        sid = rng.choice([s for s, _ in toggles if sum(t[0] == s for t in toggles) >= 2])
        a, b = rng.sample([k for s, k in toggles if s == sid], 2)
        text = f"In {title[sid]} settings, {flip(sid, a)} and {flip(sid, b)}."
    elif kind == "two_cross":
        s1, s2 = rng.sample(sorted({s for s, _ in toggles}), 2)
        a = rng.choice([k for s, k in toggles if s == s1])
        b = rng.choice([k for s, k in toggles if s == s2])
        text = f"{_upper(flip(s1, a))} in {title[s1]} settings and {flip(s2, b)} in {title[s2]} settings."
    else:
        sid, key = rng.choice(levels)
        cur = data[sid][key]
        target = rng.choice([v for v in range(cur - 3, cur + 4) if v != cur and 0 <= v <= LEVEL_MAX])
        goal[sid][key] = target
        text = f"Set {names[sid, key]} to {target} in {title[sid]} settings."
    order = [s["id"] for s in sections]

    def oracle(state: dict[str, Any]) -> Step | None:
        cur, page = state["data"], state["page"]
        diffs = [(s, k) for s in order for k in goal[s] if cur[s][k] != goal[s][k]]
        if not diffs:
            return None
        sid, key = next((d for d in diffs if d[0] == page), diffs[0])
        if page != sid:
            return Step("back", "back") if page != "home" else Step("click", f"nav-{sid}")
        want = goal[sid][key]
        if isinstance(want, bool):
            return Step("click", f"t-{sid}-{key}")
        return Step("click", f"{'inc' if want > cur[sid][key] else 'dec'}-{sid}-{key}")

    return kind, text, goal, oracle


# -------------------------------------------------------------------------------------------------------- form

FORMS = (
    ("Contacts", "New contact", "Add contact", ("name", "email", "phone", "city"), ("group", "Group",
     ("Family", "Friends", "Work"))),
    ("Accounts", "Sign up", "Create account", ("name", "email", "city"), ("plan", "Plan", ("Free", "Basic", "Pro"))),
    ("Bookings", "Book a table", "New booking", ("name", "phone"), ("time", "Time", ("18:00", "19:00", "20:00"))),
    ("Addresses", "Shipping address", "New address", ("name", "street", "city"), ("speed", "Delivery",
     ("Standard", "Express"))),
)  # fmt: skip
FIELD_NAMES = {"name": "Name", "email": "Email", "phone": "Phone", "city": "City", "street": "Street"}
PEOPLE = ("Ann Lee", "Bo Chen", "Carl Diaz", "Dana Fox", "Eli Green", "Fay Hill", "Gus Ito", "Hana Kim")
VALUES = {
    "name": PEOPLE,
    "email": tuple(p.split()[0].lower() + "@example.com" for p in PEOPLE),
    "phone": ("555-0142", "555-0178", "555-0199", "555-0123", "555-0160"),
    "city": ("Oslo", "Lima", "Cairo", "Perth", "Quito", "Riga", "Turin"),
    "street": ("12 Oak St", "4 Elm Rd", "9 Bay Ave", "31 Hill Ln", "7 Pine Ct"),
}


def _form(rng: random.Random):
    title, form_title, open_label, keys, (ckey, cname, options) = rng.choice(FORMS)
    others = [k for k in keys if k != "name"]
    keys = ["name", *rng.sample(others, min(2, len(others)))]
    fields = [{"key": k, "name": FIELD_NAMES[k]} for k in keys]
    cfg = {
        "root": "home",
        "title": title,
        "form_title": form_title,
        "open_label": open_label,
        "submit_label": rng.choice(("Submit", "Save", "Done")),
        "fields": fields,
        "choice": {"key": ckey, "name": cname, "options": list(options)},
    }
    draft = {k: "" for k in keys} | {ckey: options[0]}
    state = {"page": "home", "data": {"submitted": []}, "ui": {"draft": dict(draft)}}
    filled = rng.sample(keys, rng.randint(1, len(keys)))
    filled.sort(key=keys.index)
    entry = {k: (rng.choice(VALUES[k]) if k in filled else "") for k in keys}
    entry[ckey] = rng.choice(options[1:]) if rng.random() < 0.5 else options[0]
    parts = [f"{FIELD_NAMES[k]} {_quote(entry[k])}" for k in filled]
    pick = f", choose {entry[ckey]} as {cname}" if entry[ckey] != options[0] else ""
    text = f"Open {open_label}, fill in {_join(parts)}{pick}, then submit it."
    goal = {"submitted": [entry]}

    def oracle(state: dict[str, Any]) -> Step | None:
        if state["data"]["submitted"]:
            return None  # done, or a wrong entry that cannot be taken back
        if state["page"] != "form":
            return Step("click", "open")
        d = state["ui"]["draft"]
        for k in keys:
            if d[k].strip() != entry[k]:
                return Step("input_text", f"f-{k}", entry[k])
        if d[ckey] != entry[ckey]:
            return Step("click", f"c-{ckey}-{options.index(entry[ckey])}")
        return Step("click", "submit")

    return cfg, state, ("fill" + str(len(filled)) + ("_choice" if pick else ""), text, goal, oracle)


# -------------------------------------------------------------------------------------------------------- list

LISTS = {
    "Groceries": ("Milk", "Eggs", "Bread", "Apples", "Rice", "Butter", "Cheese", "Coffee", "Tea", "Pasta",
                  "Tomatoes", "Yogurt"),
    "To-do": ("Pay rent", "Call mom", "Book dentist", "Water plants", "Clean desk", "Reply to Sam", "Buy stamps",
              "Renew passport", "Fix bike"),
    "Packing": ("Passport", "Charger", "Socks", "Toothbrush", "Sunscreen", "Umbrella", "Headphones", "Jacket",
                "Snacks"),
}  # fmt: skip
FILTERS = (("all", "All"), ("active", "Active"), ("done", "Done"))


def _list(rng: random.Random):
    title = rng.choice(sorted(LISTS))
    pool = list(LISTS[title])
    rng.shuffle(pool)
    n = rng.randint(6, 8)
    names, spare = pool[:n], pool[n:]
    items = [{"name": x, "done": False} for x in names]
    for i in rng.sample(range(n), rng.randint(0, 2)):
        items[i]["done"] = True
    actions = ["delete", "done", "add"]
    rng.shuffle(actions)
    cfg = {
        "root": "list",
        "title": title,
        "filters": [{"id": f, "name": name} for f, name in FILTERS],
        "actions": actions,
        "labels": {"delete": "Delete", "done": rng.choice(("Done", "Toggle done")), "add": "Add"},
        "add_title": f"Add to {title}",
        "name_label": "Item",
        "save_label": rng.choice(("Save", "Add")),
    }
    state = {
        "page": "list",
        "data": {"items": items, "filter": "all"},
        "ui": {"selected": [], "draft": {"name": ""}},
    }
    goal = json.loads(json.dumps(state["data"]))
    undone = [it["name"] for it in items if not it["done"]]
    kind = rng.choice(
        ("delete1", "delete2", "done1", "done2", "add", "done_filter", "delete_filter", "add_delete")
    )
    new = rng.choice(spare)
    if kind in ("delete1", "delete2", "delete_filter", "add_delete"):
        # the add's 3 actions leave room for one scroll only: the first 6 rows are at most one scroll away
        gone = rng.sample(names[:6] if kind == "add_delete" else names, 2 if kind == "delete2" else 1)
        goal["items"] = [it for it in goal["items"] if it["name"] not in gone]
        text = f"Delete {_join([_quote(g) for g in gone])} from the list."
    if kind in ("done1", "done2", "done_filter"):
        marked = rng.sample(undone, 2 if kind == "done2" else 1)
        for it in goal["items"]:
            it["done"] = it["done"] or it["name"] in marked
        text = f"Mark {_join([_quote(m) for m in marked])} as done."
    if kind == "add":
        text = f"Add {_quote(new)} to the list."
    if kind in ("add", "add_delete"):
        goal["items"].append({"name": new, "done": False})
    if kind == "add_delete":
        text = f"Add {_quote(new)} to the list and delete {_quote(gone[0])}."
    if kind.endswith("_filter"):
        goal["filter"] = "done" if kind == "done_filter" else "active"
        text = text[:-1] + f", then show only the {goal['filter']} items."

    def oracle(state: dict[str, Any]) -> Step | None:
        data, ui = state["data"], state["ui"]
        cur = [it["name"] for it in data["items"]]
        want = [it["name"] for it in goal["items"]]
        missing = [x for x in want if x not in cur]
        if state["page"] == "add":
            if not missing:
                return Step("back", "back")
            if ui["draft"]["name"].strip() != missing[0]:
                return Step("input_text", "f-name", missing[0])
            return Step("click", "save")
        extra = [i for i, x in enumerate(cur) if x not in want]
        by_name = {it["name"]: it["done"] for it in goal["items"]}
        flips = [
            i
            for i, it in enumerate(data["items"])
            if it["name"] in by_name and it["done"] != by_name[it["name"]]
        ]
        if extra or flips:
            wanted, final = (extra, "delete") if extra else (flips, "done")
            sel = ui["selected"]
            wrong = [i for i in sel if i not in wanted] + [i for i in wanted if i not in sel]
            if not wrong:
                return Step("click", final)
            it = data["items"][wrong[0]]
            if data["filter"] != "all" and (data["filter"] == "done") != it["done"]:
                return Step("click", "filter-all")
            return Step("click", f"item-{wrong[0]}")
        if missing:
            return Step("click", "add")
        if cur != want:
            return None  # an item added twice or in the wrong place
        if data["filter"] != goal["filter"]:
            return Step("click", f"filter-{goal['filter']}")
        return None

    return cfg, state, (kind, text, goal, oracle)


# -------------------------------------------------------------------------------------------------------- shop

PRODUCTS = (("apples", "Apples", 1.2), ("bananas", "Bananas", 0.5), ("bread", "Bread", 2.4), ("milk", "Milk", 0.99),
            ("eggs", "Eggs", 3.1), ("cheese", "Cheese", 4.75), ("coffee", "Coffee", 6.5), ("pears", "Pears", 1.1),
            ("oranges", "Oranges", 1.3), ("tea", "Tea", 3.2))  # fmt: skip


def _shop(rng: random.Random):
    products = [
        {"id": p, "name": n, "price": price} for p, n, price in rng.sample(PRODUCTS, rng.randint(4, 5))
    ]
    cfg = {
        "root": "home",
        "title": rng.choice(("Corner Shop", "Fresh Market", "Daily Goods", "Green Grocer")),
        "products": products,
        "currency": rng.choice(("$", "\u20ac", "\u00a3")),
        "cart_label": rng.choice(("Cart", "Basket")),
        "total_label": "Total",
        "checkout_label": rng.choice(("Checkout", "Place order", "Pay now")),
        "empty_label": "Your cart is empty.",
        "done_title": "Thank you",
        "done_label": "Your order has been placed.",
        "continue_label": "Continue shopping",
    }
    name = {p["id"]: p["name"] for p in products}
    kind = rng.choice(("one", "two", "fix"))
    cart: dict[str, int] = {}
    if kind == "one":
        a = rng.choice(products)["id"]
        want = {a: rng.randint(1, 3)}
    elif kind == "two":
        a, b = (p["id"] for p in rng.sample(products, 2))
        want = {a: rng.randint(1, 2), b: rng.randint(1, 2)}
    else:
        a, b = (p["id"] for p in rng.sample(products, 2))
        cart = {a: rng.randint(1, 2), b: rng.randint(1, 2)}
        want = {a: cart[a] + rng.randint(0, 1)}
    parts = [f"{NUMBERS[n]} {name[p]}" for p, n in want.items()]
    if kind == "fix":
        text = f"Change the {cfg['cart_label'].lower()} so it holds exactly {parts[0]} and no {name[b]}, then check out."
    else:
        text = f"Add {_join(parts)} to the {cfg['cart_label'].lower()} and check out."
    state = {"page": "home", "data": {"cart": cart, "orders": []}, "ui": {}}
    goal = {"cart": {}, "orders": [want]}
    order = [p["id"] for p in products]

    def oracle(state: dict[str, Any]) -> Step | None:
        data, page = state["data"], state["page"]
        if data["orders"]:
            return None  # done, or a wrong order placed
        diff = [p for p in order if data["cart"].get(p, 0) != want.get(p, 0)]
        if not diff:
            if page == "cart":
                return Step("click", "checkout")
            return Step("click", "cart") if page == "home" else Step("back", "back")
        p = diff[0]
        sign = "inc" if want.get(p, 0) > data["cart"].get(p, 0) else "dec"
        if page == "cart" and p in data["cart"]:
            return Step("click", f"{sign}-cart-{p}")
        return Step("click", f"{sign}-{p}") if page == "home" else Step("back", "back")

    return cfg, state, (kind, text, goal, oracle)


# -------------------------------------------------------------------------------------------------------- mail

SENDERS = ("Alice", "Bob", "Chloe", "David", "Emma", "Frank", "Grace", "Henry")
SUBJECTS = ("Invoice for March", "Team lunch", "Flight booking", "Weekend plans", "Project update",
            "Library book due", "Gym membership", "Photo album", "Rent reminder")  # fmt: skip
BODIES = ("Please see the details below.", "Let me know what you think.", "Thanks, talk soon.",
          "See you on Friday.", "Can you confirm by tomorrow?")  # fmt: skip
NEW_SUBJECTS = ("Lunch tomorrow?", "Meeting notes", "Thanks!", "Quick question", "Trip photos")


def _mail(rng: random.Random):
    n = rng.randint(4, 5)
    senders, subjects = rng.sample(SENDERS, n), rng.sample(SUBJECTS, n)
    messages = [
        {
            "from": f,
            "subject": s,
            "body": rng.choice(BODIES),
            "starred": rng.random() < 0.2,
            "archived": False,
        }
        for f, s in zip(senders, subjects)
    ]
    actions = ["star", "archive"]
    rng.shuffle(actions)
    cfg = {
        "root": "inbox",
        "title": "Inbox",
        "actions": actions,
        "compose_label": rng.choice(("Compose", "New mail", "Write")),
        "to_label": "To",
        "subject_label": "Subject",
        "send_label": "Send",
        "star_label": "Star",
        "unstar_label": "Unstar",
        "archive_label": "Archive",
    }
    state = {
        "page": "inbox",
        "data": {"messages": messages, "sent": []},
        "ui": {"draft": {"to": "", "subject": ""}},
    }
    goal = json.loads(json.dumps(state["data"]))
    kind = rng.choice(("archive", "star", "star_archive", "send", "archive_send"))
    a, b = rng.sample(range(n), 2)
    to = rng.choice(VALUES["email"])
    subject = rng.choice(NEW_SUBJECTS)
    clauses = []
    if kind in ("star", "star_archive"):
        goal["messages"][a]["starred"] = not messages[a]["starred"]
        verb = "Star" if goal["messages"][a]["starred"] else "Unstar"
        what = f"about {_quote(messages[a]['subject'])}" if kind == "star" else f"from {messages[a]['from']}"
        clauses.append(f"{verb} the email {what}")
    if kind in ("archive", "star_archive", "archive_send"):
        goal["messages"][b]["archived"] = True
        clauses.append(f"archive the email from {messages[b]['from']}")
    if kind in ("send", "archive_send"):
        goal["sent"].append({"to": to, "subject": subject})
        clauses.append(f"send an email to {to} with the subject {_quote(subject)}")
    text = _upper(", then ".join(clauses)) + "."

    def oracle(state: dict[str, Any]) -> Step | None:
        data, page = state["data"], state["page"]
        cur, want = data["messages"], goal["messages"]
        if any(c["archived"] and not w["archived"] for c, w in zip(cur, want)) or data["sent"] not in (
            [],
            goal["sent"],
        ):
            return None
        diffs = [i for i in range(n) if cur[i] != want[i]]
        if diffs:
            open_ = int(page[8:]) if page.startswith("message-") else None
            i = open_ if open_ in diffs else diffs[0]
            if open_ == i:
                return Step("click", "star" if cur[i]["starred"] != want[i]["starred"] else "archive")
            return Step("back", "back") if page != "inbox" else Step("click", f"msg-{i}")
        if data["sent"] == goal["sent"]:
            return None
        if page != "compose":
            return Step("back", "back") if page != "inbox" else Step("click", "compose")
        d = state["ui"]["draft"]
        for key, value in (("to", to), ("subject", subject)):
            if d[key].strip() != value:
                return Step("input_text", f"f-{key}", value)
        return Step("click", "send")

    return cfg, state, (kind, text, goal, oracle)


# ------------------------------------------------------------------------------------------------------- panel

# Fixed per name across seeds, so a colour word always means the same RGB; saturated and far apart in hue (and
# none grey, the Done button's colour) so they stay distinct at a few pixels per tile.
COLOURS = {
    "red": "#e32626",
    "green": "#1fa33a",
    "blue": "#1f5fe0",
    "yellow": "#f5d10f",
    "purple": "#8a2cc8",
    "orange": "#f57a0a",
}
PANEL_BARS = ("#263238", "#212121", "#37474f", "#3b3b48", "#2f3d35")  # dark neutrals: never a tile's colour
DONE_PLACES = ("bar", "flex-start", "center", "flex-end")  # in the header bar, or the bottom row's alignment


def _panel(rng: random.Random, cue: bool = False):
    """Tiles in a grid of ``cols`` x 2 slots; ``layouts[k]`` gives each tile's slot after ``k`` presses (the page
    shows ``layouts[min(k, n)]``). Every tile changes slot from one layout to the next, so a press always moves
    the colour just seen. After Done the panel is locked: presses change nothing. ``cue``: the page marks the
    task's next control while the presses so far follow the task (module docstring)."""
    cols = rng.choice((2, 3))
    n = 4 if cols == 2 else rng.randint(4, 6)
    ids = rng.sample(sorted(COLOURS), n)
    layouts = [rng.sample(range(2 * cols), n)]
    while len(layouts) <= n:
        nxt = rng.sample(range(2 * cols), n)
        if all(a != b for a, b in zip(nxt, layouts[-1])):
            layouts.append(nxt)
    cfg = {
        "root": "panel",
        "title": rng.choice(("Control panel", "Panel", "Console", "Switchboard")),
        "tiles": [{"id": c, "name": _upper(c), "rgb": COLOURS[c]} for c in ids],
        "cols": cols,
        "layouts": layouts,
        "labels": rng.random() < 0.5,  # a small colour name in the tile's corner
        "bar_bg": rng.choice(PANEL_BARS),
        "done_place": rng.choice(DONE_PLACES),
        "done_label": "Done",
    }
    state = {"page": "panel", "data": {"pressed": [], "done": False}, "ui": {}}
    seq = rng.sample(ids, rng.randint(1, 3))
    if cue:
        cfg["cue"] = seq
    verb = rng.choice(("Press", "Tap", "Click"))
    text = f"{verb} " + ", then ".join([*seq, "Done"]) + "."
    goal = {"pressed": seq, "done": True}

    def oracle(state: dict[str, Any]) -> Step | None:
        data = state["data"]
        pressed = data["pressed"]
        if data["done"] or pressed != seq[: len(pressed)]:
            return None  # finished, or Done too early or a wrong tile: neither can be taken back
        return Step("click", f"tile-{seq[len(pressed)]}" if len(pressed) < len(seq) else "done")

    return cfg, state, (f"seq{len(seq)}", text, goal, oracle)


BUILDERS: dict[str, Callable[[random.Random], tuple[dict[str, Any], dict[str, Any], tuple]]] = {
    "settings": _settings,
    "form": _form,
    "list": _list,
    "shop": _shop,
    "mail": _mail,
    "panel": _panel,
    "panel_cue": lambda rng: _panel(rng, cue=True),
}
