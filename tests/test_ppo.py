"""PPO's critic pieces: GAE on a hand-worked example, the clipped value loss by hand, a value
head whose loss falls on a fixed batch; PPO through the one trainer (objective="ppo"): it learns,
trains the critic, resumes exactly and refuses what it does not support."""
import pytest
import torch

from grpo_lab.policies.model import load_policy
from grpo_lab.algorithm.critic import explained_variance, gae, value_loss
from grpo_lab.policies.model import ValueHead
from grpo_lab.algorithm.rollout import sample
from grpo_lab.policies.engine import positions
from grpo_lab.tasks.rewards import accuracy_reward
from grpo_lab.tasks import decode, encode, get_task, sample_examples


def test_gae_by_hand():
    # one completion of 3 tokens, outcome reward 1 on the last; V = .5, .6, .7; gamma 1, lambda .5
    # deltas: .6 - .5 = .1, .7 - .6 = .1, 1 - .7 = .3 (V after the end is 0)
    # A2 = .3, A1 = .1 + .5 * .3 = .25, A0 = .1 + .5 * .25 = .225; returns = A + V
    # second row: 2 real tokens then padding; reward 1 on token 1, V = .2, .4
    # deltas .4 - .2 = .2, 1 - .4 = .6 -> A1 = .6, A0 = .2 + .5 * .6 = .5
    r = torch.tensor([[0.0, 0.0, 1.0], [0.0, 1.0, 9.0]])
    v = torch.tensor([[0.5, 0.6, 0.7], [0.2, 0.4, 9.0]])
    m = torch.tensor([[True, True, True], [True, True, False]])
    adv, ret = gae(r, v, m, gamma=1.0, lam=0.5)
    torch.testing.assert_close(adv, torch.tensor([[0.225, 0.25, 0.3], [0.5, 0.6, 0.0]]))
    torch.testing.assert_close(ret, torch.tensor([[0.725, 0.85, 1.0], [0.7, 1.0, 0.0]]))
    # lambda 1, gamma 1: A_t = R - V_t (Monte Carlo); lambda 0: A_t = delta_t (one step)
    adv1, _ = gae(r, v, m, 1.0, 1.0)
    torch.testing.assert_close(adv1[0], torch.tensor([0.5, 0.4, 0.3]))
    adv0, _ = gae(r, v, m, 1.0, 0.0)
    torch.testing.assert_close(adv0[0], torch.tensor([0.1, 0.1, 0.3]))


def test_value_loss_by_hand_and_bad_input():
    v, old, ret = torch.tensor([[1.0, 0.0]]), torch.tensor([[0.0, 0.0]]), torch.tensor([[0.5, 1.0]])
    m = torch.tensor([[True, True]])
    # token 0: unclipped (1 - .5)^2 = .25, clipped to .2: (.2 - .5)^2 = .09 -> max .25
    # token 1: (0 - 1)^2 = 1 both ways; mean .625, times 1/2
    assert float(value_loss(v, old, ret, m, clip=0.2)) == pytest.approx(0.3125)
    with pytest.raises(ValueError, match="value clip must be >= 0, got -1"):
        value_loss(v, old, ret, m, clip=-1)
    with pytest.raises(ValueError, match="must be one \\(N, T\\) shape"):
        gae(torch.zeros(2, 3), torch.zeros(2, 2), torch.ones(2, 3, dtype=torch.bool))
    with pytest.raises(ValueError, match="gamma and lambda in \\[0, 1\\]"):
        gae(torch.zeros(1, 1), torch.zeros(1, 1), torch.ones(1, 1, dtype=torch.bool), lam=2.0)


