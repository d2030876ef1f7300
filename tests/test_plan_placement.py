"""``mmrl plan`` of a separate placement (``rollout.placement: separate``, docs/async.md#separate-placement): the
training and the generating GPUs planned apart, each against the GPU's memory, the run fitting only when both do;
the advice for a misfit; the shipped ``recipes/geometry/gpu-async.yaml`` on 8 x 80 GB."""

from pathlib import Path

import pytest

from mmrl import cli
from mmrl.config import ConfigError, load_config
from mmrl.plan import memory, preflight, report
from mmrl.plan import planner as plan

ROOT = Path(__file__).resolve().parents[1]
TINY = "assets/tiny-qwen2.5-vl"
GIB = memory.GIB
P = 939_712  # the tiny model's parameters (tests/test_plan.py counts them by hand)
RECIPE = ROOT / "recipes/geometry/gpu-async.yaml"


def _tiny(overrides=()):
    return load_config(ROOT / "recipes/shapes/tiny.yaml", [f"model.path={TINY}", *overrides])


SEPARATE = ["model.dtype=bfloat16", "algo.kl_coef=0.01", "train.fsdp=true", "rollout.placement=separate"]


def test_bucket_bytes_are_the_pushers():
    from mmrl.train.placement import BUCKET_BYTES

    assert plan.BUCKET_BYTES == BUCKET_BYTES


def test_a_separate_plan_shows_both_gpus_by_hand(capsys):
    """Tiny model, 3 launched processes: 2 train (FSDP2 over 2), 1 generates. The training GPU holds the shards,
    gradients, AdamW and the reference and no rollout (no KV cache, no engine); the generating GPU the whole fp32
    policy, the KV cache of rollout.batch_size x n sequences (16 prompts per step x 8 here) and the received bucket,
    and no optimizer state, gradients or reference."""
    p = plan.plan_run(_tiny(SEPARATE), plan.PlanOptions(gpus=3, gpu_memory_gib=80))
    g = p.generating
    hw = p.setup.hw
    assert (hw.launched, hw.world, hw.generating) == (3, 2, 1)
    assert p.setup.fsdp and p.setup.shard == 2 and not g.setup.fsdp and g.setup.hw.world == 1
    assert (p.role, g.role, p.stages, g.stages) == (
        "training GPU",
        "generating GPU",
        plan.TRAIN_STAGES,
        plan.GEN_STAGES,
    )
    r = p.rows
    every = dict.fromkeys(plan.TRAIN_STAGES)
    assert r["policy weights (fp32)"] == dict.fromkeys(every, 4.0 * P / 2)
    assert r["AdamW state (2 x fp32)"] == dict.fromkeys(every, 8.0 * P / 2)
    assert r["gradients (fp32)"] == {"evaluation": 0, "log-probs": 0, "update": 4.0 * P / 2, "weight sync": 0}
    assert r["reference model"] == dict.fromkeys(every, 2.0 * P)
    # rank 0 packs a 64 MiB bucket from the gathered parameters (the tiny model's largest is far smaller)
    assert r["activations"]["weight sync"] == 2 * 64 * 2**20
    assert not any("KV" in k or "engine" in k or "vLLM" in k for k in r)
    # the generating GPU: no optimizer, gradients or reference; the engine's fp32 copy, unsharded
    assert set(g.rows) == {
        "engine weights (fp32 policy)",
        "KV cache (rollout)",
        "activations",
        "weight-receive bucket",
        "CUDA context",
        "allocator slack",
    }
    assert g.rows["engine weights (fp32 policy)"] == {"rollout": 4.0 * P, "weight receive": 4.0 * P}
    seqs, S = 16 * 8, g.setup.seq.total  # min(rollout.batch_size 32, prompts_per_step 16) prompts x n = 8
    kv = 2 * 2 * 2 * 32 * 2 * seqs * S  # (k, v) x 2 layers x 2 KV heads x 32 dims x 2 bytes, per token
    assert g.rows["KV cache (rollout)"] == {"rollout": kv, "weight receive": kv}
    assert g.rows["weight-receive bucket"] == {"rollout": 0, "weight receive": 64 * 2**20}
    for plan_ in (p, g):  # each total: its rows and the allocator's slack over torch's part
        for st in plan_.stages:
            assert plan_.totals[st] == pytest.approx(sum(v[st] for v in plan_.rows.values()))
    assert p.fits and p.worst == max(p.peak, g.peak)
    out = report.format_plan(p, "tiny")
    assert "per training GPU, GiB" in out and "per generating GPU, GiB" in out
    assert "placement: separate: 2 training GPU(s) and 1 generating GPU(s) of the 3 launched" in out
    assert f"peak: training GPU {p.peak / GIB:.2f} GiB in the {p.peak_stage} stage; generating GPU " in out
    assert "verdict: fits: training GPU peak" in out
    # the command line: --gpus N is N - g training and g generating processes
    argv = ["plan", str(ROOT / "recipes/shapes/tiny.yaml"), f"model.path={TINY}", *SEPARATE, "--gpus", "3"]
    assert cli.main(argv) == 0
    assert "2 training GPU(s) and 1 generating GPU(s)" in capsys.readouterr().out


