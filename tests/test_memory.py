"""Memory levers: the same gradients with less memory (checkpointing, micro-batches), bf16
autocast close to float32, and the measures themselves checked on values worked out by hand."""
import copy

import pytest
import torch

import grpo_lab.policies.model
from grpo_lab.training.config import preset
from grpo_lab.policies.memory import peak_bytes, saved_bytes, tensor_bytes
from grpo_lab.policies.model import GPT, GPTConfig
from grpo_lab.policies.policy import frozen, load_for
from grpo_lab.algorithm.rollout import completion_logprobs, sample
from grpo_lab.training.step import (StepContext, backward, collect, collect_demos, grpo_objective,
                                    split_batch, supervised_objective)
from grpo_lab.tasks.task_data import load_eval
from grpo_lab.training.trainer import make_grouper, prompt_source, train
from tolerance import assert_close_to, mean_tol, parts_tol


def cfg(tmp_path=None, **kw):
    return preset("quick", out_dir=str(tmp_path or "runs/unused"), threads=1, **kw)


def grads(model) -> torch.Tensor:
    return torch.cat([p.grad.flatten() for p in model.parameters()])        # (numel,)


# ---- the measures, on values worked out by hand

def test_peak_bytes_and_saved_bytes_by_hand():
    def f():
        a = torch.ones(1000)                  # 4000 B alive
        b = a * 2                             # 8000 B: the peak
        del a                                 # 4000 B
        c = b[:10]                            # a view: no new storage
        d = torch.zeros(500)                  # 6000 B
        return c, d                           # b (4000) and d (2000) outlive f
    assert peak_bytes(lambda: f()) == (8000, 0)
    w, x = torch.nn.Parameter(torch.ones(100)), torch.ones(100)
    assert saved_bytes(lambda: (x * w).sum(), [w]) == 400        # x (the param is left out)
    assert saved_bytes(lambda: (x * w * w).sum(), [w]) == 800    # x and x * w
    m = GPT(GPTConfig())                                         # lm_head ties wte: once
    assert tensor_bytes(m.parameters()) == 4 * m.num_params()


# ---- activation checkpointing

def deep_gpt(n_layer=3, seed=0):
    torch.manual_seed(seed)
    return GPT(GPTConfig(n_layer=n_layer))


def train_forward(model, ids):
    logits, _ = model(ids)                                                  # (N, T, V)
    return logits.float().log_softmax(-1)[..., 0].sum()


def test_checkpointing_gives_the_same_gradients_with_less_memory():
    ids = torch.randint(0, 20, (64, 24))                                    # (N, T)
    out = {}
    for k in (0, 1, 2, 3):
        m = deep_gpt()
        m.checkpoint_every = k
        peak, end = peak_bytes(lambda: train_forward(m, ids).backward())
        saved = saved_bytes(lambda: train_forward(m, ids), list(m.parameters()))
        out[k] = (grads(m), peak, saved, end)
    for k in (1, 2, 3):
        torch.testing.assert_close(out[k][0], out[0][0], rtol=1e-6, atol=1e-8)
        assert out[k][3] == out[0][3] == 4 * out[0][0].numel()            # only the grads left
    # 3 blocks: k=1 checkpoints 0,1,2; k=2 blocks 0,2; k=3 block 0: fewer kept, less memory
    peaks, saved = [out[k][1] for k in (1, 2, 3, 0)], [out[k][2] for k in (1, 2, 3, 0)]
    assert peaks == sorted(peaks) and peaks[0] < peaks[1] and peaks[2] < peaks[3], peaks
    assert saved == sorted(saved) and len(set(saved)) == 4, saved
    # each checkpointed block saves its (N, T, C) input instead of its activations: the three
    # steps of `saved` are one block's activations less its input, up to the (1, 1, T, T)
    # bool mask, saved once by whichever block saves it first
    steps = [b - a for a, b in zip(saved, saved[1:])]
    assert max(steps) - min(steps) <= 24 * 24 and min(steps) > 4 * 64 * 24 * 80, steps


