"""The speed levers of issue 22 leave the computation equal where they should: the update's
forwards (logits on the completion only, the prompt once per group) give the same loss and
gradients; the inverse-CDF sampler samples the same distribution as the exponential race and
the same tokens whichever prompts share its batch (1 vs N processes) or leave it when done;
LoRA with its adapters off is the base model; the bf16 sampling copy stays close to fp32."""
import pytest
import torch
import torch.nn.functional as F
from scipy.stats import chisquare

from grpo_lab.policies.model import GPT, GPTConfig
from grpo_lab.algorithm.rollout import DRAWS, completion_logprobs, sample
from grpo_lab.policies.engine import UPDATE_FORWARDS, chosen_logprobs
from grpo_lab.training.step import prompt_generators
from grpo_lab.tasks import EOS, encode
from tolerance import mean_tol

transformers = pytest.importorskip("transformers")

from grpo_lab.policies.hf import load_hf_policy                                 # noqa: E402
from grpo_lab.tasks.task_data import load_eval  # noqa: E402

TINY = "data/hf_tiny"


@pytest.fixture(scope="module")
def tiny():
    torch.set_num_threads(1)
    return load_hf_policy(TINY)


def toy():
    torch.manual_seed(0)
    m = GPT(GPTConfig(n_layer=2, n_embd=32, n_head=4, block_size=24))
    with torch.no_grad():            # <eos> ~2.5 nats likelier: some rows stop early
        _, _, h = m(torch.tensor([encode("12+34=")]), return_hidden=True)   # (1, T, C)
        hm = h.mean((0, 1))                                                # (C,)
        m.wte.weight[EOS] += 2.5 * hm / hm.norm() ** 2
    return m


def hf_prompts(policy, n=5):
    exs = load_eval("addition")[:n - 1]
    return [policy.encode("9+1=")] + [policy.encode(e.prompt) for e in exs]   # lengths differ


def loss_and_grads(model, r, forward, adv):
    """sum over real tokens of logp * advantage -> (loss, flat gradient, sum of |terms|)."""
    model.zero_grad()
    logp = completion_logprobs(model, r, 0.8, forward=UPDATE_FORWARDS[forward])  # (N, Tc)
    terms = logp * adv[:, None] * r.completion_mask                        # (N, Tc)
    loss = terms.sum()
    loss.backward()
    g = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
    return loss.detach(), g, float(terms.detach().abs().sum())


