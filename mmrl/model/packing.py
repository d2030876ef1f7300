"""Padding-free scoring (:attr:`mmrl.model.policy.Policy.packs`): a micro-batch as one packed row, and each prompt's media
encoded once for all its rows. The policy calls these; they read its model, processor and settings."""

from __future__ import annotations

import itertools
import weakref
from typing import TYPE_CHECKING, Any, Protocol

import torch

from mmrl.model import attention, encoders, linear_attention
from mmrl.model.attention import PACKED
from mmrl.model.prompt import padded, seq_keys

if TYPE_CHECKING:
    from contextlib import AbstractContextManager

    from mmrl.model.prompt import EncodedPrompt


_WARNED: weakref.WeakSet = weakref.WeakSet()  # the policies told that their vision is encoded per row


class Policy(Protocol):
    """What packing reads of its host, :class:`mmrl.model.policy.Policy` (declared here so that packing, which the
    policy calls, never imports it)."""

    model: Any
    processor: Any
    device: torch.device
    pad_id: int

    def autocast(self) -> AbstractContextManager: ...
    def matched_tower_calls(self, mm: dict[str, Any]) -> AbstractContextManager: ...
    def is_suppressed(self, tokens: torch.Tensor) -> torch.Tensor: ...
    def sampled_suppressed(
        self, tokens: torch.Tensor, sampled: list[list[int]] | None, row: int
    ) -> torch.Tensor: ...
    def last_hidden(self, **inputs: Any) -> torch.Tensor: ...


def packed_hidden(
    pol: Policy,
    prompts: list[EncodedPrompt],
    completions: list[list[int]],
    *,
    sampled: list[list[int]] | None = None,
    completion_seq: list[dict[str, torch.Tensor]] | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """:meth:`mmrl.model.policy.Policy.completion_hidden` of the sequences packed end to end into one row: no padding
    token is computed.

    Each sequence keeps the positions it has alone (and so in generation): text positions restart at 0 per
    sequence, and a multimodal-RoPE model's 3-D positions are its own ``get_rope_index`` of that sequence with
    its own grids (prepended by the text positions, the ``[4, 1, L]`` layout transformers reads packed masks
    from). The cumulative lengths go alongside: ``mmrl_sdpa`` and flash-attention's varlen kernels attend each
    sequence alone with them (:mod:`mmrl.model.attention`), and no ``[N, N]`` mask is built while :data:`PACKED` is set. The media tensors are concatenated in row order as
    in a padded batch, and the hidden states are gathered back into the ``[B, T, H]`` layout of the padded path
    (the head runs only where the mask is 1). ``sampled``, ``completion_seq``: as
    :meth:`mmrl.model.policy.Policy.collate` (a multi-turn response: the environment's tokens and their images)."""
    dev = pol.device
    tails = completion_seq or [{}] * len(prompts)
    keys = seq_keys(prompts, tails)
    rows, text_pos, mrope, starts = [], [], [], []
    seq: dict[str, list[torch.Tensor]] = {k: [] for k in keys}
    n = 0
    for i, (p, c) in enumerate(zip(prompts, completions)):
        ct = torch.as_tensor(c, dtype=torch.long)
        row = torch.cat([p.input_ids, ct.masked_fill(pol.sampled_suppressed(ct, sampled, i), pol.pad_id)])
        P, L = len(p.input_ids), len(row)
        rows.append(row)
        starts.append(n + P - 1)  # position n + P - 1 + t predicts completion token t
        n += L
        text_pos.append(torch.arange(L))
        for k, dtype in keys.items():
            own = p.seq.get(k, torch.zeros(P, dtype=dtype))
            tail = tails[i].get(k, torch.zeros(len(c), dtype=dtype))
            seq[k].append(torch.cat([own.to(dtype), tail.to(dtype)]))
        mrope.append(encoders.rope_positions(pol.model, row, p.mm, {k: v[-1] for k, v in seq.items()}))
    positions = torch.cat(text_pos)[None]  # [1, N]
    if mrope[0] is not None:  # [1 + k, 1, N]: text positions first, then the model's k rope axes
        positions = torch.cat([positions[None], torch.cat(mrope, dim=-1)[:, None]], dim=0)
    lengths = torch.tensor([len(r) for r in rows])
    cu = torch.cat([lengths.new_zeros(1), lengths.cumsum(0)]).to(dev, torch.int32)
    mm = {k: torch.cat(v)[None].to(dev) for k, v in seq.items()}
    mm |= _media_batch(pol, prompts, {k for p in prompts for k in p.mm})
    blocks = _media_blocks(pol, seq, dev)
    linear_attention.install(pol.model)  # linear-attention layers restart at each sequence too
    token = PACKED.set(True)
    try:
        with pol.autocast(), pol.matched_tower_calls(mm):
            shared = encode_media_once(pol, prompts, mm)
            last = _packed_forward(pol, rows, positions, cu, lengths, mm | shared | blocks, dev)
    finally:
        PACKED.reset(token)
    T = max((len(c) for c in completions), default=0)
    index = torch.zeros((len(rows), T), dtype=torch.long)
    target = torch.full((len(rows), T), pol.pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), T))
    for i, (start, c) in enumerate(zip(starts, completions)):
        index[i, : len(c)] = torch.arange(start, start + len(c))
        target[i, : len(c)] = torch.as_tensor(c, dtype=torch.long)
        mask[i, : len(c)] = 1.0
    hidden = last[index.to(dev)]  # [B, T, H]; positions past a completion's end hold the first token's state
    return hidden, target.to(dev), mask.to(dev)


