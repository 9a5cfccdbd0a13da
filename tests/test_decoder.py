"""The lean decoder (policies/decoder.py): its logits are transformers' within float32
rounding, the sampler draws the same tokens with it, it follows the weights after an update,
and it steps aside where it does not apply."""
import copy

import pytest
import torch

transformers = pytest.importorskip("transformers")

from grpo_lab.algorithm.rollout import DRAWS, inverse_cdf_draw, sample  # noqa: E402
from grpo_lab.policies.engine import all_positions_logits, left_pad, positions
from grpo_lab.policies.decoder import LlamaDecoder, StaticCache, decoder_for   # noqa: E402
from grpo_lab.policies.hf import HFConfig, HFPolicy, HFPolicyConfig, load_hf_policy   # noqa: E402
from grpo_lab.tasks.task_data import load_eval  # noqa: E402
from grpo_lab.training.step import prompt_generators                     # noqa: E402

TINY = "data/hf_tiny"


@pytest.fixture(scope="module")
def tiny():
    torch.set_num_threads(1)
    return load_hf_policy(TINY).eval()


def prompts(policy, n=5):
    return [policy.encode(e.prompt) for e in load_eval("addition")[:n]] + [policy.encode("9+1=")]


def logit_tol(policy, h_abs: float = 1.0) -> float:
    """A logit is a sum of C products of the final hidden state and a head row; float32
    reorderings (stacked GEMMs, matmul + softmax instead of sdpa) move it by about C * eps *
    sum |h_c w_c|, bounded here with |h| <= 4 after RMSNorm times its weight."""
    w = policy.model.lm_head.weight.abs().max().item()
    C = policy.model.config.hidden_size
    return 4 * C * torch.finfo(torch.float32).eps * C * w * h_abs


def bf16_logit_tol(policy, h_abs: float = 4.0) -> float:
    """bf16 weights: each path rounds the final hidden state (|h| <= 4, as above) to bf16 at
    its own point, which moves a logit by up to sum |h_c w_c| * 2^-8 (bf16's unit roundoff);
    two such roundings, one a path."""
    w = policy.model.lm_head.weight.abs().max().item()
    C = policy.model.config.hidden_size
    return 2 * C * w * h_abs * 2.0 ** -8


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_decode_steps_give_transformers_logits(dtype, tiny):
    """Prefill with transformers, then 5 lean steps through given tokens, left-padded prompts
    of different lengths, one row's new key masked out: each step's logits against a full
    transformers forward of the whole sequence with the same mask and positions, in float32
    (the master model) and bfloat16 (a sampling copy): within each dtype's rounding."""
    ps = prompts(tiny)
    ids, mask = left_pad(ps, tiny.pad_id)                                # (B, Tp)
    pos = positions(mask)
    model = tiny.model if dtype == "float32" else copy.deepcopy(tiny.model).to(torch.bfloat16)
    dec = decoder_for(model)
    assert isinstance(dec, LlamaDecoder)
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=mask.long(), position_ids=pos, use_cache=True)
    cache = dec.start(out.past_key_values, 1, 5)
    assert isinstance(cache, StaticCache) and cache.t == ids.shape[1]
    assert cache.keys.dtype == getattr(torch, dtype)
    g = torch.Generator().manual_seed(0)
    next_pos = pos[:, -1] + 1
    tol = logit_tol(tiny) if dtype == "float32" else bf16_logit_tol(tiny)
    for step in range(5):
        tok = torch.randint(0, tiny.cfg.vocab_size, (len(ps),), generator=g)  # (B,)
        live = torch.ones(len(ps), dtype=torch.bool)
        if step == 2:
            live[1] = False                                              # a finished row's pad
        ids, mask = torch.cat([ids, tok[:, None]], 1), torch.cat([mask, live[:, None]], 1)
        got = dec.step(tok, next_pos, mask, cache)                       # (B, V)
        pos = torch.cat([pos, next_pos[:, None]], 1)                     # (B, T)
        with torch.no_grad():
            want = model(input_ids=ids, attention_mask=mask.long(),
                         position_ids=pos).logits[:, -1]                 # (B, V)
        assert got.dtype == want.dtype
        torch.testing.assert_close(got.float(), want.float(), rtol=0, atol=tol)
        next_pos = next_pos + 1
    assert cache.t == ids.shape[1]


