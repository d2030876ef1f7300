"""Why GRPO moves the gui tiny recipe's clicks so little: a diagnosis of its warm start's click distribution.

Loads a checkpoint (default the recipe's warm start ``assets/gui-sft/model``) the way ``recipes/gui/tiny.yaml`` does
(``Policy.from_pretrained`` with the recipe's ``ModelConfig``, the HF rollout engine, the recipe's ``rewards:`` as a
``CompositeReward``) and measures, on the first ``--prompts`` click records of the RL split:

1. resolution and image use: the model-input grid against the targets' boxes; how well an image-blind layout
   prior (a point per named target, fitted on the RL split) and priors that also know coarse structure (search
   field / tab bar shown) and the other bar icon click on the held-out set, next to the checkpoint's greedy hits
   per target kind; whether the checkpoint's answers change when each screenshot is swapped for another prompt's;
   the image tokens' content contrast and the attention the answer puts on them; linear probes (ridge) on the image
   tokens for what the screen shows (is the information there at this resolution?);
2. coordinate tokens: how the tokenizer splits an answer and its coordinates, and at which token a hit and a miss of
   the same group first part;
3. exploration: greedy hit rate; at each ``--temps`` temperature the mean per-sample hit rate, the share of groups of
   ``--group`` samples holding at least one hit and one miss (observed on the first ``--group`` samples, and
   expected from all ``--samples``), the spread of the sampled points (std, original px) against the box sizes,
   where misses land (distance to the box, inside which other element);
4. reward: in click groups with a non-zero reward variance, the share of that variance carried by each part
   (``Cov(R, part) / Var(R)``, the three shares sum to 1).

    OMP_NUM_THREADS=1 python benchmarks/gui_click_diagnosis.py [--model DIR] [--prompts 100] [--json OUT]

Extra ``key=value`` arguments override the recipe (``model.max_pixels=...``). ``--temps`` with no value and
``--probe-train 0`` leave out the sampling and the probes (a quick look at a trained checkpoint). The last line is a
one-line summary. About 1-2 minutes on one CPU thread (6,400 sampled answers), more on a loaded machine.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time
from collections import Counter, defaultdict
from dataclasses import replace as replace_field
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
RECIPE = ROOT / "recipes" / "gui" / "tiny.yaml"
PART_NAMES = ("type", "coord", "format")


def load(model: str | None, overrides: list[str]) -> tuple[Any, Any, Any, Any]:
    """The recipe's config, its policy (frozen), the HF engine and the recipe's composite reward."""
    from mmrl.config import load_config
    from mmrl.model.policy import Policy
    from mmrl.rewards.compose import CompositeReward
    from mmrl.rollout.hf import HFEngine

    cfg = load_config(RECIPE, ([f"model.path={model}"] if model else []) + overrides)
    policy = Policy.from_pretrained(cfg.model, trainable=False)
    return cfg, policy, HFEngine(policy, batch_size=cfg.rollout.batch_size), CompositeReward(cfg.rewards)


def click_samples(path: str, k: int) -> list[Any]:
    from mmrl.data import load_dataset

    return [s for s in load_dataset(path).samples if s.answer["action"] == "click"][:k]


# ------------------------------------------------------------------------------------------ one answer, geometrically
def box_distance(x: float, y: float, box: list[float]) -> float:
    """Euclidean distance from a point to a box (0 inside)."""
    x1, y1, x2, y2 = box
    return math.hypot(max(x1 - x, 0.0, x - x2), max(y1 - y, 0.0, y - y2))


def landed_on(x: float, y: float, sample: Any) -> dict[str, Any] | None:
    """The smallest element of the screen whose box holds the point."""
    inside = [e for e in sample.metadata["elements"] if box_distance(x, y, e["bbox"]) == 0.0]
    return min(
        inside, key=lambda e: (e["bbox"][2] - e["bbox"][0]) * (e["bbox"][3] - e["bbox"][1]), default=None
    )


def analyse(sample: Any, ri: Any, result: Any) -> dict[str, Any]:
    """Parts of the recipe's reward plus where the click went, in original (screenshot) pixels."""
    from mmrl.rewards.gui import parse_action, to_original

    parts = {p: result.parts.get(f"gui_action/{p}", 0.0) for p in PART_NAMES}
    out: dict[str, Any] = {"score": result.score, **parts, "point": None, "dist": None, "landed": "no click"}
    pred = parse_action(ri.response)
    if pred is not None and pred.action == "click" and pred.point is not None:
        x, y = to_original(ri.metadata)(*pred.point)
        box = sample.answer["bbox"]
        el = landed_on(x, y, sample)
        target = sample.metadata["target"]
        if parts["coord"]:
            where = "target"
        elif el is None:
            where = "no element"
        elif el["kind"] == target["kind"]:
            where = "other " + target["kind"]
        else:
            where = "other kind"
        out.update(point=(x, y), dist=box_distance(x, y, box), landed=where)
    return out