def test_separating_removes_the_generation_from_the_training_gpu():
    """The same training world (2 processes, FSDP2) colocated and separate: every training row of the log-probs,
    update and weight-sync stages but the sync's transient is the same, and the rollout stage's HF generation
    (rollout.batch_size x n sequences, their KV cache, prefill, logits) leaves the training GPU: without held-out
    data its evaluation stage is the rollout stage less the generation (and its allocator slack); with it, the
    evaluation's greedy generation (one response per record) is far smaller than the rollout's."""
    base = [*SEPARATE[:3], "model.max_pixels=12544", "rollout.max_new_tokens=64", "data.eval="]
    col = plan.plan_run(_tiny(base), plan.PlanOptions(gpus=2))
    sep = plan.plan_run(_tiny([*base, "rollout.placement=separate"]), plan.PlanOptions(gpus=3))
    assert col.setup.hw.world == sep.setup.hw.world == 2
    for row in ("policy weights (fp32)", "gradients (fp32)", "AdamW state (2 x fp32)", "reference model"):
        for st in ("log-probs", "update"):
            assert sep.rows[row][st] == col.rows[row][st], (row, st)
    for st in ("log-probs", "update"):
        assert sep.rows["activations"][st] == col.rows["activations"][st]
    generation = plan._hf_generation(col.setup)
    assert col.rows["activations"]["rollout"] == generation > 0
    assert sep.rows["activations"]["evaluation"] == 0  # no held-out data: nothing generates there
    lowered = col.totals["rollout"] - sep.totals["evaluation"]
    assert lowered == pytest.approx((1 + plan.ALLOCATOR_SLACK) * generation)
    assert sep.peak <= col.peak
    # the generating GPU holds that generation, for all the step's prompts at once (16 < rollout.batch_size 32)
    gen = sep.generating
    parts = gen.rows["KV cache (rollout)"]["rollout"] + gen.rows["activations"]["rollout"]
    assert parts > generation  # one process generates what two shared colocated
    # with held-out data the evaluation generates one greedy response per record: up to rollout.batch_size (32) of
    # the rank's 100 of eval.max_samples 200 at once, where the colocated rollout holds 8 prompts x 8
    ev = plan.plan_run(_tiny([*base[:-1], "rollout.placement=separate"]), plan.PlanOptions(gpus=3))
    seqs, seq = plan.eval_sequences(ev.setup)
    assert (seqs, seq.response, plan.rollout_sequences(col.setup)) == (32, 64, 64)
    assert 0 < ev.rows["activations"]["evaluation"] < col.rows["activations"]["rollout"]


def test_a_generating_gpu_that_cannot_fit_is_refused_naming_it(monkeypatch):
    """gpu-async.yaml with one generating process and 64 prompts x 8 generated at once: the generating GPU's KV
    cache and prefill pass 79 GiB while the training GPUs fit (with the recipe's two, each generates its 32). The plan names the generating GPU, the advice halves the generation batch (planned:
    it fits), and pre-flight refuses the run with the same verdict."""
    one = ["rollout.rollout_processes=1"]
    assert plan.plan_run(
        load_config(RECIPE, ["rollout.batch_size=64"])
    ).fits  # two generating: 32 prompts each
    cfg = load_config(RECIPE, [*one, "rollout.batch_size=64"])
    p = plan.plan_run(cfg)
    assert p.peak <= p.capacity and p.generating.peak > p.capacity and not p.fits
    text = report.verdict(p)
    assert text.startswith("does not fit: the generating GPU's peak") and "training GPU" not in text
    assert p.advice == ["rollout.batch_size=32"]
    assert plan.plan_run(load_config(RECIPE, [*one, *p.advice])).fits
    monkeypatch.setattr(preflight, "would_use_cuda", lambda cfg: True)
    monkeypatch.setenv("WORLD_SIZE", "8")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "8")
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)  # the memory from hardware: (79 GiB)
    with pytest.raises(ConfigError, match="the generating GPU's peak .* > 79 GiB per GPU"):
        preflight.preflight(cfg)
    assert preflight.preflight(load_config(RECIPE)).fits