@pytest.mark.parametrize("draw", ["race", "inverse_cdf"])
def test_sampling_with_the_lean_decoder_draws_transformers_tokens(draw, tiny):
    """The same per-prompt generators give the same tokens and log-probs (within rounding)
    through the lean decoder and through transformers' forward, finished rows dropped or not."""
    ps = prompts(tiny)
    got = {}
    for decoder in ("lean", "transformers"):
        tiny.cfg.decoder = decoder
        for drop in (False, True):
            got[decoder, drop] = sample(tiny, ps, 3, 8, temperature=1.0, draw=DRAWS[draw],
                                        drop_finished=drop,
                                        generator=prompt_generators(0, 1, 0, range(len(ps))))
    tiny.cfg.decoder = "lean"
    ref = got["transformers", False]
    assert bool(ref.stopped.any())                      # some rows stop early: drop is exercised
    for key, r in got.items():
        assert torch.equal(r.completion_ids, ref.completion_ids), key
        torch.testing.assert_close(r.logprobs, ref.logprobs, rtol=0, atol=1e-4)


def test_a_shared_prompt_prefix_prefilled_once_samples_the_same_tokens(tiny):
    """Prompts that all start with the same 20 tokens (a chat template's system turn): the
    prefix prefilled once (engine.prefill_shared, the default) or every prompt whole, through
    the lean decoder and transformers' forward, rows dropped or not: the same tokens, log-probs
    within rounding, and those equal the update's forward over the standard layout."""
    from grpo_lab.algorithm.rollout import completion_logprobs
    g = torch.Generator().manual_seed(7)
    prefix = torch.randint(2, tiny.cfg.vocab_size, (20,), generator=g).tolist()
    ps = [prefix + p for p in prompts(tiny)]
    got = {}
    for decoder in ("lean", "transformers"):
        tiny.cfg.decoder = decoder
        for share in (True, False):
            got[decoder, share] = sample(tiny, ps, 3, 8, temperature=1.0, draw=inverse_cdf_draw,
                                         drop_finished=True, share_prefix=share,
                                         generator=prompt_generators(0, 2, 0, range(len(ps))))
    tiny.cfg.decoder = "lean"
    ref = got["transformers", False]
    assert len(set(ref.completion_mask.sum(1).tolist())) > 1     # rows leave at different steps
    for key, r in got.items():
        assert torch.equal(r.completion_ids, ref.completion_ids), key
        torch.testing.assert_close(r.logprobs, ref.logprobs, rtol=0, atol=1e-4)
    with torch.no_grad():
        full = completion_logprobs(tiny, got["lean", True], forward=all_positions_logits)
    torch.testing.assert_close(got["lean", True].logprobs, full, rtol=0, atol=1e-4)


@pytest.mark.parametrize("sample_dtype", ["", "bfloat16"])
def test_the_decoder_follows_the_weights_after_an_update(sample_dtype, tiny):
    """Stacked q/k/v weights (and, bf16 where decoder.PACK_BF16, every packed weight) are
    copies: an in-place change of the model's weights (what an optimizer step does) is picked
    up at the next rollout's start; first the MLP's and the head's alone, then q/k/v's."""
    ps = prompts(tiny, 2)
    policy = load_hf_policy(TINY, sample_dtype=sample_dtype).eval()
    tol = 1e-4 if not sample_dtype else 2 * bf16_logit_tol(tiny)
    layers = policy.model.model.layers
    mlp_and_head = [*(l.mlp.down_proj.weight for l in layers), policy.model.lm_head.weight]
    k_and_v = [w for l in layers for w in (l.self_attn.k_proj.weight, l.self_attn.v_proj.weight)]
    for changed in (mlp_and_head, k_and_v):               # (the head is tied: embedding too)
        policy.cfg.decoder = "lean"
        before = sample(policy, ps, 2, 4, greedy=True)
        with torch.no_grad():
            for w in changed:
                w.mul_(-2.0)
        after = sample(policy, ps, 2, 4, greedy=True)
        policy._leans.clear()                          # a decoder built from the weights now
        fresh = sample(policy, ps, 2, 4, greedy=True)
        assert torch.equal(after.completion_ids, fresh.completion_ids)
        assert torch.equal(after.logprobs, fresh.logprobs)
        assert not torch.equal(before.logprobs, after.logprobs)            # the change shows
        policy.cfg.decoder = "transformers"
        want = sample(policy, ps, 2, 4, greedy=True)
        torch.testing.assert_close(after.logprobs, want.logprobs, rtol=0, atol=tol)