@pytest.mark.parametrize("which", ["toy", "hf"])
def test_update_forwards_give_the_same_loss_and_gradients(which, tiny):
    model = toy() if which == "toy" else tiny
    ps = ([encode("12+34="), encode("sort:3142="), encode("7+5=")] if which == "toy"
          else hf_prompts(tiny))
    r = sample(model, ps, 3, 6, 0.8, generator=prompt_generators(0, 0, 0, range(len(ps))))
    assert r.completion_mask.sum(1).min() < r.completion_ids.shape[1]     # padding inside
    adv = torch.linspace(-1, 1, len(r.prompt_index))
    model.train()
    ref_loss, ref_g, mag = loss_and_grads(model, r, "all_positions", adv)
    n = int(r.completion_mask.sum())
    for fw in UPDATE_FORWARDS:
        loss, g, _ = loss_and_grads(model, r, fw, adv)
        # float32 sums of ~n terms, each a log-softmax over V logits: rounding ~ n * eps * |terms|
        assert abs(float(loss - ref_loss)) <= 10 * mean_tol(n, mag / n) * n, fw
        scale = float(ref_g.abs().max())
        torch.testing.assert_close(g, ref_g, rtol=0, atol=1e-4 * scale, msg=fw)
    model.zero_grad()


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_chosen_logprobs_equal_log_softmax_gather_and_entropy(temperature):
    """The fewer-passes path (one log_softmax, the probabilities recomputed for a one-pass
    backward, the entropy as a dot product) against autograd's log_softmax -> gather, -(p * log p).sum."""
    torch.manual_seed(0)
    N, Tc, V = 4, 6, 2000
    x = (torch.randn(N, Tc, V) * 3).requires_grad_()                     # (N, Tc, V) logits
    ids = torch.randint(0, V, (N, Tc))                                     # (N, Tc)
    w = torch.randn(N, Tc)                                                 # (N, Tc) d loss / d logp
    logp = F.log_softmax(x / temperature, -1)                              # (N, Tc, V)
    want_tok = logp.gather(-1, ids[..., None]).squeeze(-1)                 # (N, Tc)
    want_ent = -(logp.exp() * logp).sum(-1)                                # (N, Tc)
    (want_tok * w).sum().backward()
    want_g, x.grad = x.grad.clone(), None
    tok, ent = chosen_logprobs(x, ids, temperature)
    (tok * w).sum().backward()
    assert torch.equal(tok, want_tok)                                      # the same log_softmax
    assert not ent.requires_grad
    terms = (logp.exp() * logp).detach().abs()                             # (N, Tc, V)
    for e, we, t in zip(ent.flatten(), want_ent.flatten(), terms.reshape(-1, V)):
        assert abs(float(e - we)) <= mean_tol(V, float(t.sum()))           # a sum of V terms
    # each element is (onehot - p) * w / T from two roundings of terms of size |p w / T| and,
    # at the chosen token, |w / T|: 4 eps of those
    size = want_g.abs() + torch.zeros_like(x).scatter_(-1, ids[..., None],
                                                        (w / temperature).abs()[..., None])
    assert ((x.grad - want_g).abs() <= 4 * torch.finfo(torch.float32).eps * size).all()
    assert chosen_logprobs(x, ids, temperature, with_entropy=False)[1] is None
    with torch.no_grad():                                                  # no graph: no probs kept
        nt, ne = chosen_logprobs(x, ids, temperature)
    assert torch.equal(nt, want_tok) and torch.equal(ne, ent)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_chosen_logprobs_in_slices_equal_the_whole_batch_at_once(dtype, monkeypatch):
    """engine.CHUNK_ELEMENTS slices the rows (the passes run row by row): log-probs, entropies
    and gradients in slices of 3 rows (the last one short) equal those of one slice, bit for
    bit, and the gradient comes back in the logits' dtype."""
    from grpo_lab.policies import engine
    torch.manual_seed(1)
    N, Tc, V = 4, 5, 300
    x0 = (torch.randn(N, Tc, V) * 3).to(dtype)
    ids, w = torch.randint(0, V, (N, Tc)), torch.randn(N, Tc)
    got = {}
    for rows in (N * Tc, 3):
        monkeypatch.setattr(engine, "CHUNK_ELEMENTS", rows * V)
        x = x0.clone().requires_grad_()
        tok, ent = chosen_logprobs(x, ids, 0.7)
        (tok * w).sum().backward()
        got[rows] = tok, ent, x.grad
    assert got[3][2].dtype == dtype
    for a, b in zip(got[N * Tc], got[3]):
        assert torch.equal(a, b)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_chosen_logprobs_on_shared_rows_equal_the_copied_rows(dtype, monkeypatch):
    """``rows`` (the packed forward's layout: a row read by several positions, the slices in
    any order): log-probs and entropies equal those of the copied rows x[rows] bit for bit;
    the gradient equals autograd's through the copy (which sums the copies' gradients) up to
    the rounding of those sums; rows past the logits are refused by name."""
    from grpo_lab.policies import engine
    monkeypatch.setattr(engine, "CHUNK_ELEMENTS", 2 * 50)                  # slices of 2 rows
    torch.manual_seed(2)
    R, V = 7, 50
    x0 = (torch.randn(R, V) * 3).to(dtype)
    rows = torch.tensor([[0, 3, 4], [0, 5, 6], [1, 2, 2], [6, 0, 1]])      # (N, Tc)
    ids, w = torch.randint(0, V, rows.shape), torch.randn(rows.shape)
    x = x0.clone().requires_grad_()
    tok, ent = chosen_logprobs(x, ids, 0.7, rows=rows)
    (tok * w).sum().backward()
    y = x0.clone().requires_grad_()
    want_tok, want_ent = chosen_logprobs(y[rows], ids, 0.7)
    (want_tok * w).sum().backward()
    assert torch.equal(tok, want_tok) and torch.equal(ent, want_ent)
    assert x.grad.dtype == dtype
    # element (r, v) sums |w / T| (p_rv + [v chosen]) over the positions reading row r
    p = torch.softmax(x0.float() / 0.7, -1)                                # (R, V)
    onehot = torch.zeros(*rows.shape, V).scatter_(-1, ids[..., None], 1.0)
    terms = (w.abs() / 0.7)[..., None] * (p[rows] + onehot)               # (N, Tc, V)
    size = torch.zeros(R, V).index_add_(0, rows.flatten(), terms.reshape(-1, V))
    assert ((x.grad.float() - y.grad.float()).abs()
            <= 4 * torch.finfo(dtype).eps * size).all()
    with pytest.raises(ValueError, match="row 7 of 7"):
        chosen_logprobs(x0, ids, rows=rows.clamp_min(7))


