"""`mmrl report RUN_DIR`: plots, report.md and a self-contained report.html whose gallery a real browser renders.

Two run directories: one written by a real 2-step shapes run of the tiny model, and a synthetic one with a kept
LaTeX render (and a render failure) and a GUI answer, whose page is opened in headless Chromium. Multi-turn
episodes (a browser task with clicks, a zoom question with boxes and crops) are checked as strips of screens with
the actions drawn on them.
"""

import base64
import io
import json
import re
from pathlib import Path

import pytest
from PIL import Image, ImageDraw

from mmrl.cli import main
from mmrl.recipes.shapes.data import build
from mmrl.run.report import read_jsonl, write_report

ROOT = Path(__file__).resolve().parents[1]
HOSTILE = "<script>alert(1)</script><img src=x onerror=alert(2)> & </pre>"


def _browser_check(html: Path, shot: Path) -> dict:
    """Open the page in headless Chromium (no network), screenshot it, and count the images that decoded."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1300, "height": 900})
        requests: list[str] = []
        page.on("request", lambda r: requests.append(r.url))
        dialogs: list[str] = []
        page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
        page.goto(html.as_uri(), wait_until="load")
        imgs = page.eval_on_selector_all(
            "img", "els => els.map(e => [e.getAttribute('alt'), e.complete && e.naturalWidth > 0])"
        )
        text = page.inner_text("body")
        scripts = page.eval_on_selector_all("script", "els => els.length")
        page.screenshot(path=str(shot), full_page=True)
        browser.close()
    return {"imgs": imgs, "text": text, "requests": requests, "dialogs": dialogs, "scripts": scripts}


@pytest.mark.chromium
def test_report_of_a_real_tiny_shapes_run(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    data = tmp_path / "data"
    build(data, n_train=48, n_eval=8, n_sft=0, seed=3)
    run = tmp_path / "run"
    args = [
        "train",
        str(ROOT / "recipes/shapes/tiny.yaml"),
        "--output-dir",
        str(run),
        "--max-steps",
        "2",
        f"data.train={data / 'train.jsonl'}",
        f"data.eval={data / 'eval.jsonl'}",
        "train.prompts_per_step=4",
        "rollout.n=4",
        "eval.max_samples=8",
        "eval.every=1",
        "train.progress=false",
        "train.save_every=0",
    ]
    assert main(args) == 0
    assert f"report: {run / 'report.html'}" in capsys.readouterr().out
    (run / "report.html").unlink()
    assert main(["report", str(run)]) == 0
    printed = capsys.readouterr().out
    assert str(run / "report.html") in printed
    for name in ("reward", "kl", "entropy", "response_length", "groups_with_signal", "eval_accuracy"):
        assert (run / "plots" / f"{name}.png").stat().st_size > 5000, name
        assert f"plots/{name}.png" in printed
    md = (run / "report.md").read_text()
    assert "| start_accuracy |" in md and "(plots/eval_accuracy.png)" in md
    rows = read_jsonl(run / "rollouts.jsonl")
    assert {r["step"] for r in rows} == {1, 2}
    html = (run / "report.html").read_text()
    assert html.count('<div class="group">') == len(rows)  # both steps, every logged group
    assert html.index("step 2 &middot;") < html.index("step 1 &middot;")  # latest first
    got = _browser_check(run / "report.html", tmp_path / "shapes.png")
    inputs = [ok for alt, ok in got["imgs"] if alt == "input image"]
    assert len(inputs) == len(rows) and all(inputs)
    assert all(ok for _, ok in got["imgs"]), got["imgs"]  # the plots, referenced relative to the run dir
    assert rows[0]["prompt"].split("\n")[-1][:20] in got["text"]
    assert all(u.startswith(("file://", "data:")) for u in got["requests"])  # nothing from the network


def _synthetic_run(tmp_path: Path) -> Path:
    run = tmp_path / "synth"
    run.mkdir()
    config = {
        "model": {"path": "x", "min_pixels": 3136, "max_pixels": 256 * 28 * 28},
        "rewards": [{"name": "latex_table"}, {"name": "gui_action"}],
    }
    (run / "config.json").write_text(json.dumps(config))
    metrics = [
        {"step": 0, "eval/accuracy": 0.25, "eval/accuracy/easy": 0.5, "eval/accuracy/hard": 0.0},
        *[
            {
                "step": s,
                "reward/mean": 0.1 * s,
                "reward/latex_table": 0.1 * s,
                "reward/latex_table/teds_s": 0.05 * s,
                "reward/latex_table/compile": 1.0,
                "kl": 0.01 * s,
                "entropy": 1.0 - 0.05 * s,
                "response_length/mean": 30.0 + s,
                "rollout/groups_with_signal": 0.5,
                "time/update": 1.0,
            }
            for s in range(1, 4)
        ],
    ]
    metrics[-1] |= {"eval/accuracy": 0.75, "eval/accuracy/easy": 1.0, "eval/accuracy/hard": 0.5}
    lines = [json.dumps(m) for m in metrics]
    (run / "metrics.jsonl").write_text("\n".join(lines) + '\n{"step": 4, "reward/me')  # a row being written
    table = tmp_path / "table.png"
    Image.new("RGB", (200, 80), (250, 250, 250)).save(table)
    screen = tmp_path / "screen.png"
    img = Image.new("RGB", (1000, 500), (235, 235, 240))
    ImageDraw.Draw(img).rectangle([450, 200, 550, 300], fill=(60, 120, 220))
    img.save(screen)
    latex = {
        "step": 3,
        "id": "tbl/0",
        "prompt": "Write the LaTeX of this table.",
        "images": [str(table)],
        "answer": "\\begin{tabular}{cc}a&b\\end{tabular}",
        "responses": [
            {
                "text": "\\begin{tabular}{cc}a&b\\end{tabular}",
                "finish": "stop",
                "reward": 1.0,
                "parts": {"latex_table": 1.0, "latex_table/teds_s": 1.0},
            },
            {"text": HOSTILE, "finish": "length", "reward": 0.0, "parts": {"latex_table": 0.0}},
        ],
    }
    gui = {
        "step": 3,
        "id": "gui-7",
        "prompt": "Tap the blue button.",
        "images": [str(screen)],
        "answer": json.dumps({"action": "click", "bbox": [450, 200, 550, 300]}),
        "responses": [
            # 616x308 is what the policy saw (smart_resize of 1000x500 under 200704 px): (308, 154) is the box centre
            {
                "text": "<think>blue</think><answer>[{'action': 'click', 'coordinate': [308, 154]}]</answer>",
                "finish": "stop",
                "reward": 3.0,
                "parts": {"gui_action/coord": 1.0},
            },
            {"text": "<answer>" + HOSTILE + "</answer>", "finish": "stop", "reward": 0.0, "parts": {}},
        ],
    }
    older = {**latex, "step": 1, "id": "tbl/old"}
    (run / "rollouts.jsonl").write_text("\n".join(json.dumps(r) for r in (older, latex, gui)) + "\n")
    kept = run / "renders" / "step-3" / "tbl_0-0"  # renders/step-N/<id stem>-<response>
    kept.mkdir(parents=True)
    Image.new("RGB", (180, 60), (255, 255, 255)).save(kept / "tbl_0-response.png")
    Image.new("RGB", (180, 60), (240, 255, 240)).save(kept / "tbl_0-reference.png")
    failed = run / "renders" / "step-3" / "tbl_0-1"
    failed.mkdir(parents=True)
    (failed / "tbl_0-response.error.txt").write_text("! Undefined control sequence " + HOSTILE)
    Image.new("RGB", (180, 60), (240, 255, 240)).save(failed / "tbl_0-reference.png")
    return run


def _decode(uri: str) -> Image.Image:
    return Image.open(io.BytesIO(base64.b64decode(uri.split(",", 1)[1]))).convert("RGB")


@pytest.mark.chromium
def test_gallery_shows_latex_renders_and_gui_clicks_in_a_browser(tmp_path):
    run = _synthetic_run(tmp_path)
    summary = write_report(run, gallery_steps=1)
    assert summary["start_accuracy"] == 0.25 and summary["final_accuracy"] == 0.75
    assert summary["steps"] == 3  # the torn step-4 line is left out
    assert (run / "plots" / "reward_latex_table.png").exists()
    html = (run / "report.html").read_text()
    assert "<script" not in html and "onerror=alert" not in html.replace("onerror=alert(2)&gt;", "")
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert "tbl/old" not in html  # gallery_steps=1: only the latest logged step
    overlays = re.findall(
        r'<img src="(data:image/png;base64,[^"]+)" alt="prediction and target drawn on the input"', html
    )
    assert len(overlays) == 2
    click = _decode(
        overlays[0]
    )  # 1000x500 screenshot shown at 384x192: the click maps to (500, 250) -> (192, 96)
    assert click.size == (384, 192)
    r, g, b = click.getpixel((192 + 7, 96))
    assert r > 180 and g < 60 and b < 60, (r, g, b)  # the red crosshair at the mapped point
    r, g, b = click.getpixel((round(450 * 0.384) + 1, 96))
    assert g > 140 and r < 60, (r, g, b)  # the green target box edge
    assert "(500, 250) in the 1000x500 screenshot" in html
    assert "no action parsed from the answer" in html

    got = _browser_check(run / "report.html", tmp_path / "synth.png")
    alts = [alt for alt, ok in got["imgs"] if ok]
    assert len(alts) == len(got["imgs"]), got["imgs"]
    assert alts.count("response render") == 1 and alts.count("target render") == 2
    assert alts.count("prediction and target drawn on the input") == 2 and alts.count("input image") == 2
    assert "response render failed" in got["text"] and "Undefined control sequence" in got["text"]
    assert HOSTILE in got["text"]  # shown as text, never run
    assert got["dialogs"] == [] and got["scripts"] == 0
    assert all(u.startswith(("file://", "data:")) for u in got["requests"])


def test_report_tolerates_an_empty_run_and_names_a_wrong_directory(tmp_path, capsys):
    run = tmp_path / "starting"
    run.mkdir()
    (run / "metrics.jsonl").write_text('{"step": 0, "eval/accu')
    summary = write_report(run)
    assert summary["steps"] == 0 and summary["plots"] == []
    assert "no rollouts logged yet" in (run / "report.html").read_text()
    assert main(["report", str(tmp_path / "nope")]) == 2
    assert "not a run directory" in capsys.readouterr().err
    (run / "metrics.jsonl").write_text('{"step": 0}\n{broken\n{"step": 1}\n')
    with pytest.raises(ValueError, match="metrics.jsonl:2: not a JSON object"):
        write_report(run)


def test_training_keeps_renders_where_the_gallery_finds_them(tmp_path):
    """train.keep_renders: the latex_table reward saves what it rendered for the logged groups, keyed by sample id,
    and the report's gallery shows those files (no re-rendering)."""
    from mmrl.cli import main
    from mmrl.recipes.shapes.data import build

    build(tmp_path / "data", n_train=2, n_eval=2, seed=3)
    table = r"\begin{tabular}{cc}a & b \\ 1 & 2\end{tabular}"
    records = [json.loads(x) for x in (tmp_path / "data" / "train.jsonl").read_text().splitlines()]
    with (tmp_path / "data" / "tables.jsonl").open("w") as f:
        for r in records:  # the shapes images, with a LaTeX table as the reference
            f.write(json.dumps({**r, "answer": table}) + "\n")
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(
        f"""
model: {{path: {ROOT / "assets" / "tiny-qwen2.5-vl"}, min_pixels: 3136, max_pixels: 3136}}
data: {{train: data/tables.jsonl}}
rollout: {{n: 2, max_new_tokens: 4, batch_size: 8}}
rewards: [{{name: latex_table}}]
train: {{prompts_per_step: 2, progress: false, keep_renders: true, reward_workers: 1}}
"""
    )
    out = tmp_path / "run"
    assert main(["train", str(cfg), "--output-dir", str(out), "--max-steps", "1"]) == 0
    rows = [json.loads(x) for x in (out / "rollouts.jsonl").read_text().splitlines()]
    for row in rows:
        for j in range(2):
            folder = out / "renders" / "step-1" / f"{row['id']}-{j}"
            kept = sorted(p.name for p in folder.iterdir())
            assert any(n.startswith(f"{row['id']}-response") for n in kept), kept
    html = (out / "report.html").read_text()
    assert f"renders/step-1/{rows[0]['id']}-0/" in html or "response render failed" in html


