"""The Hugging Face policy (hf.py) on the tiny offline model in data/hf_tiny: equivalence with a
plain forward and with ``generate``, a short GRPO run that learns, and clear errors."""
import subprocess
import sys

import pytest
import torch

transformers = pytest.importorskip("transformers")

from grpo_lab.policies.policy import load_policy_any  # noqa: E402
from grpo_lab.training.config import check_records, TrainConfig, preset                        # noqa: E402
from grpo_lab.policies.hf import HFPolicy, build_tiny_tokenizer, load_hf_policy  # noqa: E402
from grpo_lab.algorithm.rollout import completion_logprobs, sample               # noqa: E402
from grpo_lab.policies.engine import completion_logits                          # noqa: E402
from grpo_lab.training.step import prompt_generators                           # noqa: E402
from grpo_lab.tasks.task_data import load_eval  # noqa: E402
from grpo_lab.training.trainer import train                                     # noqa: E402

TINY = "data/hf_tiny"


@pytest.fixture(scope="module")
def tiny():
    torch.set_num_threads(1)
    return load_hf_policy(TINY)


def prompts(policy, n=6):
    exs = load_eval("addition")[:n - 2] + load_eval("addition")[-2:]
    return [policy.encode("9+1=")] + [policy.encode(e.prompt) for e in exs[1:]]   # lengths differ


def test_logprobs_equal_a_plain_forward_of_the_hf_model(tiny):
    ps = prompts(tiny)
    r = sample(tiny, ps, 3, 6, temperature=1.3, generator=prompt_generators(0, 0, 0, range(len(ps))))
    full = completion_logprobs(tiny, r, temperature=1.3)                 # (N, Tc) padded batch
    torch.testing.assert_close(r.logprobs, full, rtol=1e-5, atol=1e-5)
    tiny.eval()
    for i in range(len(r.completion_ids)):                               # one unpadded row each
        p = r.prompt_ids[i][r.prompt_mask[i]]
        c = r.completion_ids[i][r.completion_mask[i]]
        with torch.no_grad():
            logits = tiny.model(input_ids=torch.cat([p, c])[None]).logits[0]   # (T, V)
        logp = torch.log_softmax(logits[len(p) - 1:-1] / 1.3, -1)          # (Tc_i, V)
        want = logp.gather(1, c[:, None]).squeeze(1)
        torch.testing.assert_close(r.logprobs[i, :len(c)], want, rtol=1e-5, atol=1e-5)
    tiny.train()


def test_cached_and_uncached_greedy_sampling_agree_and_match_generate(tiny):
    ps = prompts(tiny)
    a = sample(tiny, ps, 2, 6, greedy=True)
    b = sample(tiny, ps, 2, 6, greedy=True, use_cache=False)
    assert torch.equal(a.completion_ids, b.completion_ids)
    torch.testing.assert_close(a.logprobs, b.logprobs, rtol=1e-5, atol=1e-5)
    for i, p in enumerate(ps):                                           # transformers' own
        out = tiny.model.generate(torch.tensor([p]), max_new_tokens=6, do_sample=False,
                                  eos_token_id=tiny.eos_id, pad_token_id=tiny.pad_id)[0, len(p):]
        mine = a.completion_ids[2 * i][a.completion_mask[2 * i]]
        assert out[:len(mine)].tolist() == mine.tolist()


def test_short_hf_tiny_cpu_run_raises_reward_and_resumes(tmp_path):
    c = preset("hf_tiny_cpu", out_dir=str(tmp_path / "run"), threads=1, steps=30,
               prompts_per_step=16, group_size=6, eval_every=0, eval_size=50, train_pool=16,
               time_budget_s=0.0)
    history = train(c, progress=False)
    rewards = [h["reward/mean"] for h in history if "reward/mean" in h]
    first, last = sum(rewards[:8]) / 8, sum(rewards[-8:]) / 8
    assert last > first + 0.1, (first, last)
    base = load_hf_policy(TINY).state_dict()
    trained = load_policy_any(tmp_path / "run" / "checkpoint.safetensors")
    assert isinstance(trained, HFPolicy)
    moved = [not torch.equal(p, trained.state_dict()[k]) for k, p in base.items()]
    assert all(moved), [k for k, m in zip(base, moved) if not m]


