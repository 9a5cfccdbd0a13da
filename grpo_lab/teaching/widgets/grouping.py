"""Grouping explorers: (a) how prompts fall into groups and what that does to advantages,
(b) one GRPO step on the toy policy, walked stage by stage.

Pure computation is ``explore_grouping`` and ``grpo_step_stages``; the widgets wire
controls to them and draw with plain matplotlib.

Rewards in the grouping explorer are *real*, not simulated: by default G = 4 completions
per prompt sampled once from the shipped base policy (``base_rollout_rewards``, seeded,
cached per process) over ``data/mixture.jsonl``. The base was pretrained on addition,
sort and reverse only, so those families score high and count, compare, max and min
low: that spread of difficulty across families is what the groupers act on. Pass your
own ``rewards`` (N = B*G, row i from prompt i // G) to explore other data.
"""
from __future__ import annotations

import functools
import html

import ipywidgets as W
import matplotlib.pyplot as plt
import numpy as np
import torch

from grpo_lab.algorithm.advantages import (ADVANTAGES, COMBINE, advantage_diagnostics,
                                           group_stats, grouped_advantages,
                                           reward_group_diagnostics)
from grpo_lab.training.config import TrainConfig
from grpo_lab.algorithm.embeddings import EMBEDDERS, get_embedder
from grpo_lab.algorithm.grouping import GROUPERS, PromptBatch, cluster_diagnostics, get_grouper
from grpo_lab.tasks.task_data import DATA_DIR, load_mixture
from grpo_lab.tasks import Example, get_task, sample_examples
from grpo_lab.tasks.rewards import resolve_rewards
from grpo_lab.teaching.widgets import show_figure

BASE = str(DATA_DIR / "base_policy.safetensors")    # absolute: kernels may run in notebooks/
WEIGHTS = TrainConfig().reward_weights                          # the trainer's default


@functools.lru_cache(maxsize=1)
def _base_policy(path: str = BASE):
    from grpo_lab.policies.model import load_policy
    return load_policy(path).eval()


@functools.lru_cache(maxsize=4)
def _cached_rollout_rewards(prompts: tuple, answers: tuple, tasks: tuple, G: int, seed: int,
                            temperature: float) -> tuple:
    from grpo_lab.algorithm.rollout import sample_and_score
    examples = [Example(p, a, t, answer_chars=get_task(t).answer_chars)
                for p, a, t in zip(prompts, answers, tasks)]
    s = sample_and_score(_base_policy(), examples, G, 8, resolve_rewards(WEIGHTS), temperature,
                         generator=torch.Generator().manual_seed(seed))
    return tuple(s.rewards.tolist())


def base_rollout_rewards(examples, G: int = 4, seed: int = 0, temperature: float = 0.7):
    """Rewards (N = B*G,) of G completions per example sampled from the base policy
    (seeded; cached per process, so widgets and tests pay for it once)."""
    key = tuple(zip(*[(e.prompt, e.answer, e.task) for e in examples]))
    return torch.tensor(_cached_rollout_rewards(*key, G, seed, temperature))


def project_2d(X: np.ndarray, seed: int = 0) -> np.ndarray:
    """Embeddings (B, d) -> (B, 2) by PCA (centred SVD), for plotting only; fewer than 2
    prompts or dimensions: their columns, zero-padded (nothing to project)."""
    from sklearn.decomposition import PCA
    X = np.asarray(X, dtype=np.float64)
    if min(X.shape) < 2:
        return np.pad(X[:, :2], ((0, 0), (0, 2 - X[:, :2].shape[1])))
    return PCA(2, random_state=seed).fit_transform(X)


def _check_rewards(rewards: torch.Tensor, B: int, G: int) -> None:
    if rewards.shape != (B * G,):
        raise ValueError(f"rewards of shape {tuple(rewards.shape)} for {B} prompts x G={G}: "
                         f"expected ({B * G},)")


