"""rollout='vllm' (vllm_rollout.py) without vLLM: the glue from vLLM's outputs to the rollout's
tensors on fake objects with vLLM's attributes, the seeds, the push rule, the config's refusals
and the install message. The real engine is measured in bench/bench_vllm.py (its own venv)."""
import importlib.util
import subprocess
import sys
from types import SimpleNamespace as NS

import pytest
import torch

from grpo_lab.algorithm.rollout import ROLLOUTS, rollout_scorer, sample_and_score
from grpo_lab.policies.engine import shared_prompt_rows
from grpo_lab.algorithm.vllm_rollout import (VLLMEngine, changed_weights, repack_tied_head,
                                             request_seed, to_rollout)
from grpo_lab.training.config import preset
from grpo_lab.training.step import prompt_generators, seed_of

HAS_VLLM = importlib.util.find_spec("vllm") is not None
EOS, PAD = 2, 0


def completion(index, tokens, logprobs):
    """vLLM's CompletionOutput as the glue reads it: token ids, one {id: Logprob} per token."""
    return NS(index=index, token_ids=tokens,
              logprobs=[{t: NS(logprob=lp), 99: NS(logprob=-9.0)} for t, lp in zip(tokens, logprobs)])


def test_vllm_outputs_become_the_samplers_rollout_by_hand():
    prompts = [[7, 8], [4, 5, 6]]                     # B = 2, G = 2
    outputs = [NS(outputs=[completion(1, [11, 12, 13], [-0.125, -0.375, -0.75]),   # given out of order
                           completion(0, [9, EOS], [-0.5, -0.25])]),
               NS(outputs=[completion(0, [EOS], [-1.0]), completion(1, [3], [-2.0])])]
    r = to_rollout(outputs, prompts, G=2, pad=PAD, eos=EOS)
    assert r.prompt_ids.tolist() == [[0, 7, 8], [0, 7, 8], [4, 5, 6], [4, 5, 6]]   # left-padded
    assert r.prompt_mask.tolist() == [[False, True, True]] * 2 + [[True, True, True]] * 2
    assert r.completion_ids.tolist() == [[9, EOS, 0], [11, 12, 13], [EOS, 0, 0], [3, 0, 0]]
    assert r.completion_mask.tolist() == [[True, True, False], [True, True, True],
                                          [True, False, False], [True, False, False]]
    assert r.logprobs.tolist() == [[-0.5, -0.25, 0.0], [-0.125, -0.375, -0.75],    # the sampled
                                   [-1.0, 0.0, 0.0], [-2.0, 0.0, 0.0]]       # token's, not 99's
    assert r.logprobs.dtype == torch.float32
    assert r.stopped.tolist() == [True, False, True, False]                  # ends with <eos>
    assert r.prompt_index.tolist() == [0, 0, 1, 1] and shared_prompt_rows(r) == 2


def test_vllm_outputs_that_do_not_fit_are_refused():
    one = [NS(outputs=[completion(0, [5], [-1.0])])]
    with pytest.raises(ValueError, match="returned 1 completions, not G=2"):
        to_rollout(one, [[1]], G=2, pad=PAD, eos=EOS)
    with pytest.raises(ValueError, match="1 vLLM outputs for 2 prompts"):
        to_rollout(one, [[1], [2]], G=1, pad=PAD, eos=EOS)
    short = [NS(outputs=[NS(index=0, token_ids=[5, 6], logprobs=[{5: NS(logprob=-1.0)}])])]
    with pytest.raises(ValueError, match="2 tokens but 1 log-prob entries"):
        to_rollout(short, [[1]], G=1, pad=PAD, eos=EOS)


def test_a_prompts_vllm_seed_is_its_generators_seed():
    gens = prompt_generators(3, 5, 0, [0, 7])        # (seed, step, draw, prompt index)
    assert [request_seed(g) for g in gens] == [seed_of(3, 5, 0, 0), seed_of(3, 5, 0, 7)]


def test_only_changed_weights_are_seen_as_changed():
    a, b = torch.zeros(3), torch.ones(2)
    named = [("a", a), ("b", b)]
    assert [n for n, _ in changed_weights(named, None)] == ["a", "b"]        # first push: all
    seen = [(t.data_ptr(), t._version) for _, t in named]
    assert changed_weights(named, seen) == []
    b.add_(1.0)                                       # an optimizer step bumps the version
    assert [n for n, _ in changed_weights(named, seen)] == ["b"]


