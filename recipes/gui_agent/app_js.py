"""The browser apps' own code: one JavaScript runtime that renders every app kind from its state, and the CSS
template its seeded styles fill in (:mod:`.apps` writes the page; :mod:`mmrl.envs.browser` drives it).

The page holds two JSON blocks, ``init`` (the first ``window.__state``) and ``cfg`` (the kind and its seeded layout),
then this script. The app's whole state is ``window.__state = {page, data, ui}``: ``page`` is the route (pages
change without loading a URL: the app re-renders), ``data`` is what tasks judge, ``ui`` holds selections and draft
text. Every click handler changes the state and re-renders synchronously; typing only updates the draft through
``input`` events (no re-render, so the field keeps its focus). Every interactive element carries ``data-ui``, the
id the oracle and the env's hit tests use. Text from the state (typed by the model) is only ever inserted as text
nodes or ``input.value``, never as HTML, so typed markup stays text.

Back: every page but the root has the root as its parent (``window.__app.back()`` and the header's back button go
there), so what back does depends on the page alone. A wheel event scrolls by a fixed ``scroll_step`` in its
direction, at once (no smooth scrolling), so a scroll lands on the same offset every time.

Values from ``cfg`` that style an element (the panel's tile colours, grid slots, bar colour) are set as single
style properties in the script, never spliced into CSS text. The panel's header shows a trail of the colours
pressed so far, so one screenshot tells how far the sequence has got (the SFT demos are single screens).
"""