def test_reference_is_a_frozen_copy_and_resume_is_exact(tmp_path):
    kw = dict(threads=1, steps=4, prompts_per_step=4, group_size=4, eval_every=0, eval_size=10,
              ckpt_every=2, time_budget_s=0.0, kl={"beta": 0.05})
    full = train(preset("hf_tiny_cpu", out_dir=str(tmp_path / "a"), **kw), progress=False)

    def die(m, policy):
        if m["step"] == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        train(preset("hf_tiny_cpu", out_dir=str(tmp_path / "b"), **kw), progress=False,
              on_step=die)
    resumed = train(preset("hf_tiny_cpu", out_dir=str(tmp_path / "b"), **kw), resume=True,
                    progress=False)
    assert full[1]["loss/kl"] == 0.0 and full[-1]["loss/kl"] > 0      # ref stays at the base
    for a, b in zip(full[3:], resumed[3:]):
        assert [a[k] for k in ("reward/mean", "loss/total")] == \
               [b[k] for k in ("reward/mean", "loss/total")]


def test_missing_model_path_names_it():
    with pytest.raises(FileNotFoundError, match="no transformers model folder at 'data/no_such"):
        load_hf_policy("data/no_such_model")
    with pytest.raises(FileNotFoundError, match="has no config.json"):
        load_hf_policy("data")
    with pytest.raises(ValueError, match="is a grpo_lab file"):
        check_records(TrainConfig(policy="hf"))                              # the toy default checkpoint


def test_tokenizer_without_pad_pads_with_eos_and_without_eos_is_an_error(tiny, tmp_path):
    tok = build_tiny_tokenizer(["addition"])
    tok.pad_token = None
    p = HFPolicy(tiny.model, tok, tiny.cfg)
    assert p.pad_id == p.eos_id == tok.eos_token_id
    r = sample(p, prompts(p), 2, 6, generator=torch.Generator().manual_seed(0))
    for row, mask in zip(r.completion_ids, r.completion_mask):         # eos-padded rows decode
        assert p.decode(row.tolist()) == p.decode(row[mask].tolist())
    tok.eos_token = None
    with pytest.raises(ValueError, match="has no eos token"):
        HFPolicy(tiny.model, tok, tiny.cfg)


def test_prompt_longer_than_the_context_names_the_lengths(tiny):
    long = tiny.encode("1+" * 40 + "1=")
    with pytest.raises(ValueError, match=f"prompt length {len(long)} .* block_size 64"):
        sample(tiny, [long], 2, 4)


def test_chat_template_dtype_autocast_and_gradient_checkpointing():
    p = load_hf_policy(TINY, chat_template=True)
    with pytest.raises(ValueError, match=r"the tokenizer of 'data/hf_tiny' has none .*set "
                                         r"hf.chat_template=False"):
        p.encode("1+2=")                              # data/hf_tiny's tokenizer has no template
    p.tokenizer.chat_template = "{% for m in messages %}<eos>{{ m['content'] }}{% endfor %}"
    assert p.encode("1+2=") == [p.eos_id] + p.tokenizer.encode("1+2=", add_special_tokens=False)
    ps = [p.tokenizer.encode("12+3=", add_special_tokens=False)]
    ref = load_hf_policy(TINY)
    want = sample(ref, ps, 2, 4, greedy=True)
    for kw in ({"autocast": True}, {"dtype": "bfloat16"}):                # CPU bf16 paths
        q = load_hf_policy(TINY, **kw)
        r = sample(q, ps, 2, 4, greedy=True)
        assert torch.isfinite(r.logprobs).all() and r.completion_ids.shape[0] == 2
    assert next(q.parameters()).dtype == torch.bfloat16
    grads = []
    for gc in (False, True):
        q = load_hf_policy(TINY, gradient_checkpointing=gc)      # one forward path for both
        completion_logprobs(q, want, forward=completion_logits).sum().backward()
        grads.append(torch.cat([x.grad.flatten() for x in q.parameters()]))
    torch.testing.assert_close(grads[0], grads[1], rtol=1e-5, atol=1e-6)