def test_packed_bf16_weights_decode_as_the_unpacked_ones(tiny, monkeypatch):
    """decoder.PACK_BF16: the bf16 copy's weights packed for oneDNN give the logits of the
    same weights unpacked, within bf16 rounding (bit for bit on the CPUs measured)."""
    from grpo_lab.policies import decoder
    if not decoder.PACK_BF16:
        pytest.skip("this CPU's oneDNN runs no native bf16: nothing is packed")
    ps = prompts(tiny, 2)
    got = {}
    for pack in (True, False):
        monkeypatch.setattr(decoder, "PACK_BF16", pack)
        policy = load_hf_policy(TINY, sample_dtype="bfloat16").eval()
        got[pack] = sample(policy, ps, 2, 5, greedy=True)
        assert policy.lean_decoder().packed is pack
    assert torch.equal(got[True].completion_ids, got[False].completion_ids)
    torch.testing.assert_close(got[True].logprobs, got[False].logprobs, rtol=0,
                               atol=2 * bf16_logit_tol(tiny))


def test_a_fused_adamw_step_refreshes_the_decoder_and_the_sampling_copy(tiny):
    """torch's fused AdamW leaves version counters alone; the exchange's step bumps them, so
    what is cached from the weights (the lean decoder's stacked q/k/v, the bf16 sampling copy)
    is rebuilt at the next rollout."""
    from grpo_lab.distributed.exchanges import AdamW, _adamw
    ps = prompts(tiny, 2)
    policy = load_hf_policy(TINY).eval()
    copy_policy = load_hf_policy(TINY, sample_dtype="bfloat16").eval()
    for p in (policy, copy_policy):
        sample(p, ps, 2, 3, greedy=True)                               # builds the caches
        _, _, step = _adamw(p.model, AdamW(lr=0.05, fused=True))
        for w in p.model.parameters():
            w.grad = torch.ones_like(w)
        step()
    after = sample(policy, ps, 2, 4, greedy=True)
    policy.cfg.decoder = "transformers"
    want = sample(policy, ps, 2, 4, greedy=True)
    torch.testing.assert_close(after.logprobs, want.logprobs, rtol=0, atol=1e-4)
    sample(copy_policy, ps, 2, 3, greedy=True)
    for c, w in zip(copy_policy.sampling_copy().parameters(), copy_policy.model.parameters()):
        assert torch.equal(c, w.to(torch.bfloat16))


def test_a_lora_model_decodes_with_its_adapters(tiny):
    """LoRA adapters (B made non-zero, as after training) are added as peft adds them: the
    same tokens and log-probs as peft's forward, and a change of the adapters (an update) is
    followed."""
    pytest.importorskip("peft")
    ps = prompts(tiny, 3)
    policy = load_hf_policy(TINY, lora_r=4).eval()
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for name, w in policy.model.named_parameters():
            if "lora_B" in name:
                w.copy_(torch.randn(w.shape, generator=g) * 0.3)
    assert policy.lean_decoder() is not None
    for _ in range(2):
        got = {}
        for decoder in ("lean", "transformers"):
            policy.cfg.decoder = decoder
            got[decoder] = sample(policy, ps, 2, 6, draw=inverse_cdf_draw,
                                  generator=prompt_generators(0, 2, 0, range(len(ps))))
        assert torch.equal(got["lean"].completion_ids, got["transformers"].completion_ids)
        torch.testing.assert_close(got["lean"].logprobs, got["transformers"].logprobs,
                                   rtol=0, atol=1e-4)
        policy.cfg.decoder = "lean"
        with torch.no_grad():                                          # an update of the adapters
            for name, w in policy.model.named_parameters():
                if "lora_A" in name:
                    w.mul_(-2.0)