def test_a_push_into_a_tied_model_repacks_its_lm_head():
    # vLLM reloads the embedding (named_parameters lists the tied matrix once); on the CPU its
    # LM head keeps a packed copy made at load, so the push must re-tie and re-pack it
    packed = []
    embed = NS(weight=torch.ones(4, 2))
    head = NS(weight=torch.zeros(4, 2),
              quant_method=NS(process_weights_after_loading=lambda layer: packed.append(
                  layer.weight.clone())))
    worker = NS(get_model=lambda: NS(lm_head=head, model=NS(embed_tokens=embed)))
    calls = []
    llm = NS(collective_rpc=lambda method, kwargs=None: calls.append(method) or (
        method(worker) if callable(method) else None), reset_prefix_cache=lambda: None)
    for tied in (True, False):
        calls.clear()
        model = torch.nn.Linear(2, 4)
        model.config = NS(tie_word_embeddings=tied)
        engine = VLLMEngine.__new__(VLLMEngine)         # no vLLM: only push's own logic
        engine.llm, engine.seen = llm, None
        assert engine.push(NS(model=model)) and not engine.push(NS(model=model))  # unchanged
        assert calls == (["reload_weights", repack_tied_head] if tied else ["reload_weights"])
    assert head.weight is embed.weight and len(packed) == 1 and packed[0].eq(1).all()


@pytest.mark.parametrize("changes, message", [
    ({"policy": "toy", "base_checkpoint": "data/base_policy.safetensors", "hf": {"chat_template": False},
      "system_prompt": "", "answer_format": "raw", "max_new_tokens": 0},
     "needs policy='hf', not 'toy'"),
    ({"tis": {"cap": 0.0}}, "needs tis.cap > 0"),
    ({"hf": {"chat_template": True, "lora_r": 4}}, "hf.lora_r=4"),
    ({"hf": {"chat_template": True, "sample_dtype": "bfloat16"}}, "hf.sample_dtype='bfloat16'"),
    ({"exchange": {"name": "fsdp2"}}, "exchange 'fsdp2' keeps 1/N of the weights"),
    ({"sampler": {"draw": "inverse_cdf"}}, "sampler block is grpo_lab's sampler's; "
                                           "rollout='vllm' does not read it"),
])
def test_settings_the_vllm_rollout_cannot_run_are_refused(changes, message):
    with pytest.raises(ValueError, match=message):
        preset("smollm_cpu", **{"rollout": "vllm", "tis": {"cap": 2.0}, **changes})


def test_the_vllm_rollout_config_is_accepted_and_an_unknown_one_named():
    assert preset("smollm_cpu", rollout="vllm", tis={"cap": 2.0}).rollout == "vllm"
    with pytest.raises(ValueError, match=r"unknown rollout 'sglang'; known: \['grpo_lab', 'vllm'\]"):
        preset("smollm_cpu", rollout="sglang")


def test_the_default_rollout_is_grpo_labs_sampler():
    cfg = preset("smollm_cpu")
    assert cfg.rollout == "grpo_lab" and sorted(ROLLOUTS) == ["grpo_lab", "vllm"]
    assert rollout_scorer(None, cfg, NS(group=NS(world=1), carry={})) is sample_and_score


@pytest.mark.skipif(HAS_VLLM, reason="vLLM is installed here: the missing-package message cannot show")
def test_without_vllm_the_rollout_says_how_to_get_it():
    cfg = preset("smollm_cpu", rollout="vllm", tis={"cap": 2.0})
    with pytest.raises(ImportError, match=r"needs vLLM.*bench/bench_vllm\.py --build_env DIR"):
        rollout_scorer(None, cfg, NS(group=NS(world=1), carry={}))


def test_the_vllm_rollout_refuses_several_processes():
    cfg = preset("smollm_cpu", rollout="vllm", tis={"cap": 2.0})
    with pytest.raises(ValueError, match="runs in one process; this run has 2"):
        rollout_scorer(None, cfg, NS(group=NS(world=2), carry={}))


def test_the_default_path_never_imports_vllm():
    code = ("import sys, grpo_lab.training.config, grpo_lab.training.trainer; "
            "print('vllm' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False"]