def test_chosen_logprobs_give_the_update_autograds_gradients(tiny):
    """Through the HF model: the parameters' gradients of sum(logp * A) by the fewer-passes
    path equal autograd's (completion_logprobs with entropy_grad takes autograd's path)."""
    ps = hf_prompts(tiny)
    r = sample(tiny, ps, 3, 6, 0.8, generator=prompt_generators(0, 0, 0, range(len(ps))))
    adv = torch.linspace(-1, 1, len(r.prompt_index))                      # (N,)
    tiny.train()
    out = []
    for autograd_path in (True, False):
        tiny.zero_grad()
        logp, ent = completion_logprobs(tiny, r, 0.8, True, UPDATE_FORWARDS["prompt_once"],
                                        autograd_path)
        (logp * adv[:, None] * r.completion_mask).sum().backward()
        g = torch.cat([p.grad.flatten() for p in tiny.parameters() if p.grad is not None])
        out.append((logp.detach(), ent.detach(), g))
    (lp_a, ent_a, g_a), (lp_b, ent_b, g_b) = out
    tiny.zero_grad()
    assert torch.equal(lp_a, lp_b)
    V = tiny.cfg.vocab_size                              # each entropy sums V terms p |log p|
    torch.testing.assert_close(ent_b, ent_a, rtol=0, atol=mean_tol(V, float(ent_a.max())))
    torch.testing.assert_close(g_b, g_a, rtol=0, atol=1e-5 * float(g_a.abs().max()))


def test_packed_forward_runs_under_activation_checkpointing():
    """The packed forward needs no KV cache: with checkpointing on (where prompt_once falls
    back to a forward per row) it still packs, and gives the plain forward's loss and grads."""
    model = toy()
    ps = [encode("12+34="), encode("sort:3142="), encode("7+5=")]
    r = sample(model, ps, 3, 6, 0.8, generator=prompt_generators(0, 0, 0, range(len(ps))))
    adv = torch.linspace(-1, 1, len(r.prompt_index))
    model.train()
    ref_loss, ref_g, mag = loss_and_grads(model, r, "all_positions", adv)
    model.checkpoint_every = 1
    rows = []
    h = model.lm_head.register_forward_hook(lambda m, i, o: rows.append(o.shape[:2]))
    try:
        loss, g, _ = loss_and_grads(model, r, "packed", adv)
    finally:
        h.remove()
        model.checkpoint_every = 0
    Tc = r.completion_ids.shape[1]
    assert rows == [(len(ps), 1 + 3 * (Tc - 1))]                          # one packed forward
    n = int(r.completion_mask.sum())
    assert abs(float(loss - ref_loss)) <= 10 * mean_tol(n, mag / n) * n
    torch.testing.assert_close(g, ref_g, rtol=0, atol=1e-4 * float(ref_g.abs().max()))
    model.zero_grad()