def test_the_advice_never_empties_the_training_group():
    """A 7B full fine-tune on 2 launched processes (1 trains, 1 generates) cannot fit its training GPU. FSDP over
    its one training process is no change and is not offered; more GPUs are offered as more launched processes, the
    extra ones all training (the generating count is the config's), with no multiple of the training processes
    required (their batch is split balanced); the advice found fits when planned."""
    cfg = _tiny(
        ["model.path=Qwen/Qwen2.5-VL-7B-Instruct", "model.dtype=bfloat16", "rollout.placement=separate"]
    )
    opts = plan.PlanOptions(gpus=2)
    p = plan.plan_run(cfg, opts)
    assert p.setup.hw.world == 1 and not p.fits and p.advice
    assert "does not fit: the training GPU's peak" in report.verdict(p)
    gpus = [int(a.split()[1]) for a in p.advice if a.startswith("--gpus")]
    overrides = [a for a in p.advice if not a.startswith("--")]
    again = plan.plan_run(plan._with(cfg, overrides), plan.PlanOptions(gpus=gpus[0] if gpus else 2))
    assert again.fits and again.setup.hw.world >= 1 and again.setup.hw.generating == 1
    groups = plan._change_groups(cfg, p.setup, opts)
    assert not any(changes == ["train.fsdp=true"] and o == opts for g in groups for changes, o in g)
    more = [(o.gpus, o.nodes) for _, o in groups[-1]]
    assert more == [(4, 1), (8, 1), (8, 2), (8, 4)]  # 16 prompts over 7 training processes is allowed
    for gpus, nodes in more:
        q = plan.plan_run(plan._with(cfg, ["train.fsdp=true"]), plan.PlanOptions(gpus=gpus, nodes=nodes))
        assert q.setup.hw.world == gpus * nodes - 1 and q.setup.fsdp
    fsdp4 = plan._with(cfg, ["train.fsdp=true", "model.gradient_checkpointing=true"])
    assert plan.plan_run(fsdp4, plan.PlanOptions(gpus=4)).fits  # what "--gpus 4" with FSDP would give
    with pytest.raises(ConfigError, match="at least one must train and one generate"):
        plan.plan_run(cfg, plan.PlanOptions(gpus=1))


def test_a_separate_vllm_plan_puts_vllm_alone_on_the_generating_gpu():
    """vLLM in a separate placement runs in a process of its own on the generating GPU (its own CUDA context) and
    takes the GPU's share it is given (default 0.85: the GPU is its own); the policy that receives the push stays in
    host memory, so the generating GPU holds vLLM's weights in its dtype, its KV cache and workspace, the received
    bucket and two CUDA contexts. The training GPUs evaluate with the hf engine, as with the hf engine. Any other
    engine is refused, as pre-flight refuses it."""
    cfg = _tiny(
        [*SEPARATE, "rollout.engine=vllm", "rollout.engine_options={kv_cache_memory_bytes: 1073741824}"]
    )
    p = plan.plan_run(cfg, plan.PlanOptions(gpus=3, gpu_memory_gib=80))
    g = p.generating
    every = dict.fromkeys(plan.GEN_STAGES)
    assert g.rows["vLLM weights"] == dict.fromkeys(every, 2.0 * P)  # bf16, the run's dtype
    assert g.rows["vLLM KV cache and workspace"] == dict.fromkeys(every, 2**30 + plan.VLLM_WORKSPACE)
    assert g.rows["vLLM CUDA context"] == g.rows["CUDA context"]
    assert not any(k.startswith("engine weights") or k == "KV cache (rollout)" for k in g.rows)
    assert p.fits and not any("vLLM" in k for k in p.rows)  # nothing of vLLM's on a training GPU
    share = plan.plan_run(
        _tiny([*SEPARATE, "rollout.engine=vllm"]), plan.PlanOptions(gpus=3, gpu_memory_gib=80)
    )
    kv = share.generating.rows["vLLM KV cache and workspace"]["rollout"]
    assert kv + 2.0 * P == pytest.approx(
        plan.VLLM_OWN_GPU_UTILIZATION * 80 * GIB
    )  # the default share, all vLLM's
    small = [*SEPARATE, "rollout.engine=vllm", "rollout.engine_options={kv_cache_memory_bytes: 4096}"]
    starved = plan.plan_run(_tiny(small), plan.PlanOptions(gpus=3, gpu_memory_gib=80), advise=False)
    assert not starved.fits and "vLLM's KV cache holds" in report.verdict(starved)  # vLLM would not start
    latr = plan.plan_run(_tiny([*SEPARATE, "rollout.engine=latr"]), plan.PlanOptions(gpus=3), advise=False)
    assert not latr.fits and "hf or the vllm engine" in report.verdict(latr)