def explore_grouping(prompts, tasks, rewards: torch.Tensor, G: int, X: np.ndarray,
                     strategy: str = "kmeans_semantic", k: int = 7, combine: str = "cluster",
                     estimator: str = "grpo", seed: int = 0) -> dict:
    """Group B prompts with the grouper ``strategy`` (a ``GROUPERS`` name, record or function)
    on embeddings X (B, d), then compute the
    advantages of their B*G rewards -> dict of plain numbers (what the widget draws)."""
    B = len(prompts)
    _check_rewards(rewards, B, G)
    prompt_index = torch.arange(B).repeat_interleave(G)                   # (N,)
    batch = PromptBatch(list(prompts), list(tasks), X, rewards=rewards, prompt_index=prompt_index)
    ids = get_grouper(strategy)(batch, k, seed)                           # (B,) k if it takes k
    adv = grouped_advantages(ids, prompt_index, rewards, combine, estimator)  # (N,)
    row_ids = torch.as_tensor(ids)[prompt_index]                          # (N,)
    _, count, g_mean, g_std = group_stats(rewards, row_ids)               # (K,) each
    return {"ids": ids.tolist(), "advantages": adv.tolist(), "rewards": rewards.tolist(),
            "group_mean": g_mean.tolist(), "group_std": g_std.tolist(),
            "group_size": count.tolist(),
            **reward_group_diagnostics(rewards, row_ids),
            **advantage_diagnostics(adv, prompt_index),
            **cluster_diagnostics(list(prompts), ids, list(tasks), X)}


def grouping_explorer(prompts=None, tasks=None, rewards=None, G: int = 4, n: int = 140,
                      embedder: str = "tfidf", k: int = 7, strategy: str = "kmeans_semantic",
                      combine: str = "cluster", estimator: str = "grpo", seed: int = 0):
    """-> (box, parts). parts: "embedder", "strategy", "k", "combine", "estimator" controls,
    "summary" (HTML), "plot" (Output), "data" (the latest ``explore_grouping`` result plus
    "xy", the 2-D projection). Defaults: the first ``n`` prompts of data/mixture.jsonl with
    base-policy rewards (module docstring)."""
    if prompts is None:
        exs = load_mixture()[:n]
        prompts, tasks = [e.prompt for e in exs], [e.task for e in exs]
        rewards = base_rollout_rewards(exs, G, seed) if rewards is None else rewards
    if tasks is None or rewards is None:
        raise ValueError("with your own prompts, pass tasks (one label per prompt) and "
                         "rewards (B*G,) as well")
    prompts, tasks = list(prompts), list(tasks)
    if len(tasks) != len(prompts):
        raise ValueError(f"{len(tasks)} task labels for {len(prompts)} prompts")
    rewards = torch.as_tensor(rewards, dtype=torch.float32)
    _check_rewards(rewards, len(prompts), G)                              # fail before drawing
    parts: dict = {
        "embedder": W.Dropdown(options=sorted(EMBEDDERS), value=embedder, description="embedder"),
        "strategy": W.Dropdown(options=list(GROUPERS), value=strategy, description="strategy"),
        "k": W.IntSlider(value=k, min=1, max=min(20, len(prompts)), description="k groups",
                         continuous_update=False),
        "combine": W.Dropdown(options=list(COMBINE), value=combine, description="combine"),
        "estimator": W.Dropdown(options=list(ADVANTAGES), value=estimator,
                                description="estimator"),
        "summary": W.HTML(), "plot": W.Output(), "data": {},
    }
    embeddings: dict = {}

    def embed(name):
        if name not in embeddings:
            fn = get_embedder(name, model=_base_policy()) if name == "policy" else get_embedder(name)
            X = fn(prompts)                                                # (B, d)
            embeddings[name] = (X, project_2d(X, seed))
        return embeddings[name]

    def update(_=None):
        parts["k"].disabled = not get_grouper(parts["strategy"].value).takes_k  # k unread
        parts["data"].clear()                            # no stale result from the last strategy
        try:
            X, xy = embed(parts["embedder"].value)
            d = explore_grouping(prompts, tasks, rewards, G, X, parts["strategy"].value,
                                 parts["k"].value, parts["combine"].value,
                                 parts["estimator"].value, seed)
        except (ImportError, ValueError) as e:                             # e.g. minilm missing
            parts["summary"].value = f"<b>cannot group:</b> {html.escape(str(e))}"
            parts["plot"].clear_output()
            return
        parts["data"].update(d, xy=xy.tolist())
        parts["summary"].value = _summary_html(d)
        with parts["plot"]:
            parts["plot"].clear_output(wait=True)
            _plot(d, xy, tasks)
            show_figure(plt.gcf())

    for name in ("embedder", "strategy", "k", "combine", "estimator"):
        parts[name].observe(update, names="value")
    update()
    controls = W.HBox([W.VBox([parts["embedder"], parts["strategy"], parts["k"]]),
                       W.VBox([parts["combine"], parts["estimator"]])])
    return W.VBox([controls, parts["summary"], parts["plot"]]), parts