def run(engine: Any, reward: Any, policy: Any, samples: list[Any], temperature: float, n: int, max_new: int):
    """``[prompt][sample]`` analyses and completions at one temperature (0 = greedy)."""
    from mmrl.rollout import SamplingParams
    from mmrl.train.collect import reward_inputs

    prompts = [policy.encode(s) for s in samples]
    groups = engine.generate(prompts, SamplingParams(n=n, temperature=temperature, max_new_tokens=max_new))
    out = []
    for s, p, g in zip(samples, prompts, groups):
        ris = reward_inputs(s, p, [c.text for c in g], [len(c.token_ids) for c in g])
        out.append(
            [
                analyse(s, ri, r) | {"tokens": c.token_ids, "logp": sum(c.logprobs)}
                for ri, r, c in zip(ris, reward(ris), g)
            ]
        )
    return out


# ------------------------------------------------------------------------------------------------------- measurements
def layout_priors(train_path: str, eval_samples: list[Any]) -> dict[str, float]:
    """Hit rate on ``eval_samples`` of a point chosen per key on the whole RL split (the training box centre that
    falls in most training boxes of its key): ``blind`` keys on the instruction's target alone, ``structure`` adds
    whether a search field and a tab bar are on screen, ``+partner icon`` adds the other bar icon."""
    from mmrl.data import load_dataset

    def keys(s: Any) -> dict[str, tuple]:
        m, t = s.metadata, s.metadata["target"]
        kinds = {e["kind"] for e in m["elements"]}
        bar = ("search", "settings", "share", "more")
        partner = tuple(e["name"] for e in m["elements"] if e["name"] in bar and e["id"] != t["id"])
        blind = (t["kind"], t["name"])
        struct = (*blind, "field" in kinds, "tab" in kinds)
        return {
            "blind": blind,
            "structure": struct,
            "+partner icon": (*struct, partner if t["kind"] == "icon" else ()),
            "instruction": (m["instruction"],),
        }

    train = [s for s in load_dataset(train_path).samples if s.answer["action"] == "click"]
    points: dict[tuple, tuple[float, float]] = {}

    def predict(s: Any, name: str, best: dict) -> tuple[float, float]:
        k = keys(s)[name]  # a key the RL split never shows falls back on the coarser prior's point
        return best[k] if k in best else points[keys(s)["blind"]]

    rates = {}
    for name in ("blind", "structure", "+partner icon"):
        boxes: dict[tuple, list[list[float]]] = defaultdict(list)
        for s in train:
            boxes[keys(s)[name]].append(s.answer["bbox"])
        best = {}
        for k, bs in boxes.items():
            centres = [((b[0] + b[2]) / 2, (b[1] + b[3]) / 2) for b in bs]
            best[k] = max(centres, key=lambda c: sum(box_distance(*c, b) == 0 for b in bs))
        if name == "blind":
            points.update(best)
        hits = [box_distance(*predict(s, name, best), s.answer["bbox"]) == 0 for s in eval_samples]
        rates[name] = float(np.mean(hits))
        if (
            name == "blind"
        ):  # what any image-blind policy can reach on eval_samples at best: fit on them per instruction
            boxes = defaultdict(list)
            for s in eval_samples:
                boxes[keys(s)["instruction"]].append(s.answer["bbox"])
            most = [
                max(sum(box_distance((b[0] + b[2]) / 2, (b[1] + b[3]) / 2, o) == 0 for o in bs) for b in bs)
                for bs in boxes.values()
            ]
            rates["blind max (fit on held-out)"] = sum(most) / len(eval_samples)
        for cat in sorted({category(s) for s in eval_samples}):
            rates[f"{name}/{cat}"] = float(
                np.mean([h for h, s in zip(hits, eval_samples) if category(s) == cat])
            )
    return rates