def test_prompt_once_keeps_the_head_off_prompt_positions(tiny):
    ps = hf_prompts(tiny)
    r = sample(tiny, ps, 2, 4, generator=prompt_generators(0, 0, 0, range(len(ps))))
    rows = []
    h = tiny.model.lm_head.register_forward_hook(lambda m, i, o: rows.append(o.shape[:2]))
    try:
        with torch.no_grad():
            for fw in UPDATE_FORWARDS:
                completion_logprobs(tiny, r, forward=UPDATE_FORWARDS[fw])
    finally:
        h.remove()
    N, Tp, Tc = r.completion_ids.shape[0], r.prompt_ids.shape[1], r.completion_ids.shape[1]
    B = len(ps)
    assert rows[0] == (N, Tp + Tc)                                         # all positions
    assert rows[1] == (N, Tc + 1)                                          # logits_to_keep
    assert rows[2:4] == [(B, 1), (N, Tc - 1)]                              # prompt once
    assert rows[4:] == [(B, 1 + 2 * (Tc - 1))]                             # packed, G = 2


@pytest.mark.parametrize("which", ["toy", "hf"])
@pytest.mark.parametrize("draw", sorted(DRAWS))
def test_tokens_do_not_depend_on_batch_split_or_dropped_rows(which, draw, tiny):
    """One batch of 4 prompts vs two batches of 2 (what 2 processes sample), each with and
    without dropping finished rows: the same tokens, prompt by prompt."""
    model = toy() if which == "toy" else tiny
    ps = ([encode("12+34="), encode("sort:3142="), encode("7+5="), encode("3+4=")]
          if which == "toy" else hf_prompts(tiny, 4))
    gens = lambda idx: prompt_generators(7, 1, 0, idx)                     # noqa: E731
    kw = dict(G=3, max_new_tokens=6, temperature=1.0, draw=DRAWS[draw])
    whole = sample(model, ps, generator=gens(range(4)), **kw)
    lengths = whole.completion_mask.sum(1)                                 # (N,)
    assert whole.stopped.any() and len(set(lengths.tolist())) > 1          # rows stop apart
    for drop in (False, True):
        halves = [sample(model, ps[a:a + 2], generator=gens(range(a, a + 2)),
                         drop_finished=drop, **kw) for a in (0, 2)]
        ids = [h.completion_ids for h in halves]
        Tc = max(x.shape[1] for x in ids)
        ids = torch.cat([torch.nn.functional.pad(x, (0, Tc - x.shape[1]), value=model.pad_id)
                         for x in ids])
        assert torch.equal(ids[:, :whole.completion_ids.shape[1]], whole.completion_ids)
        again = sample(model, ps, generator=gens(range(4)), drop_finished=drop, **kw)
        assert torch.equal(again.completion_ids, whole.completion_ids)
        torch.testing.assert_close(again.logprobs, whole.logprobs, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("top_k", [None, 3])
def test_inverse_cdf_samples_the_softmax_like_the_race(top_k):
    """V = 6 tokens, 40,000 draws each way, seeded: Pearson's chi-square against the exact
    (top-k renormalised) probabilities; p > 0.001 for both samplers (a wrong sampler, e.g.
    one that ignores the temperature-scaled log-probs' smallest entries, gives p ~ 0)."""
    logits = torch.tensor([[2.0, 1.0, 0.5, 0.0, -1.0, -3.0]])
    logp = torch.log_softmax(logits, -1)
    p = logp.exp()[0].double()
    if top_k:
        p = torch.where(p >= p.topk(top_k).values[-1], p, 0.0)
        p = p / p.sum()
    n, G = 40_000, 8
    rows = torch.arange(G)
    for name, draw in DRAWS.items():
        g = torch.Generator().manual_seed(0)
        toks = torch.cat([draw(logp.expand(G, -1), top_k, G, [g], rows, G)
                          for _ in range(n // G)])                         # (n,)
        counts = torch.bincount(toks, minlength=6).double()
        assert (counts[p == 0] == 0).all(), name
        keep = p > 0
        expected = n * p[keep] / p[keep].sum()                             # sums to n exactly
        stat = chisquare(counts[keep].numpy(), expected.numpy())
        assert stat.pvalue > 1e-3, (name, counts.tolist(), stat)


def test_inverse_cdf_never_picks_a_zero_probability_token():
    logp = torch.log(torch.tensor([[0.0, 0.5, 0.0, 0.5, 0.0]]))           # -inf where p = 0
    g = torch.Generator().manual_seed(3)
    toks = torch.cat([DRAWS["inverse_cdf"](logp.expand(64, -1), None, 64, [g],
                                           torch.arange(64), 64) for _ in range(50)])
    assert set(toks.tolist()) == {1, 3}


def test_lora_with_adapters_off_is_the_base_model():
    pytest.importorskip("peft")
    base = load_hf_policy(TINY).eval()
    q = load_hf_policy(TINY, lora_r=4)
    lora = [n for n, p in q.named_parameters() if p.requires_grad]
    assert lora and all("lora_" in n for n in lora)                       # only adapters train
    with torch.no_grad():                                                  # adapters that act
        for n, p in q.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.5)
    q.eval()
    ps = hf_prompts(base)
    r = sample(base, ps, 2, 5, generator=prompt_generators(0, 0, 0, range(len(ps))))
    with torch.no_grad():
        want = completion_logprobs(base, r)
        off = completion_logprobs(q.reference(), r)
        on = completion_logprobs(q, r)
    # the same weights, through peft's layer (base GEMM + nothing) instead of the plain one: each
    # logit sums hidden-size products, so rounding follows hidden x eps x the values' magnitude
    hidden = base.model.config.hidden_size
    tol = hidden * torch.finfo(torch.float32).eps * float(want.abs().max())
    torch.testing.assert_close(off, want, rtol=0, atol=tol)
    assert (on - want).abs().max() > 1e-2                                  # adapters on differ


def test_lora_run_trains_adapters_only_with_the_adapters_off_reference(tmp_path):
    pytest.importorskip("peft")
    from grpo_lab.training.config import preset
    from grpo_lab.training.trainer import train
    kw = dict(threads=1, steps=3, prompts_per_step=4, group_size=4, eval_every=0, eval_size=0,
              time_budget_s=0.0, kl={"beta": 0.05}, hf={"lora_r": 4}, lr=1e-2, warmup_steps=0)
    h = train(preset("hf_tiny_cpu", out_dir=str(tmp_path / "run"), **kw), progress=False)
    assert h[1]["loss/kl"] == 0.0 and h[-1]["loss/kl"] > 0                 # adapters moved away
    assert all(h[-1][k] > 0 for k in ("time/prefill_s", "time/ref_s", "time/loss_forward_s",
                                      "time/backward_s", "time/optimizer_s", "time/check_s"))


def test_bf16_paths_stay_close_to_fp32(tiny):
    """Sampling with a bf16 copy of the weights, and the update under bf16 autocast, give
    log-probs within 0.05 nats (mean |diff|) of fp32 on the tiny model: bf16 keeps 8
    significant bits (relative rounding 2^-9 per weight and activation); the bound is what
    30 layers of such rounding leave on a log-softmax over 96 tokens, measured 0.005-0.02."""
    ps = hf_prompts(tiny)
    r = sample(tiny, ps, 3, 6, generator=prompt_generators(0, 0, 0, range(len(ps))))
    with torch.no_grad():
        want = completion_logprobs(tiny, r)
    m = r.completion_mask
    q = load_hf_policy(TINY, sample_dtype="bfloat16")
    q.eval()
    with torch.no_grad():
        copy_lp = completion_logprobs(q, r)                                 # the bf16 copy
    assert next(q.sampling_copy().parameters()).dtype == torch.bfloat16
    assert next(q.parameters()).dtype == torch.float32                     # master weights
    a = load_hf_policy(TINY, autocast=True).train()
    auto_lp = completion_logprobs(a, r)
    from grpo_lab.training.speed_probe import LOGP_TOLERANCE      # the probe's check: 0.05
    for lp in (copy_lp, auto_lp.detach()):
        assert float((lp - want)[m].abs().mean()) < LOGP_TOLERANCE
    s = sample(q, ps, 3, 6, generator=prompt_generators(0, 0, 0, range(len(ps))))
    assert float((s.logprobs - want)[s.completion_mask & m].abs().mean()) < 0.05 or \
        not torch.equal(s.completion_ids, r.completion_ids)


def test_the_bf16_updates_math_attention_is_as_close_to_fp32_as_flash(tiny, monkeypatch):
    """hf.UPDATE_ATTENTION: the update's forward under bf16 autocast runs sdpa's math kernel
    (the packed forward's 3-D key mask included); its log-probs and gradients are as close to
    the fp32 forward's as those of sdpa's own choice (flash on the CPU): both are bf16
    rounding away, the kernels differing in where they round. Past hf.MATH_MAX_T positions
    sdpa chooses."""
    from grpo_lab.policies import hf
    ps = hf_prompts(tiny)
    r = sample(tiny, ps, 3, 6, generator=prompt_generators(0, 0, 0, range(len(ps))))
    adv = torch.linspace(-1, 1, len(r.prompt_index))
    got, math = {}, hf.UPDATE_ATTENTION
    assert math is not None
    for name, kernel, autocast, max_t in (("math", math, True, hf.MATH_MAX_T),
                                          ("sdpa's", None, True, hf.MATH_MAX_T),
                                          ("fp32", None, False, hf.MATH_MAX_T),
                                          ("math past MATH_MAX_T", math, True, 2)):
        monkeypatch.setattr(hf, "UPDATE_ATTENTION", kernel)
        monkeypatch.setattr(hf, "MATH_MAX_T", max_t)
        a = load_hf_policy(TINY, autocast=autocast).train()
        lp = completion_logprobs(a, r, 0.8, forward=UPDATE_FORWARDS["packed"])
        (lp * adv[:, None] * r.completion_mask).sum().backward()
        got[name] = lp.detach(), torch.cat([p.grad.flatten() for p in a.parameters()])
    m, (lp32, g32) = r.completion_mask, got["fp32"]
    err = {k: (float((lp - lp32)[m].abs().mean()), float((g - g32).norm() / g32.norm()))
           for k, (lp, g) in got.items() if k != "fp32"}
    assert not torch.equal(got["math"][1], got["sdpa's"][1])       # the kernels differ
    assert torch.equal(got.pop("math past MATH_MAX_T")[1], got["sdpa's"][1])  # longer: sdpa's
    assert err["math"][0] <= 1.5 * err["sdpa's"][0] and err["math"][1] <= 1.5 * err["sdpa's"][1], err


def test_bf16_copy_follows_the_master_weights(tiny):
    q = load_hf_policy(TINY, sample_dtype="bfloat16")
    first = q.sampling_copy().model.embed_tokens.weight.clone()
    with torch.no_grad():
        q.model.model.embed_tokens.weight.mul_(2.0)                        # an in-place update
    now = q.sampling_copy().model.embed_tokens.weight
    torch.testing.assert_close(now, (2 * first.float()).to(torch.bfloat16))