def test_the_bf16_sampling_copy_decodes_with_the_lean_decoder(tiny):
    """``hf.sample_dtype`` "bfloat16": the lean decoder runs on the sampling copy (with or
    without autocast for the update), and samples what transformers' forward of the copy
    samples: the same greedy tokens, log-probs within bf16 rounding of the logits."""
    ps = prompts(tiny)
    for autocast in (False, True):
        policy = load_hf_policy(TINY, sample_dtype="bfloat16", autocast=autocast).eval()
        dec = policy.lean_decoder()
        assert dec is not None and dec.model is policy.sampling_copy()
        assert dec.qkv[0].dtype == torch.bfloat16
        got = {}
        for decoder in ("lean", "transformers"):
            policy.cfg.decoder = decoder
            got[decoder] = sample(policy, ps, 2, 6, greedy=True)
        assert torch.equal(got["lean"].completion_ids, got["transformers"].completion_ids)
        torch.testing.assert_close(got["lean"].logprobs, got["transformers"].logprobs,
                                   rtol=0, atol=2 * bf16_logit_tol(tiny))


def test_one_policy_switched_between_fp32_and_the_bf16_copy_decodes_each_with_its_own(tiny):
    """The speed probe switches ``sample_dtype`` on one policy: each model that samples gets
    its own lean decoder (a float32 one on the bf16 copy's cache would fail), and switching
    back samples what it sampled before."""
    ps = prompts(tiny, 3)
    policy = load_hf_policy(TINY).eval()
    first = sample(policy, ps, 2, 5, greedy=True)
    policy.cfg.sample_dtype = "bfloat16"
    copy_run = sample(policy, ps, 2, 5, greedy=True)
    assert policy.lean_decoder().model is policy.sampling_copy()
    policy.cfg.sample_dtype = ""
    assert policy.lean_decoder().model is policy.model
    again = sample(policy, ps, 2, 5, greedy=True)
    assert torch.equal(again.completion_ids, first.completion_ids)
    assert torch.equal(again.logprobs, first.logprobs)
    assert copy_run.completion_ids.shape == first.completion_ids.shape


def test_the_sampling_copys_head_gets_a_contiguous_input(tiny):
    """transformers hands the head the last position as a strided slice; the sampling copy's
    head makes it contiguous first (a strided bf16 input made torch's CPU matmul copy the
    head's weight once per row: hf._contiguous_input). The logits are the same products."""
    policy = load_hf_policy(TINY, sample_dtype="bfloat16").eval()
    seen = []
    head = policy.sampling_copy().get_output_embeddings()
    head.register_forward_hook(lambda m, args, out: seen.append(args[0].is_contiguous()))
    ids, mask = left_pad(prompts(tiny), tiny.pad_id)
    with torch.no_grad():
        last, _ = policy(ids, positions(mask), mask, logits_to_keep=1)           # (B, 1, V)
        full = policy.sampling_copy()(input_ids=ids, attention_mask=mask.long(),
                                      position_ids=positions(mask)).logits      # (B, T, V)
    assert seen == [True, True]
    torch.testing.assert_close(last[:, 0].float(), full[:, -1].float(), rtol=0,
                               atol=bf16_logit_tol(tiny))


def test_where_the_lean_decoder_does_not_apply_transformers_decodes(tiny):
    assert tiny.lean_decoder() is not None
    for field, value in (("decoder", "transformers"), ("autocast", True)):
        cfg = HFPolicyConfig(**{**tiny.cfg.__dict__, field: value})
        assert HFPolicy(tiny.model, tiny.tokenizer, cfg).lean_decoder() is None, field
    gpt2 = transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=32, n_positions=16, n_embd=16, n_layer=1, n_head=2))
    assert decoder_for(gpt2) is None                                   # not a Llama
    biased = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1, attention_bias=True))
    assert decoder_for(biased) is None                                 # biases: not computed
    assert decoder_for(biased.to(torch.bfloat16)) is None