def test_gallery_shows_a_videos_key_frames_and_only_the_runs_overlays(tmp_path):
    """A video input appears as evenly spaced key frames read by the video processor; an overlay is drawn only for
    the rewards the run used (a GUI-looking answer in a run without gui_action gets none)."""
    import cv2
    import numpy as np

    run = tmp_path / "video-run"
    run.mkdir()
    (run / "config.json").write_text(json.dumps({"model": {"path": "x"}, "rewards": [{"name": "mc_letter"}]}))
    clip = tmp_path / "clip.mp4"
    writer = cv2.VideoWriter(str(clip), cv2.VideoWriter_fourcc(*"mp4v"), 8.0, (64, 48))
    for t in range(16):  # a bright square moving right, one column step per frame
        frame = np.zeros((48, 64, 3), np.uint8)
        frame[16:32, 2 * t : 2 * t + 16] = 255
        writer.write(frame)
    writer.release()
    row = {
        "step": 2,
        "id": "vid-1",
        "prompt": "<video>Which way does the square move? A. left B. right",
        "images": [],
        "videos": [str(clip)],
        "answer": json.dumps({"action": "click", "bbox": [0, 0, 10, 10]}),
        "responses": [{"text": "B", "finish": "stop", "reward": 1.0, "parts": {}}],
    }
    (run / "rollouts.jsonl").write_text(json.dumps(row) + "\n")
    (run / "metrics.jsonl").write_text(json.dumps({"step": 2, "reward/mean": 1.0}) + "\n")
    html = (run / "report.html").read_text() if write_report(run) else ""
    frames = re.findall(r'<img src="(data:image/png;base64,[^"]+)" alt="input image"\s+title="([^"]+)"', html)
    assert [t.rsplit(" ", 1)[1] for _, t in frames] == ["0", "5", "10", "15"]
    mids = [np.asarray(_decode(uri)) for uri, _ in frames]  # the processor resized them: read the middle row
    lefts = [int(np.argmax(a[a.shape[0] // 2, :, 0] > 128)) for a in mids]
    assert lefts == sorted(lefts) and lefts[-1] > lefts[0]  # the frames are in order: the square moves right
    assert "prediction and target drawn on the input" not in html


def test_gallery_draws_the_pathology_region_from_the_rows_metadata(tmp_path):
    """The pathology reward judges a region kept in the sample's metadata: rollouts.jsonl carries it and the report
    draws the target (green) and the marked region (red) over the tissue."""
    run = tmp_path / "patho-run"
    run.mkdir()
    config = {
        "model": {"path": "x", "min_pixels": 3136, "max_pixels": 3136},
        "rewards": [{"name": "pathology"}],
    }
    (run / "config.json").write_text(json.dumps(config))
    tile = tmp_path / "tile.png"
    Image.new("RGB", (112, 112), (240, 200, 230)).save(tile)
    row = {
        "step": 1,
        "id": "patho-1",
        "prompt": "Mark the tumour.",
        "images": [str(tile)],
        "answer": "tumour",
        "metadata": {"region": [60, 10, 100, 50]},
        "responses": [
            {"text": "<answer>tumour <box>[30,5,50,25]</box></answer>", "finish": "stop", "reward": 0.9},
            {"text": "<answer>stroma</answer>", "finish": "stop", "reward": 0.0},
        ],
    }
    (run / "rollouts.jsonl").write_text(json.dumps(row) + "\n")
    (run / "metrics.jsonl").write_text(json.dumps({"step": 1, "reward/mean": 0.45}) + "\n")
    write_report(run)
    html = (run / "report.html").read_text()
    shown = re.findall(
        r'<img src="(data:image/png;base64,[^"]+)" alt="prediction and target drawn on the input">', html
    )
    assert len(shown) == 2 and "region IoU 1.00" in html and "no region marked" in html
    marked, unmarked = _decode(shown[0]), _decode(shown[1])
    assert unmarked.getpixel((60, 30)) == (0, 170, 0)  # the target's left edge, green
    assert marked.getpixel((60, 30)) == (220, 0, 0)  # the marked box maps onto it exactly (drawn last, red)


# ---------------------------------------------------------------------------------------------- episode strips

SCREEN_0, SCREEN_1 = (230, 230, 235), (200, 220, 255)  # the browser's first screen and the one after turn 0
PAGE, CROP_0, CROP_1 = (245, 240, 225), (255, 230, 200), (220, 255, 220)


def _png(path: Path, size: tuple[int, int], colour: tuple[int, int, int]) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", size, colour).save(path)
    return str(path)


def _turn(action: str, images: list[str], info: dict, reward: float = 0.0) -> dict:
    return {
        "action": action,
        "reward": reward,
        "state_key": "s",
        "finish_reason": "stop",
        "images": images,
        "info": info,
    }


def _episode_run(tmp_path: Path) -> Path:
    """A run of two logged multi-turn groups: a browser task (clicks on 400x300 screenshots; an invalid action that
    shows no new screen; a screenshot file that is missing) and a zoom question (boxes on an 800x600 page, crops)."""
    run = tmp_path / "episodes-run"
    run.mkdir()
    (run / "config.json").write_text(
        json.dumps({"model": {"path": "x"}, "rewards": [{"name": "env_return"}]})
    )
    metrics = [
        {"step": s, "reward/mean": 0.3 * s, "episode/success": 0.3 * s, "episode/step_accuracy": 0.2 * s,
         "episode/turns_mean": 4.0 - 0.5 * s}
        for s in range(1, 4)
    ]  # fmt: skip
    (run / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in metrics))
    # a sample image is where the trainer found it; turn images are relative to the run folder
    first = _png(tmp_path / "data" / "screen-0.png", (400, 300), SCREEN_0)
    _png(run / "episodes/b0/step-01.png", (400, 300), SCREEN_1)
    browser = {
        "step": 3,
        "id": "app-1",
        "prompt": "Turn on dark mode.",
        "images": [first],
        "answer": json.dumps({"action": "click", "bbox": [0, 0, 10, 10]}),  # GUI-looking, but no overlay
        "metadata": {},
        "responses": [
            {
                "text": "{'action': 'click', 'coordinate': [50, 250]}",
                "finish": "stop",
                "reward": 1.0,
                "parts": {"env_return": 1.0},
                "episode": {"end": "done", "return": 1.0},
                "turns": [
                    _turn(
                        "{'action': 'click', 'coordinate': [100, 80]}",
                        ["episodes/b0/step-01.png"],
                        {"action": "click", "target_hit": True, "point": [100, 80]},
                    ),
                    _turn(
                        "<script>alert(1)</script> tap it",
                        [],
                        {"action": "invalid", "invalid": True, "target_hit": False, "point": None},
                    ),
                    _turn(
                        "{'action': 'click', 'coordinate': [300, 200]}",
                        ["episodes/b0/step-03.png"],
                        {"action": "click", "target_hit": True, "point": [300, 200]},
                    ),
                    _turn(
                        "{'action': 'click', 'coordinate': [50, 250]}",
                        [],
                        {"action": "click", "target_hit": True, "success": True, "point": [50, 250]},
                        1.0,
                    ),
                ],
            },
            {
                "text": "{'action': 'scroll', 'direction': 'down'}",
                "finish": "stop",
                "reward": 0.0,
                "parts": {},
                "episode": {"end": "error", "return": 0.0, "error": "worker died <b>x</b>"},
                "turns": [_turn("{'action': 'scroll', 'direction': 'down'}", [], {"action": "scroll"})],
            },
        ],
    }
    page = _png(tmp_path / "data" / "page.png", (800, 600), PAGE)
    _png(run / "episodes/z0/crop-0.png", (300, 200), CROP_0)
    _png(run / "episodes/z0/crop-1.png", (280, 200), CROP_1)
    _png(run / "episodes/z1/crop-0.png", (300, 300), CROP_1)
    zoom = {
        "step": 3,
        "id": "chart-9",
        "prompt": "What is the value in the small label?",
        "images": [page],
        "answer": "42",
        "metadata": {"target_box": [600, 450, 700, 520]},
        "responses": [
            {
                "text": "<answer>42</answer>",
                "finish": "stop",
                "reward": 1.0,
                "parts": {},
                "episode": {"end": "done", "return": 1.0},
                "turns": [
                    _turn(
                        "zoom(500, 400, 800, 600)",
                        ["episodes/z0/crop-0.png"],
                        {"action": "zoom", "box": [500, 400, 800, 600], "zoom_hit": True},
                    ),
                    _turn(
                        "zoom(620, 460, 690, 510)",
                        ["episodes/z0/crop-1.png"],
                        {"action": "zoom", "box": [620, 460, 690, 510], "zoom_hit": True},
                    ),
                    _turn("<answer>42</answer>", [], {"action": "answer", "correct": True}, 1.0),
                ],
            },
            {
                "text": "zoom(0, 0, 300, 300)",
                "finish": "stop",
                "reward": 0.0,
                "parts": {},
                "episode": {"end": "max_turns", "return": 0.0},
                "turns": [
                    _turn(
                        "zoom(0, 0, 300, 300)",
                        ["episodes/z1/crop-0.png"],
                        {"action": "zoom", "box": [0, 0, 300, 300], "zoom_hit": False},
                    )
                ],
            },
        ],
    }
    (run / "rollouts.jsonl").write_text(json.dumps(browser) + "\n" + json.dumps(zoom) + "\n")
    return run


def _strips(html: str) -> list[list[str]]:
    """Each strip of the page as the HTML of its cells."""
    strips = [s.split("</td></tr>", 1)[0] for s in html.split('<div class="strip"')[1:]]
    return [s.split('<div class="cell')[1:] for s in strips]


def _cell_image(cell: str) -> Image.Image:
    return _decode(re.search(r'<img src="(data:image/png;base64,[^"]+)"', cell).group(1))


def _near(img: Image.Image, x: float, y: float, colour: tuple[int, int, int], r: int = 1) -> bool:
    """Whether ``colour`` is at (x, y) or within ``r`` pixels of it (a 1-px line at a fractional place)."""
    return any(
        img.getpixel((round(x) + dx, round(y) + dy)) == colour
        for dx in range(-r, r + 1)
        for dy in range(-r, r + 1)
    )


def test_episode_strips_show_each_turn_on_the_screen_it_acted_on(tmp_path):
    run = _episode_run(tmp_path)
    summary = write_report(run)
    assert summary["final_episode/success"] == pytest.approx(0.9)
    plots = {Path(p).name for p in summary["plots"]}
    assert {"episode.png", "episode_counts.png"} <= plots  # rates (success, step accuracy) apart from turns
    html = (run / "report.html").read_text()
    strips = _strips(html)
    # one strip per response: a cell per turn and one for the end; no single-turn overlay on an episode
    assert [len(s) for s in strips] == [5, 2, 4, 2]
    assert "prediction and target drawn on the input" not in html

    browser = strips[0]
    assert "<script" not in html and "&lt;script&gt;alert(1)&lt;/script&gt; tap it" in browser[1]
    on = [_cell_image(c).getpixel((3, 3)) if "<img" in c else None for c in browser]
    # 0: the first screen; 1 (invalid) and 2: the screen turn 0 brought; 3: turn 2's screenshot is missing
    assert on[:3] == [SCREEN_0, SCREEN_1, SCREEN_1] and on[3] is None
    assert "image not found: episodes/b0/step-03.png" in browser[3]
    assert "on turn 0&#39;s image" in browser[2] and "invalid action: the screen stays" in browser[1]
    # 400x300 screens shown at 256x192: the clicks (100, 80) and (300, 200) at (64, 51.2) and (192, 128)
    assert _cell_image(browser[0]).getpixel((64, 51)) == (220, 0, 0)
    assert _cell_image(browser[2]).getpixel((192, 128)) == (220, 0, 0)
    assert _cell_image(browser[1]).getpixel((192, 128)) == SCREEN_1  # no click drawn for the invalid action
    assert "target ✓" in browser[0] and "target ✗" in browser[1]
    assert "end: done" in browser[4] and "return 1.000" in browser[4] and "4 turns" in browser[4]
    assert "<img" not in browser[4]  # the last action brought no screen
    assert "end: error" in strips[1][1] and "worker died &lt;b&gt;x&lt;/b&gt;" in strips[1][1]

    zoom = strips[2]
    page = _cell_image(zoom[0])  # 800x600 shown at 256x192 (x0.32), every zoom box drawn on it
    assert page.size == (256, 192)
    assert _near(page, 500 * 0.32, 500 * 0.32, (220, 0, 0))  # turn 0's box, left edge
    assert _near(page, 620 * 0.32, 485 * 0.32, (220, 0, 0))  # turn 1's box, left edge
    assert _near(page, 700 * 0.32, 485 * 0.32, (0, 170, 0))  # the target box, right edge
    # each crop, then acted on; after the last zoom of a max_turns episode, its crop is in the end cell
    assert [_cell_image(c).getpixel((3, 100)) for c in zoom[1:3]] == [CROP_0, CROP_1]
    assert "zoom [620, 460, 690, 510] (drawn on the first image)" in zoom[1]
    assert "zoom hit ✓" in zoom[0] and "correct ✓" in zoom[2]
    assert "<img" not in zoom[3] and "end: done" in zoom[3]
    assert _cell_image(strips[3][1]).getpixel((100, 100)) == CROP_1
    assert "end: max_turns" in strips[3][1] and "turn 0&#39;s image, not acted on" in strips[3][1]


def test_an_env_judged_run_names_its_env_and_shows_no_empty_reference(tmp_path):
    """A gui_agent run: no reward functions (the env's return is the reward) and records with no reference answer.
    The summary names the env rather than "?", and a group without a reference shows no "answer: null" block."""
    run = _episode_run(tmp_path)
    (run / "config.json").write_text(json.dumps({"model": {"path": "x"}, "rollout": {"env": "browser_app"}}))
    rows = [json.loads(line) for line in (run / "rollouts.jsonl").read_text().splitlines()]
    rows[0]["answer"] = None
    (run / "rollouts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    write_report(run)
    html = (run / "report.html").read_text()
    assert "<th>rewards</th><td>env browser_app</td>" in html
    groups = html.split('<div class="group">')[1:]
    assert [("<b>answer</b>" in g) for g in groups] == [False, True]
    assert "<pre>42</pre>" in groups[1] and "<pre>null</pre>" not in html


@pytest.mark.chromium
def test_episode_strips_in_a_browser(tmp_path):
    run = _episode_run(tmp_path)
    write_report(run)
    got = _browser_check(run / "report.html", tmp_path / "strips.png")
    shown = [ok for alt, ok in got["imgs"] if alt in ("episode screen", "final screen")]
    assert len(shown) == 9 and all(shown)  # 9 turns and a final crop, less the missing screenshot
    assert "<script>alert(1)</script> tap it" in got["text"]  # shown as text, never run
    assert "image not found: episodes/b0/step-03.png" in got["text"]
    assert got["dialogs"] == [] and got["scripts"] == 0