def encode_media_once(
    pol: Policy, prompts: list[EncodedPrompt], mm: dict[str, torch.Tensor], model: Any = None
) -> dict[str, Any]:
    """Vision once per prompt: the G rows of a group share one :class:`EncodedPrompt`, and the vision tower encodes
    the micro-batch's distinct prompts' images (and videos) in one call per modality, batched as a processor batches
    them (:func:`_media_batch`); the output is split back per prompt (:func:`mmrl.model.encoders.split_encoder_outputs`)
    and each row gets its prompt's features, handed to the model as ``mm_encoder_outputs`` (its pixel inputs are
    taken out of ``mm``). With a trainable tower the gradients of all rows flow into the one encoding. Returns
    ``{"mm_encoder_outputs": ...}``, or nothing where the model takes no precomputed features
    (:func:`mmrl.model.encoders.encoder_calls`; transformers before 5.18, warned once: :func:`_warn_unshared`) or no
    prompt repeats (the model's own forward then encodes the micro-batch,
    in one call too). One tower call per micro-batch and modality whatever the prompts, as in the padded path, so it
    holds under FSDP, where every sharded block's forward and backward is a collective that all ranks must run
    alike (the update gives every rank the same number of micro-batches: :class:`mmrl.train.update.PolicyUpdate`).
    ``model``: another copy of the policy's model to run (an engine's own weights); the policy's by default."""
    model = pol.model if model is None else model
    calls = encoders.encoder_calls(model)
    if len({id(p) for p in prompts}) == len(prompts):
        return {}
    if not calls:
        if any(p.mm for p in prompts):
            _warn_unshared(pol)
        return {}
    out: dict[str, Any] = {}
    for modality, (pixels, fn, takes) in calls.items():
        rows = [p for p in prompts if pixels in p.mm]
        if not rows:
            continue
        distinct = list({id(p): p for p in rows}.values())
        inputs = _media_batch(pol, distinct, {k for p in distinct for k in p.mm if k in takes})
        encoded = fn(inputs.pop(pixels), return_dict=True, **inputs)
        name = f"{model.config.model_type} {modality}"
        parts = dict(zip(map(id, distinct), _split(encoded, distinct, pixels, takes, name)))
        out[modality] = encoders.concat_encoder_outputs([parts[id(p)] for p in rows])
        mm.pop(pixels)
    return {"mm_encoder_outputs": out} if out else {}


def _warn_unshared(pol: Policy) -> None:
    """Once per policy: the model's forward takes no precomputed vision features, so every row's media are encoded
    (transformers added ``mm_encoder_outputs`` in 5.18; 5.16 and 5.17 train correctly, with G x the vision work)."""
    if pol in _WARNED:
        return
    _WARNED.add(pol)
    import logging

    import transformers

    logging.getLogger("mmrl.model.policy").warning(
        "vision once per prompt is off: %s's forward under transformers %s takes no precomputed vision features "
        "(mm_encoder_outputs), so the media of each of a group's rows are encoded again (G x the vision tower's "
        "work; results are the same). Fix: transformers >= 5.18.",
        pol.model.config.model_type,
        transformers.__version__,
    )