def _summary_html(d: dict) -> str:
    keys = [["group/purity", "group/silhouette", "group/within_var"],
            ["group/zero_std_frac", "adv/var", "adv/between_prompt_frac"]]
    fmt = lambda v: "n/a" if v != v else f"{v:.3f}"                        # NaN: undefined
    cells = lambda ks: "".join(f"<td>{k}</td><td><b>{fmt(d[k])}</b></td>" for k in ks)
    rows = [f"<td>groups</td><td><b>{len(d['group_size'])}</b></td>" + cells(keys[0]),
            "<td></td><td></td>" + cells(keys[1])]
    return "<table>" + "".join(f"<tr>{r}</tr>" for r in rows) + "</table>"


def _plot(d: dict, xy: np.ndarray, tasks):
    fig, (a1, a2, a3) = plt.subplots(1, 3, figsize=(9, 3.4), layout="constrained")  # notebook width
    ids = np.asarray(d["ids"])
    families = sorted(set(tasks))
    for t, marker in zip(families, "osD^v<>PX*hd" * 3):     # marker = family, colour = group
        m = np.asarray(tasks) == t
        a1.scatter(xy[m, 0], xy[m, 1], c=ids[m] % 20, cmap="tab20", vmin=0, vmax=19, s=18,
                   marker=marker, label=t)
    legend = fig.legend(*a1.get_legend_handles_labels(), loc="outside lower center",
                        ncols=min(7, len(families)), fontsize=9, frameon=False)
    for h in legend.legend_handles:                     # the legend names the family, not a group
        h.set_color("0.4")
    a1.set(title="prompts (PCA of embeddings), colour = group", xticks=[], yticks=[])
    a2.scatter(d["group_mean"], d["group_std"], s=8 + 2 * np.asarray(d["group_size"]),
               alpha=0.6)
    a2.set(title="groups: reward mean vs std (size = rows)", xlabel="mean reward",
           ylabel="std of rewards")
    a3.hist(d["advantages"], bins=30)
    a3.set(title=f"advantages (var {d['adv/var']:.2f})", xlabel="advantage", ylabel="rows")
    for a in (a1, a2, a3):
        a.title.set_fontsize(9)
        a.tick_params(labelsize=9)
        a.xaxis.label.set_fontsize(9)
        a.yaxis.label.set_fontsize(9)


# ---------------------------------------------------------------- one GRPO step, stage by stage
STAGES = ("rollout", "rewards", "groups", "advantages", "loss")


def grpo_step_stages(policy, examples, G: int = 4, grouping: str = "kmeans_semantic",
                     k: int = 2, combine: str = "cluster", estimator: str = "grpo",
                     temperature: float = 0.7, max_new_tokens: int = 8, beta: float = 0.0,
                     seed: int = 0, task: str = "mixture") -> dict:
    """One GRPO step's intermediate values, computed by the trainer's own two halves
    (``step.collect`` on these examples, then ``step.grpo_objective``) -> {stage: dict}. No
    optimizer step is taken; the loss stage reports the gradient norm that step would use
    (on-policy: ratio 1, reference = the policy itself)."""
    import dataclasses

    from grpo_lab.training.config import preset
    from grpo_lab.training.trainer import setup

    cfg = preset("quick", task=task, prompts_per_step=len(examples), group_size=G,
                 grouping=grouping, group={"k": min(k, len(examples)), "combine": combine},
                 advantage=estimator, temperature=temperature, max_new_tokens=max_new_tokens,
                 kl={"beta": beta}, seed=seed, reward_weights=dict(WEIGHTS))
    run = setup(cfg)                          # the trainer's grouper and objective
    ctx = dataclasses.replace(run.ctx, draw=lambda rng, n: list(examples), ref=policy)
    batch = run.objective.collect(policy, cfg, 0, ctx)
    s, r, adv = batch.scored, batch.scored.rollout, batch.advantages
    rows = [s.examples[i] for i in r.prompt_index.tolist()]
    policy.zero_grad(set_to_none=True)
    loss, stats = run.objective.loss(policy, batch, cfg)
    loss.backward()
    gnorm = torch.sqrt(sum((p.grad ** 2).sum() for p in policy.parameters() if p.grad is not None))
    policy.zero_grad(set_to_none=True)
    prompts, tasks = [e.prompt for e in s.examples], [e.task for e in s.examples]
    ids = batch.cluster_ids.tolist()                                       # (B,)
    return {
        "rollout": {"prompts": prompts, "texts": s.texts, "prompt_index": r.prompt_index.tolist(),
                    "completion_ids": r.completion_ids.tolist(), "logprobs": r.logprobs.tolist(),
                    "stopped": r.stopped.tolist()},
        "rewards": {"rewards": s.rewards.tolist(), "answers": [e.answer for e in rows],
                    **{f"reward/{n}": v.tolist() for n, v in s.parts.items()}},
        "groups": {"cluster_ids": [int(i) for i in ids], "tasks": tasks,
                   "group_ids": torch.as_tensor(ids)[r.prompt_index].tolist()},
        "advantages": {"advantages": adv.tolist(), **advantage_diagnostics(adv)},
        "loss": {"loss": loss.item(), "grad_norm": float(gnorm), **stats},
    }