def test_critic_loss_falls_on_a_fixed_batch():
    import random
    torch.manual_seed(0)
    policy = load_policy("data/base_policy.safetensors").eval()
    exs = sample_examples([get_task("addition")], 16, random.Random(0))
    r = sample(policy, [encode(e.prompt) for e in exs], 2, 5, 0.7,
               generator=torch.Generator().manual_seed(0))                 # N = 32 rows
    ids = torch.cat([r.prompt_ids, r.completion_ids], 1)
    mask = torch.cat([r.prompt_mask, r.completion_mask], 1)
    with torch.no_grad():
        _, _, h = policy(ids, positions(mask), mask, return_hidden=True)  # (N, T, C)
    Tp = r.prompt_ids.shape[1]
    hid = h[:, Tp - 1:-1]                                                  # state before each token
    texts = [decode(c) for c in r.completion_ids.tolist()]
    correct = accuracy_reward(texts, [exs[i] for i in r.prompt_index.tolist()], r.stopped.tolist())
    rewards = torch.zeros(r.completion_mask.shape)                         # outcome on the last token
    last = r.completion_mask.sum(1) - 1
    rewards[torch.arange(len(last)), last] = torch.tensor(correct)
    head = ValueHead(hid.shape[-1])
    opt = torch.optim.Adam(head.parameters(), lr=1e-2)
    losses = []
    for _ in range(60):
        with torch.no_grad():
            _, ret = gae(rewards, head(hid), r.completion_mask, 1.0, 1.0)  # Monte Carlo targets
        values = head(hid)
        loss = value_loss(values, values.detach(), ret, r.completion_mask, clip=10.0)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0], (losses[0], losses[-1])


# ---- PPO through the one trainer (objective="ppo")

def _ppo_cfg(tmp_path, **kw):
    from grpo_lab.training.config import preset
    return preset("quick", **{"out_dir": str(tmp_path / "run"), "threads": 1, "objective": "ppo",
                              **kw})


def test_ppo_run_raises_reward_and_trains_the_critic(tmp_path):
    from grpo_lab.policies.policy import load_policy_any
    from grpo_lab.checkpoint import read_training_checkpoint
    from grpo_lab.training.trainer import train
    c = _ppo_cfg(tmp_path, steps=40, prompts_per_step=16, group_size=6, eval_every=0, lr=1e-4,
                 train_pool=16)
    history = train(c, progress=False)
    rewards = [h["reward/mean"] for h in history if "reward/mean" in h]
    assert len(rewards) == 40
    first, last = sum(rewards[:10]) / 10, sum(rewards[-10:]) / 10
    assert last > first + 0.1, (first, last)
    assert all("ppo/value_loss" in h and "ppo/explained_variance" in h for h in history[1:])
    saved = read_training_checkpoint(tmp_path / "run" / "checkpoint.safetensors")["policy"]
    head = {k: v for k, v in saved.items() if k.startswith("value_head.")}
    assert set(head) == {"value_head.proj.weight", "value_head.proj.bias"}
    assert all(v.abs().sum() > 0 for v in head.values())      # moved from its zero init
    assert hasattr(load_policy_any(tmp_path / "run" / "checkpoint.safetensors"), "value_head")


@pytest.mark.parametrize("critic,vf_lr", [("head", 0.0), ("head", 1e-3), ("network", 1e-3)])
def test_ppo_resume_is_exact(tmp_path, critic, vf_lr):     # vf_lr 1e-3: the critic's own group
    from grpo_lab.training.trainer import train
    kw = dict(steps=4, ckpt_every=2, eval_size=5, ppo={"vf_lr": vf_lr, "critic": critic})
    full = train(_ppo_cfg(tmp_path / "a", **kw), progress=False)

    def die(m, policy):  # killed during step 2: the checkpoint holds steps 0-1, critic included
        if m["step"] == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        train(_ppo_cfg(tmp_path / "b", **kw), progress=False, on_step=die)
    resumed = train(_ppo_cfg(tmp_path / "b", **kw), resume=True, progress=False)  # steps 2, 3
    keys = ["loss/total", "ppo/value_loss", "reward/mean"]
    assert [[h[k] for k in keys] for h in full[1:]] == [[h[k] for k in keys] for h in resumed[1:]]