def category(s: Any) -> str:
    """The target's kind; list rows split by whether a search field pushes them down one row."""
    kind = s.metadata["target"]["kind"]
    if kind != "list_item":
        return kind
    return "list_item+field" if any(e["kind"] == "field" for e in s.metadata["elements"]) else "list_item"


def by_category(groups: list[list[dict]], samples: list[Any], g: int) -> dict[str, dict[str, float]]:
    rows: dict[str, list] = defaultdict(list)
    for grp, s in zip(groups, samples):
        hits = np.array([a["coord"] for a in grp])
        first = hits[:g]
        one = len({a["point"] for a in grp[:g]}) == 1
        rows[category(s)].append((hits.mean(), first.max() > 0 and first.min() < 1, first.max() == 0, one))
    return {
        k: {
            "n": len(v),
            "hit": float(np.mean([r[0] for r in v])),
            "signal": float(np.mean([r[1] for r in v])),
            "all_miss": float(np.mean([r[2] for r in v])),
            "one_point": float(np.mean([r[3] for r in v])),
        }
        for k, v in sorted(rows.items())
    }


def p_mixed(hits: int, total: int, g: int) -> float:
    """P(a group of ``g`` drawn without replacement from ``total`` answers with ``hits`` hits holds a hit and a miss)."""
    c = math.comb
    return 1.0 - (c(hits, g) + c(total - hits, g)) / c(total, g)


def exploration(groups: list[list[dict]], samples: list[Any], g: int) -> dict[str, float]:
    per_prompt = np.array([[a["coord"] for a in grp] for grp in groups])  # [P, N]
    first = per_prompt[:, :g]
    stds, ratios, distinct, same = [], [], [], []
    for grp, s in zip(groups, samples):
        pts = np.array([a["point"] for a in grp if a["point"] is not None])
        b = s.answer["bbox"]
        if len(pts) >= 2:
            sx, sy = pts.std(0)
            stds.append((sx, sy))
            ratios.append((sx / (b[2] - b[0]), sy / (b[3] - b[1])))
        distinct.append(len({a["landed"] for a in grp[:g]}))
        same.append(len({a["point"] for a in grp[:g]}) == 1)
    misses = [a for grp in groups for a in grp if a["point"] is not None and not a["coord"]]
    where = Counter(a["landed"] for grp in groups for a in grp)
    total = sum(where.values())
    stds, ratios = np.array(stds), np.array(ratios)
    parsed = [a for grp in groups for a in grp]
    return {
        "hit": float(per_prompt.mean()),
        "format_ok": float(np.mean([a["format"] for a in parsed])),
        "type_ok": float(np.mean([a["type"] for a in parsed])),
        "signal_observed": float(np.mean((first.max(1) > 0) & (first.min(1) < 1))),
        "signal_expected": float(np.mean([p_mixed(int(r.sum()), len(r), g) for r in per_prompt])),
        "all_hit": float(np.mean(first.min(1) == 1)),
        "all_miss": float(np.mean(first.max(1) == 0)),
        "std_x": float(stds[:, 0].mean()),
        "std_y": float(stds[:, 1].mean()),
        "std_x_over_w": float(ratios[:, 0].mean()),
        "std_y_over_h": float(ratios[:, 1].mean()),
        "one_point_groups": float(np.mean(same)),
        "distinct_landings": float(np.mean(distinct)),
        "miss_dist_median": float(np.median([a["dist"] for a in misses])) if misses else float("nan"),
        "miss_dist_mean": float(np.mean([a["dist"] for a in misses])) if misses else float("nan"),
        **{f"share:{k}": v / total for k, v in sorted(where.items(), key=lambda kv: str(kv[0]))},
    }