RUNTIME_JS = r"""
(() => {
"use strict";
const load = id => JSON.parse(document.getElementById(id).textContent);
const S = load("init"), C = load("cfg");
window.__state = S;
const root = document.getElementById("app");

function el(tag, o, ...kids) {
  const e = document.createElement(tag);
  if (o && o.ui) e.dataset.ui = o.ui;
  if (o && o.cls) e.className = o.cls;
  if (o && o.click) e.addEventListener("click", ev => { ev.preventDefault(); o.click(); render(); });
  for (const k of kids) if (k !== null && k !== undefined && k !== false) e.append(k);
  return e;
}
function go(page) { S.page = page; render(); window.scrollTo(0, 0); }
function back() { if (S.page !== C.root) go(C.root); }
window.__app = {back};
function bar(title, right) {
  const kids = [];
  if (S.page !== C.root) kids.push(el("div", {ui: "back", cls: "btn back", click: back}, C.back_label));
  kids.push(el("div", {cls: "title"}, title));
  if (right) kids.push(right);
  return el("div", {cls: "bar"}, ...kids);
}
function field(key, label, draft) {
  const inp = el("input", {ui: "f-" + key});
  inp.type = "text";
  inp.setAttribute("autocomplete", "off");
  inp.spellcheck = false;
  inp.maxLength = 120;
  inp.value = draft[key];
  inp.addEventListener("input", () => { draft[key] = inp.value; });
  return el("div", {cls: "row"}, el("span", {cls: "lab"}, label), inp);
}
function big(ui, label, click) { return el("div", {cls: "pad"}, el("div", {ui, cls: "btn big", click}, label)); }
function stepper(ui, value, click) {
  return [el("div", {ui: "dec-" + ui, cls: "btn sq", click: () => click(-1)}, "\u2212"),
          el("span", {cls: "val"}, String(value)),
          el("div", {ui: "inc-" + ui, cls: "btn sq", click: () => click(1)}, "+")];
}

const V = {};
V.settings = () => {
  if (S.page === C.root) {
    const nav = C.sections.map(s => el("div", {ui: "nav-" + s.id, cls: C.grid ? "btn tile" : "row nav",
      click: () => go(s.id)}, el("span", {cls: "grow"}, s.name), C.grid ? null : "\u203a"));
    return [bar(C.title), el("div", {cls: C.grid ? "grid" : "list"}, ...nav)];
  }
  const sec = C.sections.find(s => s.id === S.page), vals = S.data[sec.id];
  const rows = sec.items.map(it => {
    const label = el("span", {cls: "grow"}, it.name), ui = sec.id + "-" + it.id;
    if (it.max === undefined) {
      const on = vals[it.id];
      return el("div", {cls: "row"}, label, el("div", {ui: "t-" + ui, cls: "switch " + C.switch + (on ? " on" : ""),
        click: () => { vals[it.id] = !on; }}, C.switch === "pill" ? (on ? "ON" : "OFF") : null));
    }
    return el("div", {cls: "row"}, label,
      ...stepper(ui, vals[it.id], d => { vals[it.id] = Math.min(it.max, Math.max(0, vals[it.id] + d)); }));
  });
  return [bar(sec.name), el("div", {cls: "list"}, ...rows)];
};

V.form = () => {
  const d = S.ui.draft, ch = C.choice;
  if (S.page === C.root) {
    const done = S.data.submitted.map(e => el("div", {cls: "row"}, el("span", {cls: "grow"},
      [...C.fields.map(f => e[f.key]), e[ch.key]].filter(Boolean).join(" \u00b7 "))));
    return [bar(C.title), big("open", C.open_label, () => go("form")), el("div", {cls: "list"}, ...done)];
  }
  const kids = C.fields.map(f => field(f.key, f.name, d));
  kids.push(el("div", {cls: "row"}, el("span", {cls: "lab"}, ch.name), ...ch.options.map((o, i) =>
    el("div", {ui: "c-" + ch.key + "-" + i, cls: "btn seg" + (d[ch.key] === o ? " sel" : ""),
      click: () => { d[ch.key] = o; }}, o))));
  kids.push(big("submit", C.submit_label, () => {
    const e = {};
    for (const f of C.fields) { e[f.key] = d[f.key].trim(); d[f.key] = ""; }
    e[ch.key] = d[ch.key];
    d[ch.key] = ch.options[0];
    S.data.submitted.push(e);
    go(C.root);
  }));
  return [bar(C.form_title), el("div", {cls: "list"}, ...kids)];
};

V.list = () => {
  const L = S.data;
  if (S.page === "add") {
    return [bar(C.add_title), el("div", {cls: "list"}, field("name", C.name_label, S.ui.draft),
      big("save", C.save_label, () => {
        const name = S.ui.draft.name.trim();
        if (name) L.items.push({name, done: false});
        S.ui.draft.name = "";
        go(C.root);
      }))];
  }
  const tabs = C.filters.map(f => el("div", {ui: "filter-" + f.id, cls: "tab" + (L.filter === f.id ? " sel" : ""),
    click: () => { L.filter = f.id; S.ui.selected = []; }}, f.name));
  const rows = [];
  L.items.forEach((it, i) => {
    if (L.filter !== "all" && (L.filter === "done") !== it.done) return;
    const sel = S.ui.selected.includes(i);
    rows.push(el("div", {ui: "item-" + i, cls: "row item" + (sel ? " sel" : "") + (it.done ? " done" : ""),
      click: () => { S.ui.selected = sel ? S.ui.selected.filter(j => j !== i) : [...S.ui.selected, i].sort((a, b) => a - b); }},
      el("span", {cls: "box"}, sel ? "\u2713" : ""), el("span", {cls: "grow name"}, it.name)));
  });
  const act = {
    delete: () => { L.items = L.items.filter((_, i) => !S.ui.selected.includes(i)); S.ui.selected = []; },
    done: () => { for (const i of S.ui.selected) L.items[i].done = !L.items[i].done; S.ui.selected = []; },
    add: () => go("add"),
  };
  return [el("div", {cls: "top"}, bar(C.title), el("div", {cls: "tabs"}, ...tabs)),
          el("div", {cls: "list items"}, ...rows),
          el("div", {cls: "bottom"}, ...C.actions.map(a => el("div", {ui: a, cls: "btn", click: act[a]}, C.labels[a])))];
};

V.shop = () => {
  const cart = S.data.cart, n = Object.values(cart).reduce((a, b) => a + b, 0);
  const add = id => d => { const v = Math.min(9, (cart[id] || 0) + d); if (v > 0) cart[id] = v; else delete cart[id]; };
  const price = p => C.currency + p.price.toFixed(2);
  if (S.page === C.root) {
    const rows = C.products.map(p => el("div", {cls: "row"}, el("span", {cls: "grow"}, p.name),
      el("span", {cls: "price"}, price(p)), ...stepper(p.id, cart[p.id] || 0, add(p.id))));
    const cartBtn = el("div", {ui: "cart", cls: "btn", click: () => go("cart")}, C.cart_label + " (" + n + ")");
    return [bar(C.title, cartBtn), el("div", {cls: "list"}, ...rows)];
  }
  if (S.page === "cart") {
    const items = C.products.filter(p => cart[p.id]);
    const rows = items.map(p => el("div", {cls: "row"}, el("span", {cls: "grow"}, p.name),
      ...stepper("cart-" + p.id, cart[p.id], add(p.id))));
    const total = items.reduce((a, p) => a + p.price * cart[p.id], 0);
    const tail = n ? [el("div", {cls: "row"}, el("span", {cls: "grow"}, C.total_label), el("b", null, C.currency + total.toFixed(2))),
      big("checkout", C.checkout_label, () => { S.data.orders.push(Object.assign({}, cart)); S.data.cart = {}; go("done"); })]
      : [el("div", {cls: "pad"}, C.empty_label)];
    return [bar(C.cart_label), el("div", {cls: "list"}, ...rows, ...tail)];
  }
  return [bar(C.done_title), el("div", {cls: "pad"}, C.done_label), big("continue", C.continue_label, () => go(C.root))];
};

V.mail = () => {
  const M = S.data.messages, d = S.ui.draft;
  if (S.page === C.root) {
    const rows = [];
    M.forEach((m, i) => {
      if (!m.archived) rows.push(el("div", {ui: "msg-" + i, cls: "row msg", click: () => go("message-" + i)},
        el("span", {cls: "star"}, m.starred ? "\u2605" : "\u2606"), el("span", {cls: "from"}, m.from),
        el("span", {cls: "grow subj"}, m.subject)));
    });
    const compose = el("div", {ui: "compose", cls: "btn", click: () => go("compose")}, C.compose_label);
    return [bar(C.title, compose), el("div", {cls: "list"}, ...rows)];
  }
  if (S.page === "compose") {
    return [bar(C.compose_label), el("div", {cls: "list"}, field("to", C.to_label, d), field("subject", C.subject_label, d),
      big("send", C.send_label, () => {
        S.data.sent.push({to: d.to.trim(), subject: d.subject.trim()});
        d.to = ""; d.subject = "";
        go(C.root);
      }))];
  }
  const m = M[Number(S.page.slice(8))];
  const act = {
    star: el("div", {ui: "star", cls: "btn", click: () => { m.starred = !m.starred; }}, m.starred ? C.unstar_label : C.star_label),
    archive: el("div", {ui: "archive", cls: "btn", click: () => { m.archived = true; go(C.root); }}, C.archive_label),
  };
  return [bar(m.subject), el("div", {cls: "pad"}, el("div", {cls: "from"}, m.from), el("p", null, m.body)),
          el("div", {cls: "acts"}, ...C.actions.map(a => act[a]))];
};

V.panel = () => {
  const P = S.data, lay = C.layouts[Math.min(P.pressed.length, C.layouts.length - 1)];
  const rgb = id => C.tiles.find(t => t.id === id).rgb;
  const tiles = C.tiles.map((t, i) => {
    const e = el("div", {ui: "tile-" + t.id, cls: "ptile", click: () => { if (!P.done) P.pressed.push(t.id); }},
      C.labels ? el("span", {cls: "chip"}, t.name) : null);
    e.style.background = t.rgb;
    e.style.gridColumn = String(lay[i] % C.cols + 1);
    e.style.gridRow = String(Math.floor(lay[i] / C.cols) + 1);
    return e;
  });
  // the cue (panel_cue): a mark on the task's next control while the presses so far follow the task
  const onTrack = C.cue && !P.done && P.pressed.every((id, i) => id === C.cue[i]);
  const next = !onTrack ? null : P.pressed.length < C.cue.length ? C.cue[P.pressed.length] : "done";
  const grid = el("div", {cls: "pgrid"}, ...tiles);
  grid.style.gridTemplateColumns = "repeat(" + C.cols + ", 1fr)";
  const trail = el("div", {cls: "trail"}, ...P.pressed.slice(-6).map(id => {
    const s = el("span"); s.style.background = rgb(id); return s; }));
  const done = el("div", {ui: "done", cls: "btn pdone", click: () => { P.done = true; }}, C.done_label);
  if (next !== null) {
    (next === "done" ? done : tiles[C.tiles.findIndex(t => t.id === next)]).append(el("span", {cls: "cue"}));
  }
  const inBar = C.done_place === "bar";
  const top = bar(C.title, el("div", {cls: "pright"}, trail, inBar ? done : null));
  top.style.background = C.bar_bg;
  const foot = inBar ? null : el("div", {cls: "pfoot"}, done);
  if (foot) foot.style.justifyContent = C.done_place;
  return [el("div", {cls: "panel"}, top, grid, foot)];
};
V.panel_cue = V.panel;

function render() {
  root.replaceChildren(...V[C.kind]());
  document.body.classList.toggle("dark", !!(S.data.display && S.data.display.dark_mode));
}
window.addEventListener("wheel", e => { e.preventDefault(); window.scrollBy(0, Math.sign(e.deltaY) * C.scroll_step); },
  {passive: false});
render();
})();
"""