def test_bad_decoder_names_and_a_full_cache_are_clear_errors(tiny):
    with pytest.raises(ValueError, match="'fast'"):
        HFConfig(decoder="fast")
    with pytest.raises(ValueError, match="'fast'"):
        load_hf_policy(TINY, decoder="fast")
    ps = prompts(tiny, 2)
    ids, mask = left_pad(ps, tiny.pad_id)
    dec = decoder_for(tiny.model)
    with torch.no_grad():
        out = tiny.model(input_ids=ids, attention_mask=mask.long(), position_ids=positions(mask),
                         use_cache=True)
    cache = dec.start(out.past_key_values, 1, 1)
    n = len(ps)
    tok, pos = torch.zeros(n, dtype=torch.long), positions(mask)[:, -1] + 1
    mask = torch.cat([mask, torch.ones(n, 1, dtype=torch.bool)], 1)
    dec.step(tok, pos, mask, cache)
    with pytest.raises(ValueError, match=f"holds {ids.shape[1] + 1} positions"):
        dec.step(tok, pos + 1, torch.cat([mask, mask[:, :1]], 1), cache)
    with pytest.raises(ValueError, match="do not agree"):
        dec.step(tok, pos, mask, cache)


def test_selecting_cache_rows_keeps_exactly_those_rows_filled_columns():
    """StaticCache.batch_select_indices compacts in place: rows [0, 2, 3] of 5 end up as rows
    0..2 with their filled columns unchanged, the buffers' other columns are not read;
    unordered or negative row indices are an error that names them."""
    L, N, KV, T, d, t = 2, 5, 3, 7, 4, 4
    keys = torch.arange(L * N * KV * T * d, dtype=torch.float32).reshape(L, N, KV, T, d)
    values = -keys
    rows = torch.tensor([0, 2, 3])
    want_k, want_v = keys[:, rows, :, :t].clone(), values[:, rows, :, :t].clone()
    cache = StaticCache(keys.clone(), values.clone(), t).batch_select_indices(rows)
    assert cache.rows == 3 and cache.keys.shape == (L, 3, KV, T, d)
    assert torch.equal(cache.keys[..., :t, :], want_k)
    assert torch.equal(cache.values[..., :t, :], want_v)
    again = cache.batch_select_indices(torch.tensor([1]))                 # rows 2 of the first
    assert torch.equal(again.keys[..., :t, :], want_k[:, 1:2])
    for bad in ([2, 0], [1, 1], [-1, 2]):
        with pytest.raises(ValueError, match=rf"increasing row indices, got \[{bad[0]}, "):
            StaticCache(keys.clone(), values.clone(), t).batch_select_indices(torch.tensor(bad))


@pytest.mark.parametrize("n", [1, 5, 8])
def test_the_small_gemm_is_f_linear_within_rounding(n):
    """x W^T at up to 8 rows: the streaming kernel against MKL's, the bound K * eps * sum |x w|
    per output (the two sum K products in different orders); NaN and inf propagate."""
    small_gemm = pytest.importorskip("grpo_lab.policies.small_gemm")
    if not small_gemm.AVAILABLE:
        pytest.skip("numba is not installed")
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(n)
    x, w = torch.randn(n, 77, generator=g), torch.randn(130, 77, generator=g)   # odd sizes
    with torch.no_grad():
        assert small_gemm.applies(x, w)
        got, want = small_gemm.linear_rows8(x, w), torch.nn.functional.linear(x, w)
        bound = 77 * torch.finfo(torch.float32).eps * (x.abs() @ w.abs().T)     # (n, 130)
        assert got.shape == (n, 130)
        assert bool(((got - want).abs() <= bound).all())
        x[0, 3], x[-1, 5] = float("nan"), float("inf")
        bad = small_gemm.linear_rows8(x, w)
        assert bool(bad[0].isnan().all()) and bool((~bad[-1].isfinite()).all())
        if n > 1:
            assert bool(bad[1:-1].isfinite().all())
    assert not small_gemm.applies(x, w)                 # autograd on: MKL's, which has a backward
    with torch.no_grad():
        assert not small_gemm.applies(torch.randn(9, 77), w)           # more than 8 rows
        assert not small_gemm.applies(x.double(), w.double())
        assert not small_gemm.applies(x, w.T.contiguous().T)           # not contiguous