def test_sampling_and_no_grad_forwards_never_checkpoint(monkeypatch):
    m = deep_gpt()
    m.checkpoint_every = 1
    m.autocast = True
    want = sample(deep_gpt(), [[1, 2, 3]], 2, 4, generator=torch.Generator().manual_seed(0))

    def refuse(*a, **k):
        raise AssertionError("checkpoint called outside a training forward")
    monkeypatch.setattr(grpo_lab.policies.model, "checkpoint", refuse)
    got = sample(m, [[1, 2, 3]], 2, 4, generator=torch.Generator().manual_seed(0))
    assert torch.equal(got.completion_ids, want.completion_ids)
    assert torch.equal(got.logprobs, want.logprobs)                       # float32, no autocast
    with pytest.raises(AssertionError, match="outside a training forward"):
        train_forward(m, torch.randint(0, 20, (2, 5)))


def test_load_for_sets_the_levers():
    p = load_for(cfg(checkpoint_every=2, autocast=True))
    assert (p.checkpoint_every, p.autocast) == (2, True)
    assert (GPT.checkpoint_every, GPT.autocast) == (0, False)              # defaults untouched


# ---- gradient accumulation

def grpo_batch(c, seed_noise=0):
    policy = load_for(c)
    held_out = {e.prompt for t in c.task_names for e in load_eval(t)}
    ref = frozen(copy.deepcopy(policy))
    batch = collect(policy, c, 0, StepContext(prompt_source(c, held_out), make_grouper(c), ref))
    torch.manual_seed(seed_noise)                 # move off the sampler: ratios != 1, KL > 0
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(0.02 * torch.randn_like(p))
    return policy, batch


@pytest.mark.parametrize("aggregation", ["seq_mean_token_mean", "token_mean", "dr_grpo"])
def test_micro_batches_add_up_to_the_whole_batch(aggregation):
    c = cfg(loss={"aggregation": aggregation}, prompts_per_step=8, group_size=4,
            clip={"eps_low": 0.05, "eps_high": 0.05})
    policy, batch = grpo_batch(c)
    want = {}
    n_tok = int(batch.scored.rollout.completion_mask.sum())
    tol = _grad_tol(policy, batch, c, grpo_objective, n_tok)
    for m in (1, 2, 4, 8):
        parts = split_batch(batch, m)
        assert len(parts) == m and sum(len(p.scored.examples) for p in parts) == 8
        policy.zero_grad(set_to_none=True)
        shares = backward(grpo_objective, policy, parts, c)
        got = (grads(policy), shares)
        if m == 1:
            want = got
            loss, _ = grpo_objective(policy, batch, c)
            assert shares["loss/total"] == pytest.approx(float(loss.detach()))
            assert shares["clip/low_frac"] + shares["clip/high_frac"] > 0   # clipping seen
            continue
        assert_close_to(got[0], want[0], tol, f"{m} micro-batches")
        # each share is a mean over the batch's tokens, summed in another order per split: the
        # loss's terms are ratio * A (|ratio| <= 1 + eps_high) that cancel, the others'
        # terms are positive (the result is their mean magnitude): tests/tolerance.py
        n_tok = int(batch.scored.rollout.completion_mask.sum())
        mag = {"loss/total": (1 + c.clip.eps_high) * float(batch.advantages.abs().mean())}
        for k, v in want[1].items():
            tol = mean_tol(n_tok, mag.get(k, abs(v)), torch.float32)
            assert got[1][k] == pytest.approx(v, rel=0, abs=max(tol, 1e-12)), k


def _grad_tol(policy, batch, c, objective, n_terms):
    """The gradient's rounding tolerance from its one-prompt parts (tests/tolerance.parts_tol):
    each part's gradient as ``backward`` scales it inside the whole batch."""
    part_grads = []
    prompts = len(batch.scored.examples) if hasattr(batch, "scored") else batch.ids.shape[0]
    for part in split_batch(batch, prompts):
        policy.zero_grad(set_to_none=True)
        backward(objective, policy, [part], c)           # split_batch keeps global normalisers
        part_grads.append(grads(policy))
    policy.zero_grad(set_to_none=True)
    return parts_tol(part_grads, n_terms)


