"""Supervised warm start (``mmrl sft``): teach a policy a recipe's answer format before RL.

Domain papers (Table2LaTeX-RL, Patho-R1, UI-R1's baselines) start RL from an SFT'd model; a randomly initialised
tiny model cannot earn any reward, so the tiny recipes do the same. The loss is the mean token NLL of
``answer + <|im_end|>`` after the chat prompt, i.e. exactly the tokens the policy would generate.
"""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

import torch

from mmrl.config import Config, to_dict
from mmrl.data import ensure_built, load_split
from mmrl.policy import Policy
from mmrl.trainer import seed_everything


def answer_text(answer: object) -> str:
    return answer if isinstance(answer, str) else json.dumps(answer)


def run_sft(cfg: Config, output_dir: str | Path) -> Path:
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    seed_everything(cfg.train.seed)
    ensure_built(cfg.data.train, cfg.data.builder)
    samples = load_split(cfg.data, cfg.data.train, out / "skipped.jsonl")
    samples = samples[: cfg.sft.max_records] if cfg.sft.max_records else samples
    policy = Policy.from_pretrained(cfg.model)
    tok = policy.tokenizer
    end_id = tok.convert_tokens_to_ids("<|im_end|>")
    encoded = [policy.encode(s) for s in samples]
    targets = [tok(answer_text(s.answer), add_special_tokens=False)["input_ids"] + [end_id] for s in samples]
    opt = torch.optim.AdamW([p for p in policy.model.parameters() if p.requires_grad], lr=cfg.sft.lr)
    rng = random.Random(cfg.train.seed)
    order: list[int] = []
    with policy.training(), (out / "sft_metrics.jsonl").open("a") as log:
        for step in range(1, cfg.sft.steps + 1):
            if len(order) < cfg.sft.batch_size:
                order += rng.sample(range(len(samples)), len(samples))
            idx, order = order[: cfg.sft.batch_size], order[cfg.sft.batch_size :]
            loss = policy.sequence_nll(
                [encoded[i] for i in idx], [targets[i] for i in idx], label_smoothing=cfg.sft.label_smoothing
            )
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(policy.model.parameters(), 1.0)
            opt.step()
            log.write(json.dumps({"step": step, "loss": loss.item()}) + "\n")
    policy.save(out / "model")
    (out / "sft_config.json").write_text(json.dumps(to_dict(cfg), indent=1))
    write_card(out, cfg, n_records=len(samples), final_loss=loss.item())
    return out / "model"


def write_card(out: Path, cfg: Config, *, n_records: int, final_loss: float) -> None:
    import sys

    import transformers

    def rel(path: str) -> str:
        return os.path.relpath(path) if os.path.isabs(path) else path

    cmd = (
        "mmrl " + " ".join(sys.argv[1:])
        if sys.argv and sys.argv[0].endswith("mmrl")
        else "mmrl.sft.run_sft(...)"
    )
    text = f"""# Supervised warm start: {out.name}

Made by `{cmd}` with mmrl's `run_sft` (torch {torch.__version__}, transformers {transformers.__version__}, CPU).

- base model: `{rel(cfg.model.path)}`
- records: the first {n_records} of `{rel(cfg.data.train)}` (built by `{cfg.data.builder}`, seed {cfg.train.seed})
- objective: mean token cross-entropy (label smoothing {cfg.sft.label_smoothing}) of `answer + <|im_end|>` after the chat prompt (images at {cfg.model.min_pixels}..{cfg.model.max_pixels} px)
- optimiser: AdamW lr {cfg.sft.lr}, {cfg.sft.steps} steps x {cfg.sft.batch_size} records, grad-norm clip 1.0, seed {cfg.train.seed}
- final training loss: {final_loss:.4f} (per-step losses in `sft_metrics.jsonl`; full config in `sft_config.json`)

The weights are in `model/` (HF format: `AutoModelForImageTextToText.from_pretrained("{out}/model")`).
"""
    (out / "README.md").write_text(text)