def variance_shares(groups: list[list[dict]], g: int) -> dict[str, float]:
    """Over groups of ``g`` whose reward varies: sum_groups Cov(R, part) / sum_groups Var(R) per part (sums to 1),
    and the same restricted to groups holding a hit and a miss (the groups with click signal)."""
    out = {}
    for which in ("any", "click-signal"):
        cov = dict.fromkeys(PART_NAMES, 0.0)
        var, count = 0.0, 0
        for grp in groups:
            grp = grp[:g]
            r = np.array([a["score"] for a in grp])
            c = np.array([a["coord"] for a in grp])
            if r.var() == 0 or (which == "click-signal" and c.var() == 0):
                continue
            count += 1
            var += r.var()
            for p in PART_NAMES:
                cov[p] += float(
                    np.mean((r - r.mean()) * (np.array([a[p] for a in grp]) - np.mean([a[p] for a in grp])))
                )
        out[f"{which}:groups"] = count
        for p in PART_NAMES:
            out[f"{which}:{p}"] = cov[p] / var if var else float("nan")
    return out


def divergence(groups: list[list[dict]], tokenizer: Any, g: int) -> Counter:
    """Where a hit and a miss of the same group first differ: before the point, in x or in y."""
    where: Counter = Counter()
    for grp in groups:
        grp = grp[:g]
        hits = [a["tokens"] for a in grp if a["coord"]]
        misses = [a["tokens"] for a in grp if not a["coord"]]
        for h in hits:
            for m in misses:
                i = next((j for j, (u, v) in enumerate(zip(h, m)) if u != v), min(len(h), len(m)))
                prefix = tokenizer.decode(h[:i])
                at = prefix.rfind("coordinate")
                if at < 0 or "[" not in prefix[at:]:
                    where["before the point"] += 1
                else:
                    where["y" if "," in prefix[at:] else "x"] += 1
    return where


def image_ablation(
    engine: Any, reward: Any, policy: Any, samples: list[Any], max_new: int
) -> dict[str, float]:
    """Greedy answers with each prompt's screenshot swapped for the next prompt's: how many answers stay the same
    (a policy that ignores the pixels keeps them all) and the hit rate then."""
    import dataclasses

    normal = run(engine, reward, policy, samples, 0.0, 1, max_new)
    swapped = [
        dataclasses.replace(s, images=samples[(i + 1) % len(samples)].images) for i, s in enumerate(samples)
    ]
    other = run(engine, reward, policy, swapped, 0.0, 1, max_new)
    return {
        "same_answer": float(np.mean([a[0]["tokens"] == b[0]["tokens"] for a, b in zip(normal, other)])),
        # how much the screenshot moves the answer's probability, where the answer stayed the same
        "abs_dlogp": float(
            np.mean(
                [
                    abs(a[0]["logp"] - b[0]["logp"])
                    for a, b in zip(normal, other)
                    if a[0]["tokens"] == b[0]["tokens"]
                ]
                or [float("nan")]
            )
        ),
        "hit_own_image": float(np.mean([a[0]["coord"] for a in normal])),
        "hit_other_image": float(np.mean([b[0]["coord"] for b in other])),
    }


def probe(policy: Any, train: list[Any], test: list[Any]) -> dict[str, tuple[float, float]]:
    """Linear probes (ridge, one-vs-rest) on the image tokens the language model gets (``[tokens x hidden]``
    flattened): held-out accuracy and the majority-class rate for what the screen shows. Tells whether the
    information a click needs is in the features at this resolution."""
    import torch

    def feats(samples: list[Any]) -> np.ndarray:
        rows = []
        with torch.no_grad():
            for s in samples:
                mm = policy.encode(s).mm
                out = policy.model.get_image_features(
                    pixel_values=mm["pixel_values"].to(policy.device), image_grid_thw=mm["image_grid_thw"]
                )
                rows.append(out.pooler_output[0].flatten().float().cpu().numpy())
        return np.stack(rows)

    def labels(s: Any) -> dict[str, str]:
        els = s.metadata["elements"]
        names = [e["name"] for e in els if e["kind"] == "icon"]
        return {
            "search field shown": str(any(e["kind"] == "field" for e in els)),
            "tab bar shown": str(any(e["kind"] == "tab" for e in els)),
            "bar icons (pair of 4)": str(names[1:]),
            "list rows (3-6)": str(sum(e["kind"] == "list_item" for e in els)),
        }

    xtr, xte = feats(train), feats(test)
    mu, sd = xtr.mean(0), xtr.std(0) + 1e-6
    xtr, xte = (xtr - mu) / sd, (xte - mu) / sd
    out = {}
    for task in labels(train[0]):
        ytr = [labels(s)[task] for s in train]
        yte = [labels(s)[task] for s in test]
        classes = sorted(set(ytr))
        onehot = np.array([[y == c for c in classes] for y in ytr], dtype=float) * 2 - 1
        lam = 10.0 * len(train)  # ridge, dual form: few samples, many features
        alpha = np.linalg.solve(xtr @ xtr.T + lam * np.eye(len(xtr)), onehot)
        pred = [classes[i] for i in (xte @ (xtr.T @ alpha)).argmax(1)]
        majority = Counter(ytr).most_common(1)[0][0]
        out[task] = (
            float(np.mean([p == y for p, y in zip(pred, yte)])),
            float(np.mean([y == majority for y in yte])),
        )
    return out