def test_micro_batches_supervised_and_process_supervision():
    c = cfg(objective="supervised", prompts_per_step=8)
    policy = load_for(c)
    batch = collect_demos(policy, c, 0, StepContext(prompt_source(c, set()), make_grouper(c)))
    out = []
    tol = _grad_tol(policy, batch, c, supervised_objective, batch.n_tokens)
    for m in (1, 3):
        policy.zero_grad(set_to_none=True)
        shares = backward(supervised_objective, policy, split_batch(batch, m), c)
        out.append((grads(policy), shares["train/loss"]))
    assert_close_to(out[1][0], out[0][0], tol, "supervised, 3 micro-batches")
    assert out[1][1] == pytest.approx(out[0][1], rel=1e-6)
    c = cfg(supervision="process", prompts_per_step=6, group_size=3)
    policy, batch = grpo_batch(c)
    assert batch.advantages.dim() == 2                                     # (N, Tc)
    tol = _grad_tol(policy, batch, c, grpo_objective,
                    int(batch.scored.rollout.completion_mask.sum()))
    res = []
    for m in (1, 4):
        policy.zero_grad(set_to_none=True)
        backward(grpo_objective, policy, split_batch(batch, m), c)
        res.append(grads(policy))
    assert_close_to(res[1], res[0], tol, "process supervision, 4 micro-batches")


def test_training_with_micro_batches_and_checkpointing_matches(tmp_path):
    """Three steps through the one trainer: each step's gradient is the same with either lever."""
    runs = {}
    for name, kw in {"plain": {}, "micro": {"micro_batches": 4},
                     "ckpt": {"checkpoint_every": 1}}.items():
        c = cfg(tmp_path / name, steps=3, eval_size=0, ckpt_every=3, **kw)
        seen = []
        hist = train(c, progress=False, on_step=lambda m, p: seen.append(grads(p)))
        runs[name] = (torch.stack(seen), hist[1:])                          # (steps, numel)
    plain = runs["plain"][1]
    for name in ("micro", "ckpt"):
        # each step's gradient sums B*G*T per-token terms; without the per-part gradients here,
        # the bound uses the largest gradient entry of the step as the terms' scale
        from grpo_lab.training.step import max_new_tokens
        n_terms = c.prompts_per_step * c.group_size * max_new_tokens(c)
        scale = runs["plain"][0].abs().amax(1, keepdim=True)                # (steps, 1)
        excess = (runs[name][0] - runs["plain"][0]).abs() - \
            (1e-4 * runs["plain"][0].abs() + n_terms * torch.finfo(torch.float32).eps * scale)
        assert float(excess.max()) <= 0, (name, float(excess.max()))
        for h, ref in zip(runs[name][1], plain):
            # the loss is a mean of B*G*T terms ratio * A (ratio ~ 1) that cancel to ~1e-6: its
            # tolerance follows those terms (tests/tolerance.py), not the tiny result
            n_terms = round(c.prompts_per_step * c.group_size * ref["completion/mean_len"])
            tol = mean_tol(n_terms, ref["adv/abs_mean"])
            assert h["loss/total"] == pytest.approx(ref["loss/total"], rel=1e-4, abs=tol)


# ---- bf16 autocast