def grpo_step_explorer(policy=None, task: str = "mixture", B: int = 4, G: int = 4,
                       grouping: str = "kmeans_semantic", k: int = 2, seed: int = 0):
    """-> (box, parts). parts: "next" and "new_batch" buttons, "grouping" dropdown,
    "stage" (IntText: index into STAGES of the stage shown), "view" (HTML of that stage),
    "data" (``grpo_step_stages`` result for the current batch). Each "next" reveals the
    following stage of the same step; "new_batch" draws new prompts and starts over."""
    from grpo_lab.tasks import MIXTURE_TASKS
    policy = policy if policy is not None else _base_policy()
    tasks = [get_task(t) for t in (MIXTURE_TASKS if task == "mixture" else task.split(","))]
    parts: dict = {
        "next": W.Button(description="next stage"), "new_batch": W.Button(description="new batch"),
        "grouping": W.Dropdown(options=list(GROUPERS), value=grouping, description="grouping"),
        "stage": W.IntText(value=0, description="stage", disabled=True),
        "view": W.HTML(), "data": {}, "batch": [seed],
    }

    def compute(_=None):
        import random
        exs = sample_examples(tasks, B, random.Random(f"explorer-{parts['batch'][0]}"))
        parts["data"].clear()
        parts["data"].update(grpo_step_stages(policy, exs, G, parts["grouping"].value, k,
                                              seed=parts["batch"][0], task=task))
        parts["stage"].value = 0
        show()

    def show():
        i = parts["stage"].value
        parts["view"].value = _stage_html(parts["data"], i, G)
        parts["next"].disabled = i >= len(STAGES) - 1

    def on_next(_):
        parts["stage"].value = min(parts["stage"].value + 1, len(STAGES) - 1)
        show()

    def on_new(_):
        parts["batch"][0] += 1
        compute()

    parts["next"].on_click(on_next)
    parts["new_batch"].on_click(on_new)
    parts["grouping"].observe(compute, names="value")
    compute()
    return W.VBox([W.HBox([parts["next"], parts["new_batch"], parts["grouping"]]),
                   parts["view"]]), parts


def _stage_html(d: dict, stage: int, G: int) -> str:
    """The stages up to ``stage`` as one table row per completion (N = B*G)."""
    ro, rw, gr, ad = d["rollout"], d["rewards"], d["groups"], d["advantages"]
    cols = ["row", "prompt", "completion (sampled)", "sum log-prob"]
    cols += ["answer", "reward"] if stage >= 1 else []
    cols += ["group id"] if stage >= 2 else []
    cols += ["advantage"] if stage >= 3 else []
    rows = []
    for i, p in enumerate(ro["prompt_index"]):
        cells = [str(i), ro["prompts"][p], repr(ro["texts"][i]) + ("" if ro["stopped"][i] else " (cut)"),
                 f"{sum(ro['logprobs'][i]):.2f}"]
        if stage >= 1:
            cells += [rw["answers"][i], f"{rw['rewards'][i]:.2f}"]
        if stage >= 2:
            cells.append(str(gr["group_ids"][i]))
        if stage >= 3:
            cells.append(f"{ad['advantages'][i]:+.3f}")
        rows.append("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in cells) + "</tr>")
    notes = [f"<b>stage {stage + 1}/{len(STAGES)}: {STAGES[stage]}</b> "
             f"({len(ro['prompt_index']) // G} prompts x G={G})"]
    if stage >= 3:
        notes.append(f"adv/var = {ad['adv/var']:.3f}")
    if stage >= 4:
        lo = d["loss"]
        notes.append(f"loss = {lo['loss']:+.1e}, gradient norm = {lo['grad_norm']:.4f}, "
                     f"clip/ratio_mean = {lo['clip/ratio_mean']:.3f}. On-policy the ratio is 1, "
                     f"so the loss is about -mean(A) = 0, but its gradient is not: each "
                     f"completion's log-probability is pushed by its advantage")
    table = ("<table><tr>" + "".join(f"<th>{c}</th>" for c in cols) + "</tr>"
             + "".join(rows) + "</table>")
    return "<p>" + "<br>".join(notes) + "</p>" + table