def image_use(cfg: Any, samples: list[Any], answers: list[list[int]]) -> dict[str, float]:
    """How the language model treats the image tokens: their content contrast (per position, the std across
    screens over the mean norm: 0 = the same vectors for every screen) and the attention mass that the answer tokens
    (the checkpoint's greedy answers, teacher-forced) put on them, per layer (eager attention, a second copy)."""
    import torch

    from mmrl.model.policy import Policy

    policy = Policy.from_pretrained(replace_field(cfg.model, attn_implementation="eager"), trainable=False)
    image_id = policy.tokenizer.convert_tokens_to_ids("<|image_pad|>")
    feats, mass = [], defaultdict(list)
    with torch.no_grad():
        for s, ans in zip(samples, answers):
            p = policy.encode(s)
            feats.append(policy.model.get_image_features(**p.mm).pooler_output[0])  # [tokens, hidden]
            ids = torch.cat([p.input_ids, torch.tensor(ans)])[None]
            out = policy.model(
                input_ids=ids, attention_mask=torch.ones_like(ids), output_attentions=True, **p.mm
            )
            is_image = ids[0] == image_id
            for layer, a in enumerate(out.attentions):  # [1, heads, T, T]
                mass[layer].append(a[0, :, len(p.input_ids) :, is_image].sum(-1).mean().item())
    f = torch.stack(feats)  # [screens, tokens, hidden]
    contrast = (f.std(0).norm(dim=-1).mean() / f.norm(dim=-1).mean()).item()
    return {
        "content_contrast": contrast,
        **{f"attention_layer{k}": float(np.mean(v)) for k, v in mass.items()},
    }


def resolution_table(policy: Any, samples: list[Any]) -> list[str]:
    (ow, oh), (mw, mh) = samples[0].metadata["image_size"], policy.encode(samples[0]).model_image_sizes[0]
    merge = 28  # Qwen2.5-VL: 14 px patches, 2x2 merged into one token
    cols, rows = mw // merge, mh // merge
    cw, ch = ow / cols, oh / rows
    lines = [
        f"screenshot {ow}x{oh} -> model input {mw}x{mh} = {cols}x{rows} = {cols * rows} image tokens; one token "
        f"covers {cw:.1f}x{ch:.1f} screenshot px (a 14 px patch {14 * ow / mw:.1f} px)"
    ]
    sizes: dict[str, set] = defaultdict(set)
    for s in samples:
        b = s.answer["bbox"]
        sizes[s.metadata["target"]["kind"]].add((b[2] - b[0], b[3] - b[1]))
    for kind, ss in sorted(sizes.items()):
        w, h = sorted(ss)[0]
        lines.append(f"  {kind:9s} box {w:g}x{h:g} px = {w / cw:.2f}x{h / ch:.2f} tokens")
    return lines