def test_the_async_recipe_fits_8_gpus_of_80_gb(monkeypatch, capsys):
    """recipes/geometry/gpu-async.yaml: Qwen2.5-VL-3B, 6 training GPUs (FSDP2) + 2 generating (hf engine),
    max_staleness 2, interpolated pi_prox, token TIS; both kinds of GPU fit 79 GiB, from its hardware section and
    with --gpus 8; pre-flight's checks of an asynchronous separate run accept it under 8 processes."""
    from mmrl.train.checks import check_async, check_components

    cfg = load_config(RECIPE)
    r, a = cfg.rollout, cfg.algo
    assert (r.placement, r.rollout_processes, r.max_staleness, r.engine) == ("separate", 2, 2, "hf")
    assert (a.old_logprobs, a.rollout_correction, cfg.train.fsdp) == ("interpolate", "tis_token", True)
    assert cfg.model.path == "Qwen/Qwen2.5-VL-3B-Instruct"
    assert (cfg.hardware.gpus_per_node * cfg.hardware.nodes, cfg.hardware.gpu_memory_gib) == (8, 79)
    for opts in (plan.PlanOptions(), plan.PlanOptions(gpus=8)):
        p = plan.plan_run(cfg, opts)
        assert p.fits, report.format_plan(p, str(RECIPE))
        assert (p.setup.hw.world, p.setup.hw.generating) == (6, 2)
        assert p.peak <= 79 * GIB and p.generating.peak <= 79 * GIB
    assert "torchrun --nproc_per_node 8 -m mmrl train recipes/geometry/gpu-async.yaml" in RECIPE.read_text()
    assert cli.main(["plan", str(RECIPE), "--gpus", "8"]) == 0
    out = capsys.readouterr().out
    assert "6 training GPU(s) and 2 generating GPU(s) of the 8 launched" in out
    assert "verdict: fits: training GPU peak" in out
    monkeypatch.setenv("WORLD_SIZE", "8")
    check_async(cfg)
    check_components(cfg)


def test_reward_models_sit_where_rewards_are_scored():
    """An encoder reward (the tiny encoder: 429,824 fp32 parameters) is scored in the generating process, awake
    throughout its stages; the training ranks score the held-out responses with it too, so it loads on a training
    GPU at the first evaluation (kept there without offload, moved to host memory between calls with it), and not at
    all without held-out data."""
    E, encoder = 429_824, str(ROOT / "assets/tiny-encoder")
    opts = plan.PlanOptions(gpus=3)
    for offload in (False, True):
        reward = (
            f"rewards=[{{name: embedding_similarity, options: {{model: {encoder}, offload: {offload}}}}}]"
        )
        p = plan.plan_run(_tiny([*SEPARATE, reward]), opts)
        name = "encoder (embedding_similarity)"
        assert p.generating.rows[name] == {"rollout": 4.0 * E, "weight receive": 4.0 * E}
        rest = 0.0 if offload else 4.0 * E
        assert p.rows[name] == {"evaluation": 4.0 * E, "log-probs": rest, "update": rest, "weight sync": rest}
        assert "on each training GPU too" in report.format_plan(p, "tiny")
        bare = plan.plan_run(_tiny([*SEPARATE, reward, "data.eval="]), opts)
        assert name not in bare.rows and name in bare.generating.rows