def test_ppo_bad_config_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match="objective='ppo' does not support dynamic.sampling=True"):
        _ppo_cfg(tmp_path, dynamic={"sampling": True})
    with pytest.raises(ValueError, match="vf_coef must be >= 0, got -1"):
        _ppo_cfg(tmp_path, ppo={"vf_coef": -1.0})
    with pytest.raises(ValueError, match="ppo.gamma and ppo.gae_lambda in \\[0, 1\\]"):
        _ppo_cfg(tmp_path, ppo={"gae_lambda": 1.5})
    with pytest.raises(ValueError, match="vf_lr must be >= 0, got -0.001"):
        _ppo_cfg(tmp_path, ppo={"vf_lr": -1e-3})
    with pytest.raises(ValueError, match="vf_lr must be a finite number, got nan"):
        _ppo_cfg(tmp_path, ppo={"vf_lr": float("nan")})
    with pytest.raises(ValueError, match="ppo.vf_lr=0.001 is the critic's learning rate: it "
                                         "needs objective='ppo', not 'grpo'"):
        _ppo_cfg(tmp_path, objective="grpo", ppo={"vf_lr": 1e-3})
    with pytest.raises(ValueError, match="unknown ppo.critic 'mlp'"):
        _ppo_cfg(tmp_path, ppo={"critic": "mlp"})
    with pytest.raises(ValueError, match="objective='ppo' puts beta \\* KL in the loss, not "
                                         "kl.placement='reward'"):
        _ppo_cfg(tmp_path, kl={"beta": 0.02, "placement": "reward"})
    _ppo_cfg(tmp_path, group_size=1)                              # the critic needs no group


def _first_step(tmp_path, steps=1, **kw) -> dict:
    """Train PPO steps (constant lr, no warm-up: the step's lr is lr) -> the parameters."""
    from grpo_lab.training.trainer import train
    seen = {}
    train(_ppo_cfg(tmp_path, steps=steps, eval_size=0, warmup_steps=0, lr_schedule="constant",
                   kl={"beta": 0.0}, **kw), progress=False,
          on_step=lambda m, p: seen.update({n: t.detach().clone()
                                            for n, t in p.named_parameters()}))
    return seen


def _base_params() -> dict:
    policy = load_policy("data/base_policy.safetensors")
    return {n: p.detach() for n, p in policy.named_parameters()}


def test_vf_lr_changes_the_critics_step_and_nothing_else(tmp_path):
    base = _base_params()
    same = _first_step(tmp_path / "a", lr=1e-4)                   # vf_lr 0: the critic at lr
    own = _first_step(tmp_path / "b", lr=1e-4, ppo={"vf_lr": 3e-3})
    head = {n for n in same if n.startswith("value_head.")}
    assert head == {"value_head.proj.weight", "value_head.proj.bias"} and set(own) == set(same)
    for n in set(same) - head:                          # the policy's step does not see vf_lr
        assert torch.equal(own[n], same[n]), n
        assert not torch.equal(same[n], base[n]), n                # and it did move
    # Adam's first step from the head's zero init: m = g, v = g^2, so each weight moves by
    # lr * g / (|g| + eps), i.e. by lr (|g| >> eps here) and by vf_lr with its own group
    for n in head:
        torch.testing.assert_close(same[n].abs(), torch.full_like(same[n], 1e-4))
        torch.testing.assert_close(own[n], same[n] * 30)


def test_lr_scales_bad_input():
    from grpo_lab.distributed.exchanges import AdamW, ExchangeConfig, make_sharded, param_groups
    head = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 1))
    groups, scales = param_groups(head, {"1.": 5.0})
    assert [len(g) for g in groups] == [2, 2] and scales == [1.0, 5.0]
    assert groups[1][0] is head[1].weight
    with pytest.raises(ValueError, match="lr_scales prefix 'value_head.' names no parameter"):
        param_groups(head, {"value_head.": 2.0})
    with pytest.raises(ValueError, match="exchange 'sharded' steps one learning rate"):
        make_sharded(head, ExchangeConfig(name="sharded"), AdamW(lr_scales={"1.": 5.0}), 1, 0)


