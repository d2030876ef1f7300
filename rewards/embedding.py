"""``embedding_similarity``: cosine similarity of the answer's and the reference's embeddings from a local encoder
(MediX-R1's semantic reward, docs/rewards.md#domain-rewards: it accepts paraphrases and terminology variants a string rule misses).

The encoder is a local folder, either
- a sentence-transformers model (``modules.json``): its Transformer module's folder, its ``1_Pooling`` mode (mean,
  cls, max or last token) and max sequence length are read from the folder's own files, so such a model embeds as
  the library would, without the library; or
- a plain transformers encoder (``AutoModel``) with ``pooling`` declared (``auto`` = mean over the attention mask).
``query_prefix`` is prepended to both texts (E5/BGE-style models expect one).

Score: the cosine of the L2-normalised embeddings, the best over the reference's variants (a list reference);
``threshold: 0`` gives ``max(cosine, 0)`` (raw), a positive threshold gives ``1[cosine >= threshold]`` (MediX-R1
uses 0.8). Part ``cosine`` is always logged. The answer is the ``<answer>`` content (``answer_only``). Embeddings
are cached by text, batched by ``batch_size``; placement and ``offload`` are :mod:`mmrl.rewards.local_model`'s.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any, Literal

from mmrl.rewards.base import register_reward
from mmrl.rewards.local_model import LRU, Loaded, check_model_folder, clean_reference, resolve_device
from mmrl.rewards.text import answer_text
from mmrl.types import RewardInput, RewardResult

_POOLING_KEYS = {
    "pooling_mode_cls_token": "cls",
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_max_tokens": "max",
    "pooling_mode_lasttoken": "last",
}


def sentence_transformers_layout(folder: Path) -> tuple[Path, str | None, int | None]:
    """(transformer folder, pooling mode, max length) of a sentence-transformers folder; the folder itself, None,
    None for a plain transformers one."""
    modules_file = folder / "modules.json"
    if not modules_file.is_file():
        return folder, None, None
    modules = json.loads(modules_file.read_text())
    by_type = {m["type"].rsplit(".", 1)[-1]: folder / m.get("path", "") for m in modules}
    body = by_type.get("Transformer", folder)
    pooling = None
    if "Pooling" in by_type:
        cfg = json.loads((by_type["Pooling"] / "config.json").read_text())
        modes = [mode for k, mode in _POOLING_KEYS.items() if cfg.get(k)]
        if len(modes) != 1:
            raise ValueError(
                f"encoder {folder}: pooling config {by_type['Pooling'] / 'config.json'} enables {modes or 'no mode'};"
                " mmrl reads exactly one of cls, mean, max, last"
            )
        pooling = modes[0]
    max_len = None
    bert_cfg = body / "sentence_bert_config.json"
    if bert_cfg.is_file():
        max_len = json.loads(bert_cfg.read_text()).get("max_seq_length")
    return body, pooling, max_len


class Encoder:
    def __init__(self, path: str, device: str, pooling: str, max_length: int, offload: bool):
        from transformers import AutoModel, AutoTokenizer

        body, st_pooling, st_max = sentence_transformers_layout(Path(path).expanduser())
        self.pooling = st_pooling or ("mean" if pooling == "auto" else pooling)
        self.max_length = min(max_length, st_max) if st_max else max_length
        self.device = resolve_device(device)
        self.offload = offload
        self.tokenizer = AutoTokenizer.from_pretrained(body)
        self.model = AutoModel.from_pretrained(body).eval().requires_grad_(False)
        self.model.to("cpu" if offload else self.device)
        self.cache: LRU[Any] = LRU(16384)
        self.lock = threading.Lock()

    def embed(self, texts: list[str], batch_size: int) -> dict[str, Any]:
        """L2-normalised embedding per distinct text (float32 CPU tensors)."""
        import torch

        out = {t: self.cache.get(t) for t in dict.fromkeys(texts)}
        todo = sorted((t for t, v in out.items() if v is None), key=len)
        if not todo:
            return out
        with self.lock, torch.inference_mode():
            if self.offload:
                self.model.to(self.device)
            try:
                for s in range(0, len(todo), batch_size):
                    chunk = todo[s : s + batch_size]
                    for t, v in zip(chunk, self._encode(chunk)):
                        out[t] = v
                        self.cache.put(t, v)
            finally:
                if self.offload:
                    self.model.to("cpu")
        return out

    def _encode(self, texts: list[str]) -> Any:
        import torch

        enc = self.tokenizer(
            texts, padding=True, truncation=True, max_length=self.max_length, return_tensors="pt"
        ).to(self.device)
        hidden = self.model(**enc).last_hidden_state.float()  # [B, T, H]
        mask = enc["attention_mask"].unsqueeze(-1).float()  # [B, T, 1]
        if self.pooling == "cls":
            pooled = hidden[:, 0]
        elif self.pooling == "mean":
            pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1.0)
        elif self.pooling == "max":
            pooled = hidden.masked_fill(mask == 0, float("-inf")).max(1).values
        else:  # last non-padding token (either padding side)
            last = enc["attention_mask"].cumsum(1).argmax(1)
            pooled = hidden[torch.arange(len(texts)), last]
        return torch.nn.functional.normalize(pooled, dim=-1).cpu()


def _check(options: dict[str, Any]) -> None:
    check_model_folder("embedding_similarity", "model", options.get("model", ""))
    threshold = options.get("threshold", 0.0)
    if not -1.0 <= threshold <= 1.0:
        raise ValueError(
            f"reward 'embedding_similarity': threshold {threshold} must lie in [-1, 1] (0 = raw cosine)"
        )


@register_reward("embedding_similarity", check=_check)
def embedding_similarity(
    batch: list[RewardInput],
    *,
    model: str = "",
    pooling: Literal["auto", "mean", "cls", "max", "last"] = "auto",
    threshold: float = 0.0,
    answer_only: bool = True,
    query_prefix: str = "",
    max_length: int = 256,
    batch_size: int = 64,
    device: str = "auto",
    offload: bool = False,
) -> list[RewardResult]:
    """Cosine similarity to the closest reference variant (see the module docstring)."""
    key = ("encoder", str(Path(model).expanduser().resolve()), device, pooling, max_length, offload)
    encoder = Loaded.get(key, lambda: Encoder(model, device, pooling, max_length, offload))
    answers = [query_prefix + (answer_text(x.response) if answer_only else x.response.strip()) for x in batch]
    refs = [[query_prefix + r for r in clean_reference(x.reference)] for x in batch]
    vectors = encoder.embed(answers + [r for rs in refs for r in rs], batch_size)
    results = []
    for a, rs in zip(answers, refs):
        if not rs:
            results.append(RewardResult(score=None))
            continue
        cosine = max(float(vectors[a] @ vectors[r]) for r in rs)
        score = float(cosine >= threshold) if threshold > 0 else max(cosine, 0.0)
        results.append(RewardResult(score=score, parts={"cosine": cosine}))
    return results