def test_grpo_lab_imports_without_transformers():
    code = ("import sys; sys.modules['transformers'] = None; sys.modules['tokenizers'] = None\n"
            "import grpo_lab.training.trainer, grpo_lab.cli, grpo_lab.policies.policy, grpo_lab.training.step\n"
            "from grpo_lab.training.config import preset\n"
            "from grpo_lab.policies.policy import load_for\n"
            "try:\n    load_for(preset('hf_tiny_cpu'))\n"
            "except ImportError as e:\n    print('IMPORT-ERROR', e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert 'IMPORT-ERROR policy="hf" needs transformers' in out.stdout


def test_hf_run_is_the_same_on_1_and_2_processes(tmp_path):
    from grpo_lab.training.trainer import spawn_train

    kw = dict(threads=1, steps=3, prompts_per_step=5, group_size=4, eval_every=0, eval_size=10,
              time_budget_s=0.0, lr=3e-4, warmup_steps=0, adam_eps=1e-6, kl={"beta": 0.05})
    one = train(preset("hf_tiny_cpu", out_dir=str(tmp_path / "one"), **kw), progress=False)
    spawn_train([preset("hf_tiny_cpu", out_dir=str(tmp_path / "two"), **kw)], 2,
                run_timeout_s=300)
    a = load_policy_any(tmp_path / "one" / "checkpoint.safetensors").state_dict()
    b = load_policy_any(tmp_path / "two" / "checkpoint.safetensors").state_dict()
    assert max(float((a[k] - load_hf_policy(TINY).state_dict()[k]).abs().max()) for k in a) > 1e-4
    for k in a:
        torch.testing.assert_close(a[k], b[k], atol=1e-5, rtol=0, msg=k)
    import json
    two = [json.loads(x) for x in (tmp_path / "two" / "metrics.jsonl").read_text().splitlines()]
    for x, y in zip(one[1:], two[1:]):                                    # same tokens sampled
        assert x["reward/mean"] == y["reward/mean"]
        assert x["completion/mean_len"] == y["completion/mean_len"]


def test_policy_embedder_reads_the_hf_model(tiny):
    from grpo_lab.algorithm.embeddings import policy_embed

    z = policy_embed(["12+34=", "1+2=", "99+99="], model=tiny)
    assert z.shape == (3, 96) and abs(float((z ** 2).sum(1).mean()) - 1) < 1e-6
    assert tiny.training                                                  # mode restored


def test_lora_adapters_start_from_the_run_seed():
    """peft draws the A matrices from torch's global generator: two runs with one seed differed
    at step 0 (grad/norm 2.111 vs 2.072); now drawn under the run's seed, the caller's generator
    untouched."""
    def adapters(seed):
        p = load_hf_policy(TINY, lora_r=4, seed=seed)
        return {k: v for k, v in p.state_dict().items() if "lora_A" in k}
    torch.manual_seed(123)
    before = torch.rand(3)
    torch.manual_seed(123)
    a, b, c = adapters(0), adapters(0), adapters(1)
    assert torch.equal(torch.rand(3), before)                      # global generator untouched
    assert a.keys() == b.keys() and len(a) > 0
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert any(not torch.equal(a[k], c[k]) for k in a)


@pytest.mark.parametrize("exchange", ["allreduce", "sharded"])
def test_lora_run_is_the_same_on_1_and_2_processes(tmp_path, exchange):
    """--nproc 2 with LoRA crashed at step 0 (the frozen base weights have no gradient: every
    exchange reduced model.parameters()); the exchanges now average and step the parameters
    that train."""
    from grpo_lab.training.trainer import spawn_train

    kw = dict(threads=1, steps=2, prompts_per_step=4, group_size=4, eval_every=0, eval_size=0,
              time_budget_s=0.0, lr=1e-3, warmup_steps=0, hf={"lora_r": 4})
    train(preset("hf_tiny_cpu", out_dir=str(tmp_path / "one"), **kw), progress=False)  # AdamW
    spawn_train([preset("hf_tiny_cpu", out_dir=str(tmp_path / "two"), exchange={"name": exchange},
                        **kw)], 2, run_timeout_s=300)
    a = load_policy_any(tmp_path / "one" / "checkpoint.safetensors").state_dict()
    b = load_policy_any(tmp_path / "two" / "checkpoint.safetensors").state_dict()
    start = load_hf_policy(TINY, lora_r=4).state_dict()
    assert max(float((a[k] - start[k]).abs().max()) for k in a if "lora_B" in k) > 1e-4
    for k in a:
        torch.testing.assert_close(a[k], b[k], atol=1e-5, rtol=0, msg=k)


def test_an_hf_run_checkpoint_starts_a_new_run_and_nan_weights_are_named(tmp_path):
    """A training checkpoint of an HF run was refused as base_checkpoint ("a toy policy"); a
    model folder with a NaN weight reached training and stopped on "logp ... is nan"."""
    import shutil

    from safetensors.torch import load_file, save_file
    first = train(preset("hf_tiny_cpu", out_dir=str(tmp_path / "a"), threads=1, steps=2,
                         eval_size=0, lr=1e-3), progress=False)
    ckpt = tmp_path / "a" / "checkpoint.safetensors"
    cfg = preset("hf_tiny_cpu", base_checkpoint=str(ckpt), out_dir=str(tmp_path / "b"),
                 threads=1, steps=1, eval_size=0)
    trained = load_policy_any(ckpt).state_dict()
    from grpo_lab.policies.policy import load_for
    started = load_for(cfg).state_dict()
    assert all(torch.equal(started[k], trained[k]) for k in trained)     # the run's weights
    assert len(first) > 1 and train(cfg, progress=False)[-1]["step"] == 0
    bad = tmp_path / "nan_model"
    shutil.copytree(TINY, bad)
    w = load_file(str(bad / "model.safetensors"))
    name = next(k for k in w if k.endswith("q_proj.weight"))
    w[name][0, 0] = float("nan")
    save_file(w, str(bad / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(ValueError, match=rf"tensor '.*{name.split('.', 1)[1]}' holds 1 non-finite"):
        load_for(preset("hf_tiny_cpu", base_checkpoint=str(bad)))


def test_a_lora_rank_above_a_layer_rank_is_named():
    with pytest.raises(ValueError, match=r"lora_r=100000 is above the rank of layer .*use "
                                         r"lora_r <= 48"):
        load_hf_policy(TINY, lora_r=100_000)


def test_weights_that_do_not_fit_the_config_are_named(tmp_path):
    """A folder whose config.json is of another model than its weights loaded: transformers
    logged the tensors it did not find and started them random (a GPT-2 config over data/hf_tiny's
    Llama weights trained a random GPT-2; one layer more in the config, a random layer)."""
    import json
    import shutil

    more = tmp_path / "more_layers"
    shutil.copytree(TINY, more)
    config = json.loads((more / "config.json").read_text())
    (more / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 4}))
    with pytest.raises(ValueError, match=r"weights in '.*more_layers' do not fit its config's "
                                         r"LlamaForCausalLM: 9 of its tensors are not in the "
                                         r"checkpoint \(model\.layers\.3\."):
        load_hf_policy(more)
    other = tmp_path / "gpt2"
    shutil.copytree(TINY, other)
    transformers.GPT2Config(vocab_size=49, n_embd=96, n_layer=3, n_head=4,
                            n_positions=64).save_pretrained(other)
    with pytest.raises(ValueError, match=r"'.*gpt2' do not fit its config's GPT2LMHeadModel"):
        load_hf_policy(other)


def test_a_folder_transformers_cannot_read_is_named_with_what_was_read(tmp_path):
    """transformers' own errors named neither the folder nor the step: a folder without its
    tokenizer files ("Couldn't instantiate the backend tokenizer"), a corrupt safetensors file
    ("header too large"), a tensor of another shape ("look at the above report!")."""
    import json
    import shutil

    no_tok = tmp_path / "no_tokenizer"
    shutil.copytree(TINY, no_tok)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (no_tok / name).unlink()
    with pytest.raises(ValueError, match=r"could not load the tokenizer of '.*no_tokenizer': "):
        load_hf_policy(no_tok)
    corrupt = tmp_path / "corrupt"
    shutil.copytree(TINY, corrupt)
    (corrupt / "model.safetensors").write_bytes(b"garbage" * 10)
    with pytest.raises(ValueError, match=r"could not load the weights of '.*corrupt': "
                                         r"SafetensorError"):
        load_hf_policy(corrupt)
    wider = tmp_path / "wider"
    shutil.copytree(TINY, wider)
    config = json.loads((wider / "config.json").read_text())
    (wider / "config.json").write_text(json.dumps({**config, "hidden_size": 128, "head_dim": 32}))
    with pytest.raises(ValueError, match=r"could not load the weights of '.*wider': RuntimeError"):
        load_hf_policy(wider)