# Filled in with str.format by :func:`.apps.css`; doubled braces are CSS's own.
CSS = """
*{{box-sizing:border-box;margin:0;padding:0}}
html{{scroll-behavior:auto}}
body{{background:{bg};color:{fg};font-family:{font};font-size:{font_px}px;min-height:100vh;user-select:none;
  -webkit-user-select:none;overflow-x:hidden}}
body.dark{{background:#1f2124;color:#eceff1}}
.bar{{position:sticky;top:0;z-index:3;height:54px;display:flex;flex-direction:{bar_dir};align-items:center;gap:8px;
  padding:0 8px;background:{primary};color:#fff}}
.title{{flex:1;font-size:{title_px}px;font-weight:bold;white-space:nowrap;overflow:hidden;text-overflow:ellipsis;
  padding:0 6px;text-align:{title_align}}}
.btn{{display:flex;align-items:center;justify-content:center;height:{btn_px}px;min-width:{btn_px}px;padding:0 14px;
  border-radius:{radius}px;background:{accent};color:#fff;font-weight:bold;white-space:nowrap;
  border:2px solid rgba(0,0,0,.18)}}
.bar .btn{{background:rgba(255,255,255,.2);border-color:rgba(255,255,255,.75)}}
.row{{display:flex;align-items:center;gap:10px;min-height:{row_px}px;padding:4px 12px;border-bottom:1px solid {line}}}
.grow{{flex:1;overflow:hidden;white-space:nowrap;text-overflow:ellipsis}}
.nav{{font-weight:bold;font-size:{title_px}px}}
.grid{{display:grid;grid-template-columns:1fr 1fr;gap:12px;padding:12px}}
.tile{{height:96px;font-size:{title_px}px}}
.switch{{width:68px;height:38px;border-radius:19px;background:#8d949b;position:relative;color:#fff;font-weight:bold;
  display:flex;align-items:center;justify-content:center;border:2px solid rgba(0,0,0,.2)}}
.switch.on{{background:{on}}}
.switch.knob::after{{content:"";position:absolute;top:3px;left:3px;width:28px;height:28px;border-radius:50%;
  background:#fff}}
.switch.knob.on::after{{left:33px}}
.sq{{width:{btn_px}px;padding:0;font-size:26px}}
.val{{min-width:30px;text-align:center;font-weight:bold;font-size:{title_px}px}}
.price{{width:64px;text-align:right}}
.pad{{padding:10px 12px}}
.big{{height:50px;font-size:{title_px}px}}
.lab{{width:{label_px}px;font-weight:bold}}
input{{flex:1;min-width:0;height:42px;font:inherit;padding:0 10px;border:2px solid {line};border-radius:{radius}px;
  background:#fff;color:#111;user-select:text;-webkit-user-select:text}}
input:focus{{outline:3px solid {accent};outline-offset:0;border-color:{accent}}}
.seg{{flex:1;min-width:0;padding:0 6px;background:#dfe3e8;color:#222}}
.seg.sel{{background:{accent};color:#fff}}
.top{{position:sticky;top:0;z-index:3;background:{bg}}}
.top .bar{{position:static}}
.tabs{{display:flex;gap:8px;padding:6px 12px;border-bottom:2px solid {line}}}
.tab{{flex:1;height:38px;display:flex;align-items:center;justify-content:center;border-radius:{radius}px;
  background:#dfe3e8;color:#222;font-weight:bold}}
.tab.sel{{background:{primary};color:#fff}}
.items{{padding-bottom:70px}}
.item .box{{width:30px;height:30px;border:3px solid {accent};border-radius:6px;display:flex;align-items:center;
  justify-content:center;font-weight:bold;color:#fff}}
.item.sel{{background:{select_bg}}}
.item.sel .box{{background:{accent}}}
.item.done .name{{text-decoration:line-through;opacity:.55}}
.bottom{{position:fixed;left:0;right:0;bottom:0;height:64px;display:flex;gap:10px;padding:8px 12px;background:{bg};
  border-top:2px solid {line};z-index:3}}
.bottom .btn{{flex:1}}
.msg .from{{width:110px;font-weight:bold;overflow:hidden;white-space:nowrap}}
.star{{width:22px;color:{accent};font-size:20px}}
.acts{{display:flex;gap:12px;padding:10px 12px}}
.acts .btn{{flex:1;height:50px}}
p{{margin-top:8px;line-height:1.4}}
.panel{{display:flex;flex-direction:column;height:100vh}}
.pgrid{{flex:1;min-height:0;display:grid;grid-template-rows:1fr 1fr;gap:10px;padding:10px 12px}}
.ptile{{position:relative;border-radius:{radius}px;border:3px solid rgba(0,0,0,.22)}}
.chip{{position:absolute;left:6px;top:6px;padding:1px 6px;border-radius:4px;background:rgba(255,255,255,.85);
  color:#222;font-size:13px;font-weight:bold}}
.pright{{display:flex;align-items:center;gap:10px}}
.trail{{display:flex;gap:4px}}
.trail span{{width:24px;height:24px;border-radius:4px;border:2px solid #fff}}
.pfoot{{display:flex;padding:0 12px 8px}}
.cue{{position:absolute;left:50%;top:50%;width:44px;height:44px;margin:-22px 0 0 -22px;border-radius:50%;
  background:#fff;border:8px solid #111;box-sizing:border-box;pointer-events:none}}
.btn.pdone{{position:relative;min-width:150px;height:48px;background:#8d949b;color:#fff;font-size:{title_px}px}}
.bar .btn.pdone{{min-width:100px;height:{btn_px}px;background:#8d949b;border-color:rgba(255,255,255,.75)}}
"""