def _split(encoded: Any, prompts: list[EncodedPrompt], pixels: str, takes: set[str], name: str) -> list[Any]:
    """The one encoding of ``prompts``' media cut back per prompt, by their items (:func:`encoders.encoder_items`),
    or where the output holds tiles instead (Idefics3 under transformers before 5.23) by their real tiles."""
    counts = [encoders.encoder_items(p.mm, pixels, takes) for p in prompts]
    try:
        return encoders.split_encoder_outputs(encoded, counts, name)
    except ValueError:
        tiles = [encoders.encoder_tiles(p.mm, pixels) for p in prompts]
        if None in tiles:
            raise
        return encoders.split_encoder_outputs(encoded, tiles, name)


def _media_batch(pol: Policy, prompts: list[EncodedPrompt], keys: set[str]) -> dict[str, torch.Tensor]:
    """The prompts' media tensors named in ``keys`` as one batch's, on the model's device: concatenated along dim 0
    in order and padded past it to a common shape as a processor pads a batch (:func:`mmrl.model.prompt.padded`: with
    -1 for patch positions), floating-point ones in the model's dtype."""
    out = {}
    for key in sorted(keys):
        fill = -1 if key.endswith("position_ids") else 0
        t = torch.cat(padded([p.mm[key] for p in prompts if key in p.mm], fill), dim=0).to(pol.device)
        out[key] = t.to(pol.model.dtype) if t.is_floating_point() else t
    return out


def _media_blocks(pol: Policy, seq: dict[str, list[torch.Tensor]], dev: torch.device) -> dict[str, Any]:
    """The packed row's two-way media blocks (:func:`mmrl.model.encoders.media_blocks`), for ``mmrl_sdpa``: each run of
    media tokens gets its own id (-1 elsewhere), numbered along the whole row so that no block spans two
    sequences, handed to the attention as ``mmrl_media_blocks = (ids [N] on dev, layer types, whether each sequence
    holds a media token)``. Computed on the host from each sequence's per-token inputs (``seq``: host tensors, in row
    order), so that no layer reads the ids back from the device. The keyword travels with the layers' other keywords
    (the cumulative lengths), so a layer recomputed by gradient checkpointing in the backward gets it again. Empty
    where the model has none or the row holds no media token."""
    spec = encoders.media_blocks(pol.model, pol.processor)
    if spec is None or spec[0] not in seq:
        return {}
    key, values, layers = spec
    types = torch.cat(seq[key])
    media = torch.zeros_like(types, dtype=torch.bool)
    for v in values:
        media |= types == v
    with_media = tuple(bool(m.any()) for m in media.split([len(t) for t in seq[key]]))
    if not any(with_media):
        return {}
    start = media & ~torch.nn.functional.pad(media, (1, 0))[:-1]
    ids = torch.where(media, start.long().cumsum(0) - 1, -1)
    return {"mmrl_media_blocks": (ids.to(dev), layers, with_media)}


def _packed_forward(pol: Policy, rows, positions, cu, lengths, mm, dev) -> torch.Tensor:
    """The model's forward over the packed row, with the boundaries as transformers' varlen keywords (``cu_seq_lens_q``
    and ``_k`` on the device, as flash-attention's kernels take them; ``max_length_q`` and ``_k`` host ints, which
    the linear-attention layers read too) and once more as host ints for ``mmrl_sdpa`` (:data:`attention.BOUNDS`),
    computed here from the host ``lengths`` so that no layer reads them back from the device. Keywords travel with
    each layer's call: a layer recomputed by gradient checkpointing in the backward gets the same ones."""
    sizes = lengths.tolist()  # a host tensor: no sync
    return pol.last_hidden(
        input_ids=torch.cat(rows)[None].to(dev),
        position_ids=positions.to(dev),
        use_cache=False,
        cu_seq_lens_q=cu,
        cu_seq_lens_k=cu,
        max_length_q=max(sizes),
        max_length_k=max(sizes),
        **{attention.BOUNDS: (0, *itertools.accumulate(sizes))},
        **mm,
    )[0]  # [N, H]
