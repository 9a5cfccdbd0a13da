"""Group sampling: cached log-probs equal a full forward; groups, masks and errors."""
import pytest
import torch

from grpo_lab.policies.model import GPT, GPTConfig
from grpo_lab.algorithm.rollout import completion_logprobs, sample
from grpo_lab.policies.engine import shared_prompt_rows
from grpo_lab.tasks import EOS, PAD, encode


@pytest.fixture
def model():
    torch.manual_seed(0)
    return GPT(GPTConfig(n_layer=2, n_embd=32, n_head=4, block_size=24))


PROMPTS = [encode("12+34="), encode("sort:3142="), encode("7+5=")]


def test_cached_logprobs_equal_full_forward(model):
    r = sample(model, PROMPTS, G=4, max_new_tokens=8, temperature=0.9,
               generator=torch.Generator().manual_seed(1))
    full = completion_logprobs(model, r, temperature=0.9)
    torch.testing.assert_close(r.logprobs, full, rtol=1e-5, atol=1e-5)


def test_cache_and_no_cache_sample_the_same(model):
    a = sample(model, PROMPTS, 3, 8, generator=torch.Generator().manual_seed(5))
    b = sample(model, PROMPTS, 3, 8, generator=torch.Generator().manual_seed(5), use_cache=False)
    assert torch.equal(a.completion_ids, b.completion_ids)
    torch.testing.assert_close(a.logprobs, b.logprobs, rtol=1e-5, atol=1e-5)


def test_groups_masks_and_stop(model):
    # make <eos> likely so that some completions stop early
    with torch.no_grad():
        model.wte.weight[EOS] += 0.5 * model.wte.weight[2:].mean(0)
    r = sample(model, PROMPTS, G=5, max_new_tokens=6, generator=torch.Generator().manual_seed(0))
    N, Tc = r.completion_ids.shape
    assert N == 15 and shared_prompt_rows(r) == 5
    assert r.prompt_index.tolist() == [i for i in range(3) for _ in range(5)]
    assert torch.equal(r.prompt_ids[0], r.prompt_ids[4])                  # shared prompt
    for row, mask, stopped in zip(r.completion_ids, r.completion_mask, r.stopped):
        n = int(mask.sum())
        assert mask[:n].all() and not mask[n:].any()                       # contiguous prefix
        assert (row[n:] == PAD).all()
        assert bool(stopped) == (n > 0 and int(row[n - 1]) == EOS)
    assert (r.logprobs[~r.completion_mask] == 0).all()
    assert (r.logprobs[r.completion_mask] < 0).all()


def test_greedy_is_deterministic_and_top_k_respected(model):
    a = sample(model, PROMPTS, 2, 5, greedy=True)
    b = sample(model, PROMPTS, 2, 5, greedy=True)
    assert torch.equal(a.completion_ids, b.completion_ids)
    r = sample(model, PROMPTS, 8, 5, top_k=1, generator=torch.Generator().manual_seed(3))
    g = sample(model, PROMPTS, 8, 5, greedy=True)
    assert torch.equal(r.completion_ids, g.completion_ids)                # top-1 = greedy


def test_bad_input(model):
    with pytest.raises(ValueError, match="empty prompt list"):
        sample(model, [], 4, 4)
    with pytest.raises(ValueError, match="prompt 1 is empty"):
        sample(model, [encode("1+1="), []], 4, 4)
    with pytest.raises(ValueError, match="G must be >= 1, got 0"):
        sample(model, PROMPTS, 0, 4)
    with pytest.raises(ValueError, match="exceeds the model's block_size 24"):
        sample(model, PROMPTS, 2, 20)
    with pytest.raises(ValueError, match="temperature must be > 0"):
        sample(model, PROMPTS, 2, 4, temperature=0.0)


def test_a_nan_temperature_is_refused_not_sampled(model):
    # nan <= 0 is False: it sampled token 0 in every row, every log-prob NaN
    with pytest.raises(ValueError, match="temperature must be > 0 .*got nan"):
        sample(model, PROMPTS, 2, 4, temperature=float("nan"),
               generator=torch.Generator().manual_seed(0))


def test_shared_prefix_counts_the_common_leading_tokens():
    from grpo_lab.policies.engine import shared_prefix
    a = list(range(2, 22))                                                 # 20 tokens
    assert shared_prefix([a + [5], a + [6, 7]]) == 20
    assert shared_prefix([a + [5, 6], a + [5, 7]]) == 21                   # both go on with 5
    assert shared_prefix([a + [5], a + [5, 7]]) == 20              # but [5] must stay a token
    assert shared_prefix([a, a + [5]]) == 19                       # the shorter keeps 1 token
    assert shared_prefix([a, a]) == 19
    assert shared_prefix([a[:15] + [1], a[:15] + [2]]) == 0                # 15 < 16: not shared
    assert shared_prefix([a[:15] + [1], a[:15] + [2]], minimum=15) == 15
    assert shared_prefix([a + [5]]) == 0                                   # one prompt
    assert shared_prefix([[9] + a, a]) == 0


@pytest.mark.parametrize("drop", [False, True])
def test_a_shared_prefix_prefilled_once_samples_what_the_whole_prompts_do(drop):
    """Prompts with an 18-token common prefix: prefilled once (the default) or each whole,
    the same tokens and the same sampler log-probs within float rounding, which also equal
    a full forward of the standard left-padded layout."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=2, n_embd=32, n_head=4, block_size=48))
    with torch.no_grad():
        model.wte.weight[EOS] += 0.5 * model.wte.weight[2:].mean(0)   # some rows stop early
    g = torch.Generator().manual_seed(3)
    prefix = torch.randint(2, model.cfg.vocab_size, (18,), generator=g).tolist()
    prompts = [prefix + s for s in ([4, 5], [6], [7, 8, 9, 10], [11, 12, 13])]
    runs = [sample(model, prompts, 3, 10, temperature=0.9, drop_finished=drop,
                   generator=[torch.Generator().manual_seed(i) for i in range(4)],
                   share_prefix=share) for share in (True, False)]
    assert torch.equal(runs[0].completion_ids, runs[1].completion_ids)
    assert torch.equal(runs[0].prompt_ids, runs[1].prompt_ids)              # standard layout
    assert torch.equal(runs[0].prompt_mask, runs[1].prompt_mask)
    assert bool(runs[0].stopped.any()) and not bool(runs[0].stopped.all())
    torch.testing.assert_close(runs[0].logprobs, runs[1].logprobs, rtol=1e-5, atol=1e-5)
    full = completion_logprobs(model, runs[0], temperature=0.9)
    torch.testing.assert_close(runs[0].logprobs, full, rtol=1e-5, atol=1e-5)