# ----------------------------------------------------------------------------------------------------------- main
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", help="checkpoint folder (default: the recipe's model.path, the warm start)")
    ap.add_argument("--prompts", type=int, default=100, help="click records of the RL split to diagnose")
    ap.add_argument("--samples", type=int, default=32, help="answers sampled per prompt and temperature")
    ap.add_argument("--group", type=int, default=8, help="GRPO group size (the recipe's rollout.n)")
    ap.add_argument(
        "--temps", type=float, nargs="*", default=[0.7, 1.0], help="none: greedy measurements only"
    )
    ap.add_argument("--eval-clicks", type=int, default=200, help="held-out click records scored greedily")
    ap.add_argument("--probe-train", type=int, default=600, help="RL screens the linear probes are fitted on")
    ap.add_argument("--json", type=Path, help="write the numbers here")
    ap.add_argument("overrides", nargs="*", help="key=value overrides of the recipe (model.max_pixels=...)")
    args = ap.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch

    torch.set_num_threads(1)
    torch.manual_seed(0)
    t0 = time.perf_counter()
    cfg, policy, engine, reward = load(args.model, args.overrides)
    samples = click_samples(cfg.data.train, args.prompts)
    held_out = click_samples(cfg.data.eval, args.eval_clicks)
    tok = policy.tokenizer
    max_new = cfg.rollout.max_new_tokens
    res: dict[str, Any] = {"model": cfg.model.path, "prompts": len(samples), "held_out_clicks": len(held_out)}

    print(f"== checkpoint {cfg.model.path}: {len(samples)} RL click prompts, {len(held_out)} held-out clicks")
    print("\n== (1) resolution and image use")
    for line in resolution_table(policy, samples):
        print(line)
    greedy = run(engine, reward, policy, samples, 0.0, 1, max_new)
    greedy_eval = run(engine, reward, policy, held_out, 0.0, 1, max_new)
    priors = layout_priors(cfg.data.train, held_out)
    by_kind: dict[str, list[float]] = defaultdict(list)
    for s, grp in zip(held_out, greedy_eval):
        by_kind[category(s)].append(grp[0]["coord"])
    res["greedy_hit_train"] = float(np.mean([g[0]["coord"] for g in greedy]))
    res["greedy_hit_eval"] = float(np.mean([g[0]["coord"] for g in greedy_eval]))
    res["priors_eval"] = priors
    res["greedy_eval_by_kind"] = {k: (float(np.mean(v)), len(v)) for k, v in by_kind.items()}
    print(
        f"held-out click hits, greedy: checkpoint {res['greedy_hit_eval']:.3f}; layout priors (no pixels read): "
        + ", ".join(f"{k} {v:.3f}" for k, v in priors.items() if "/" not in k)
    )
    cols = [k for k in priors if "/" not in k and k != "blind max (fit on held-out)"]
    print(f"  {'target':16s} {'n':>4s} {'checkpoint':>10s} " + " ".join(f"{k:>13s}" for k in cols))
    for cat, (m, n) in sorted(res["greedy_eval_by_kind"].items()):
        print(f"  {cat:16s} {n:4d} {m:10.2f} " + " ".join(f"{priors[k + '/' + cat]:13.2f}" for k in cols))

    abl = image_ablation(engine, reward, policy, held_out, max_new)
    res["image_ablation"] = abl
    print(
        f"screenshot swapped for another prompt's: {abl['same_answer']:.2f} of greedy answers unchanged (their "
        f"log-prob moves by {abl['abs_dlogp']:.3f} on average); hits "
        f"{abl['hit_own_image']:.3f} with its own screenshot, {abl['hit_other_image']:.3f} with another"
    )
    use = image_use(cfg, held_out[:30], [g[0]["tokens"] for g in greedy_eval[:30]])
    res["image_use"] = use
    print(
        f"image tokens: content contrast {use['content_contrast']:.3f} (std across screens / norm); the answer "
        "tokens' attention on them: "
        + ", ".join(f"layer {k[15:]} {v:.2f}" for k, v in use.items() if k.startswith("attention"))
    )
    from mmrl.data import load_dataset

    every = load_dataset(cfg.data.train).samples
    pr = (
        probe(policy, every[: args.probe_train], load_dataset(cfg.data.eval).samples)
        if args.probe_train
        else {}
    )
    res["probe"] = pr
    if pr:
        print(
            f"linear probes on the {policy.encode(samples[0]).model_image_sizes[0]} image tokens "
            f"({args.probe_train} RL screens -> the held-out screens): "
            + "; ".join(f"{k} {a:.2f} (majority {m:.2f})" for k, (a, m) in pr.items())
        )

    print("\n== (2) coordinate tokens")
    text = greedy[0][0]["tokens"]
    print(f"greedy answer: {[tok.decode([t]) for t in text]}")
    for pt in ("[70, 71]", "[7, 251]", "[139, 120]"):
        print(f"  {pt:11s} -> {[tok.decode([t]) for t in tok(pt)['input_ids']]}")

    print(
        f"\n== (3) exploration (groups of {args.group}; expected share from {args.samples} samples per prompt)"
    )
    print(f"greedy hit rate on these RL prompts: {res['greedy_hit_train']:.3f}")
    res["temps"] = {}
    for t in args.temps:
        groups = run(engine, reward, policy, samples, t, args.samples, max_new)
        e = exploration(groups, samples, args.group)
        v = variance_shares(groups, args.group)
        d = divergence(groups, tok, args.group)
        cats = by_category(groups, samples, args.group)
        res["temps"][str(t)] = {**e, **v, "divergence": dict(d), "by_category": cats}
        print(
            f"T={t}: hit/sample {e['hit']:.3f} (format {e['format_ok']:.3f}, type {e['type_ok']:.3f}); groups with "
            f"a hit and a miss {e['signal_observed']:.2f} observed, {e['signal_expected']:.2f} expected; all hit "
            f"{e['all_hit']:.2f}, all miss {e['all_miss']:.2f}; distinct landing places per group "
            f"{e['distinct_landings']:.2f}"
        )
        print(
            f"  point spread (per-prompt std, mean over prompts) x {e['std_x']:.1f} px, y {e['std_y']:.1f} px = "
            f"{e['std_x_over_w']:.2f} box widths, {e['std_y_over_h']:.2f} box heights; groups whose {args.group} "
            f"points are one point {e['one_point_groups']:.2f}; misses land "
            f"{e['miss_dist_median']:.1f} px (median; mean {e['miss_dist_mean']:.1f}) from the box"
        )
        print(
            "  where answers land: "
            + ", ".join(f"{k[6:]} {x:.3f}" for k, x in e.items() if k.startswith("share:"))
        )
        print(
            f"  share of reward variance, groups whose reward varies ({v['any:groups']}): "
            + ", ".join(f"{p} {v['any:' + p]:.2f}" for p in PART_NAMES)
            + f"; groups with click signal ({v['click-signal:groups']}): "
            + ", ".join(f"{p} {v['click-signal:' + p]:.2f}" for p in PART_NAMES)
        )
        print(
            "  by target: "
            + "; ".join(
                f"{k} ({c['n']}): hit/sample {c['hit']:.2f}, signal {c['signal']:.2f}, all miss {c['all_miss']:.2f}, "
                f"one point {c['one_point']:.2f}"
                for k, c in cats.items()
            )
        )
        total = sum(d.values()) or 1
        print(
            "  a hit and a miss first differ at: "
            + ", ".join(f"{k} {n / total:.2f}" for k, n in d.most_common())
        )
    res["wall_s"] = time.perf_counter() - t0
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(res, indent=1))
    if not res["temps"]:
        print(
            f"\ngreedy hit {res['greedy_hit_train']:.2f} (held-out {res['greedy_hit_eval']:.2f}); screenshot swap "
            f"leaves {abl['same_answer']:.0%} of answers unchanged; {res['wall_s']:.0f} s"
        )
        return
    t07 = res["temps"].get("0.7", next(iter(res["temps"].values())))
    print(
        f"\nclick signal groups: {t07['signal_observed']:.0%} at T=0.7 (expected {t07['signal_expected']:.0%}); "
        f"greedy hit {res['greedy_hit_train']:.2f} (held-out {res['greedy_hit_eval']:.2f}, blind layout prior "
        f"{priors['blind']:.2f}, structure prior {priors['structure']:.2f}); hit/sample {t07['hit']:.2f}; spread "
        f"{t07['std_x_over_w']:.2f}x{t07['std_y_over_h']:.2f} box; coord share of variance in signal groups "
        f"{t07['click-signal:coord']:.2f}; screenshot swap leaves {abl['same_answer']:.0%} of greedy answers "
        f"unchanged; {res['wall_s']:.0f} s"
    )


if __name__ == "__main__":
    main()