def test_explained_variance_by_hand():
    ret = torch.tensor([[1.0, 2.0, 9.0], [3.0, 4.0, 9.0]])
    m = torch.tensor([[True, True, False], [True, True, False]])          # var(1, 2, 3, 4) = 1.25
    assert explained_variance(ret, ret, m) == pytest.approx(1.0)                # perfect critic
    assert explained_variance(torch.full_like(ret, 7.0), ret, m) == pytest.approx(0.0)  # constant
    assert explained_variance(torch.zeros_like(ret), torch.full_like(ret, 1.5), m) == 0.0  # flat


def test_value_network_on_the_policys_body_equals_the_head():
    # equivalence: a ValueNetwork whose body is the policy itself and whose head has the
    # ValueHead's weights gives the same values (the two critics differ only in the body)
    import random
    from grpo_lab.algorithm.critic import logprobs_and_values
    from grpo_lab.policies.model import ValueNetwork
    torch.manual_seed(0)
    policy = load_policy("data/base_policy.safetensors").eval()
    exs = sample_examples([get_task("addition")], 4, random.Random(0))
    r = sample(policy, [encode(e.prompt) for e in exs], 2, 5, 0.7,
               generator=torch.Generator().manual_seed(0))
    head = ValueHead(policy.cfg.n_embd)
    torch.nn.init.normal_(head.proj.weight)
    net = ValueNetwork(policy)
    net.head.load_state_dict(head.state_dict())
    with torch.no_grad():
        a = logprobs_and_values(_with(policy, head), r)
        b = logprobs_and_values(_with(policy, net), r)
    for x, y in zip(a, b):
        torch.testing.assert_close(x, y)
    assert a[2].abs().sum() > 0


def _with(policy, critic):
    """The policy's forward with ``critic`` as its value head (a thin wrapper, no copy)."""
    class P(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.policy, self.value_head = policy, critic

        def forward(self, *a, **kw):
            return self.policy(*a, **kw)
    return P()


def test_ppo_with_a_critic_network_trains_both_networks(tmp_path):
    from grpo_lab.policies.policy import load_policy_any
    from grpo_lab.policies.model import ValueNetwork
    # two steps: the head starts at zero, so the critic's body gets its first gradient in step 1
    seen = _first_step(tmp_path, steps=2, ppo={"critic": "network", "vf_lr": 1e-3}, lr=1e-4)
    base = _base_params()
    body = {n[len("value_head.body."):]: t for n, t in seen.items()
            if n.startswith("value_head.body.")}
    assert set(body) == set(base) and {n for n in seen if not n.startswith("value_head.")} == \
        set(base)                                      # a whole second GPT, the policy's shape
    for n, t in base.items():                          # both moved off the base, differently
        assert not torch.equal(seen[n], t) and not torch.equal(body[n], t), n
        assert not torch.equal(seen[n], body[n]), n
    # the body's one Adam step at vf_lr, from zero moments after a zero gradient in step 0:
    # m_hat = .1 g / (1 - .9^2), v_hat = .001 g^2 / (1 - .999^2), so a weight moves by
    # vf_lr * .5263 / .7069 = .7445 vf_lr (|g| >> eps), well past lr's 1e-4
    moved = max(float((body[n] - t).abs().max()) for n, t in base.items())
    assert moved == pytest.approx(0.7445e-3, rel=1e-3), moved
    loaded = load_policy_any(tmp_path / "run" / "checkpoint.safetensors")
    assert isinstance(loaded.value_head, ValueNetwork)
    torch.testing.assert_close(loaded.value_head.body.wte.weight, body["wte.weight"])