def test_autocast_loss_is_finite_and_close_to_float32():
    c = cfg(prompts_per_step=8, group_size=4)
    policy, batch = grpo_batch(c)
    r = batch.scored.rollout
    out = {}
    for ac in (False, True):
        policy.autocast = ac
        policy.zero_grad(set_to_none=True)
        loss, _ = grpo_objective(policy, batch, c)
        loss.backward()
        logp = completion_logprobs(policy, r, c.temperature).detach()[r.completion_mask]
        out[ac] = (float(loss.detach()), grads(policy), logp)
    assert torch.isfinite(torch.tensor(out[True][0])) and out[True][1].isfinite().all()
    # bf16 rounds the logits, and how depends on the CPU (AMX / AVX-512 BF16 or emulated: a
    # fixed abs=2e-3 failed on an AMD EPYC); the loss then moves only through its log-probs:
    # each term ratio * A by about |A| * (1 + eps_high) * |d logp| (tests/tolerance.py's rule:
    # the bound follows the summed terms), and d logp itself stays at a few bf16 ulps
    d = (out[True][2] - out[False][2]).abs()                                # (real tokens,)
    a = batch.advantages.abs().repeat_interleave(r.completion_mask.sum(1))  # (real tokens,)
    assert float(d.mean()) < 0.05, float(d.mean())
    tol = 2 * ((1 + c.clip.eps_high) * float((a * d).mean()) + c.kl.beta * float(d.mean()))
    assert out[True][0] == pytest.approx(out[False][0], abs=tol)
    cos = torch.nn.functional.cosine_similarity(out[True][1], out[False][1], dim=0)
    assert 0.98 < cos < 1.0, cos                                  # close, and not float32


# ---- bad values

@pytest.mark.parametrize("kw, match", [
    ({"checkpoint_every": -1}, "checkpoint_every must be >= 0, got -1"),
    ({"micro_batches": 0}, "micro_batches must be > 0, got 0"),
    ({"micro_batches": 9}, "micro_batches=9 is more than the prompts_per_step=8"),
    ({"micro_batches": 2, "objective": "ppo"}, "micro_batches=2 does not work with objective"),
    ({"micro_batches": 2, "exchange": {"name": "ddp_fp16_hook"}}, "exchange.name='ddp_fp16_hook'"),
    ({"micro_batches": 2, "exchange": {"overlap": True}}, "exchange.overlap=True"),
    ({"policy": "hf", "base_checkpoint": "data/hf_tiny", "checkpoint_every": 2,
      "hf": {"gradient_checkpointing": True}}, "set one of them"),
    ({"policy": "hf", "base_checkpoint": "data/hf_tiny", "autocast": True}, "set hf.autocast=True"),
])
def test_bad_memory_settings_name_the_value(kw, match):
    with pytest.raises(ValueError, match=match):
        cfg(**kw)


# ---- the tiny transformers model: the same rule through transformers

def test_hf_checkpoint_every_k_layers_same_gradients_less_memory():
    pytest.importorskip("transformers")
    from grpo_lab.algorithm.rollout import completion_logprobs
    from grpo_lab.policies.engine import completion_logits
    c = preset("hf_tiny_cpu", threads=1)
    base = load_for(c)
    r = sample(base, [base.encode("12+34=")] * 4, 2, 4, generator=torch.Generator().manual_seed(0))
    out = {}
    for k in (0, 1, 2):
        p = load_for(preset("hf_tiny_cpu", checkpoint_every=k))
        layers = [m for m in p.modules() if type(m).__name__ == "LlamaDecoderLayer"]
        assert [bool(getattr(m, "gradient_checkpointing", False)) for m in layers] == \
            [k > 0 and i % k == 0 for i in range(3)]
        fwd = lambda: completion_logprobs(p, r, forward=completion_logits)     # noqa: E731 one path
        saved = saved_bytes(fwd, list(p.parameters()))
        peak, _ = peak_bytes(lambda: fwd().sum().backward())
        out[k] = (grads(p), saved, peak)
    for k in (1, 2):
        torch.testing.assert_close(out[k][0], out[0][0], rtol=1e-5, atol=1e-7)
    assert out[1][1] < out[2][1] < out[0][1], {k: v[1:] for k, v in out.items()}
    assert out[1][2] < out[0][2] and out[2][2] < out[0][2], {k: v[1:] for k, v in out.items()}
    assert load_for(preset("hf_tiny_cpu", hf={"gradient_checkpointing": True})).cfg.gradient_checkpointing == 1
