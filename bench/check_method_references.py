"""Each method name against the reference's own code, not a transcription of it: TRL 1.16's
``GRPOTrainer._compute_loss`` (CISPO) and the ``vllm_importance_sampling_mode`` block of its
``_generate_and_score_completions`` (the four IS modes), verl's ``compute_policy_loss_cispo``
(trainer/ppo/core_algos.py), ``compute_rollout_correction_weights`` and
``compute_rollout_rejection_mask`` (trainer/ppo/rollout_corr_helper.py). Neither library is
installed: TRL's method is compiled alone from its source (it reads only torch and ``self``,
whose attributes are set here; the model forward is replaced by the log-probs), TRL's IS block
is run verbatim on the log-prob difference, and verl's modules are loaded from its source with
their framework imports (tensordict, omegaconf, its config classes) stubbed.

    python bench/check_method_references.py --trl /path/to/trl-1.16.0-py3-none-any.whl \\
        --verl /path/to/verl-checkout [--cases 300] [--out bench/RESULTS_method_references.md]

tests/test_method_references.py checks the same names against the formulas written out; this
script shows those transcriptions are the references' code. float64, seeded random cases.
"""
from __future__ import annotations

import argparse
import ast
import importlib.util
import math
import sys
import tempfile
import textwrap
import types
import zipfile
from collections import defaultdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from grpo_lab.algorithm.loss import Clip, grpo_loss  # noqa: E402
from grpo_lab.algorithm.token_weights import is_weight  # noqa: E402

D = torch.float64


def cases(seed: int, n: int, rows: int = 3, T: int = 5):
    """(generator, log-ratios (rows, T), advantages (rows,), mask (rows, T)), n of them; one in
    ten has a log-ratio of +-25, past verl's +-20 clamp."""
    g = torch.Generator().manual_seed(seed)
    for _ in range(n):
        log_r = torch.randn(rows, T, generator=g, dtype=D) * float(torch.rand((), generator=g)) * 2
        if torch.rand((), generator=g) < 0.1:
            log_r[0, 0] = 25.0 * torch.sign(torch.randn((), generator=g, dtype=D))
        A = torch.randn(rows, generator=g, dtype=D)
        mask = torch.arange(T)[None] < torch.randint(1, T + 1, (rows,), generator=g)[:, None]
        yield g, log_r, A, mask


def agree(a, b, scale) -> bool:
    return bool(torch.allclose(a, b, rtol=0, atol=1e-12 * max(1.0, scale)))


def grpo_lab_cispo(log_r, A, mask, **kw):
    logp = log_r.clone().requires_grad_(True)
    loss, _ = grpo_loss(logp, torch.zeros_like(log_r), A, mask, Clip(**kw), aggregation="token_mean",
                        policy_loss="cispo")
    loss.backward()
    return loss.detach(), logp.grad


# ---- TRL 1.16

def trl_sources(trl: Path) -> str:
    if trl.suffix == ".whl":
        with zipfile.ZipFile(trl) as z:
            return z.read("trl/trainer/grpo_trainer.py").decode()
    return (trl / "trl/trainer/grpo_trainer.py").read_text()


def trl_compute_loss(src: str):
    tree = ast.parse(src)
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "GRPOTrainer")
    fn = next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "_compute_loss")
    ns = {"torch": torch, "math": math, "nanmin": torch.min, "nanmax": torch.max}
    exec(compile(ast.Module([fn], []), "trl/trainer/grpo_trainer.py", "exec"), ns)
    return ns["_compute_loss"]


class _Accelerator:                  # one process: gather and reduce are the identity
    num_processes, sync_gradients = 1, True

    def gather(self, x):
        return x
    gather_for_metrics = gather

    def reduce(self, x, reduction="sum"):
        return x


def trl_cispo(compute_loss, log_r, A, mask, epsilon_high):
    lp = log_r.clone().requires_grad_(True)
    self = types.SimpleNamespace(
        loss_type="cispo", aux_loss_enabled=False, top_entropy_quantile=1.0,
        off_policy_mask_threshold=None, importance_sampling_level="token", beta=0.0,
        epsilon_high=epsilon_high, epsilon_low=0.2, use_vllm=False, accelerator=_Accelerator(),
        model=types.SimpleNamespace(training=True), _metrics={"train": defaultdict(list)},
        _entropy_bonus_enabled=False, current_gradient_accumulation_steps=1,
        args=types.SimpleNamespace(delta=None, use_bias_correction_kl=False, steps_per_generation=1),
        _get_per_token_logps_and_entropies=lambda *a, **k: (lp, torch.zeros_like(lp), None))
    n, T = log_r.shape
    inputs = {"prompt_ids": torch.zeros(n, 1, dtype=torch.long), "prompt_mask": torch.ones(n, 1),
              "completion_ids": torch.zeros(n, T, dtype=torch.long),
              "completion_mask": mask.to(D), "advantages": A,
              "old_per_token_logps": torch.zeros_like(log_r),
              "num_items_in_batch": mask.sum().to(D)}
    loss = compute_loss(self, None, inputs)
    loss.backward()
    return loss.detach(), lp.grad * mask


def trl_is_block(src: str):
    """The lines of _generate_and_score_completions from ``mask = completion_mask ...`` to the
    mode ladder's raise, compiled as they are."""
    lines = src.splitlines()
    i = next(i for i, l in enumerate(lines) if "sequence_level_is = self.vllm_importance" in l)
    start = next(j for j in range(i, 0, -1) if lines[j].strip().startswith("mask = completion_mask"))
    end = next(j for j in range(i, len(lines)) if "Possible values are 'token_truncate'" in lines[j])
    return compile(textwrap.dedent("\n".join(lines[start:end + 2])), "trl grpo_trainer.py", "exec")


# ---- verl

def load_verl(root: Path):
    def stub(name, **attrs):
        m = types.ModuleType(name)
        m.__dict__.update(attrs)
        sys.modules[name] = m

    class Any_:
        def __init__(self, *a, **k):
            pass

    class ActorConfig:
        def __init__(self, low, high):
            self.clip_ratio_low, self.clip_ratio_high, self.clip_ratio = low, high, 0.2
            self.global_batch_info = {}
    for name, attrs in {
            "tensordict": {"TensorDict": Any_}, "omegaconf": {"DictConfig": Any_, "open_dict": None},
            "verl": {}, "verl.utils": {"as_torch_index": None, "group_mean_std": None},
            "verl.utils.device": {"get_device_name": lambda: "cpu", "get_torch_device": lambda: torch.cpu},
            "verl.utils.import_utils": {"deprecated": lambda *a, **k: (lambda f: f)},
            "verl.protocol": {"DataProto": Any_}, "verl.trainer": {},
            "verl.trainer.config": {"AlgoConfig": Any_},
            "verl.trainer.config.algorithm": {"RolloutCorrectionConfig": Any_},
            "verl.workers": {}, "verl.workers.config": {"ActorConfig": ActorConfig},
            "verl.workers.config.actor": {"PolicyLossConfig": Any_}}.items():
        stub(name, **attrs)

    def load(name, rel):
        spec = importlib.util.spec_from_file_location(name, root / rel)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
        return mod
    sys.modules["verl.utils"].torch_functional = load("verl.utils.torch_functional",
                                                      "verl/utils/torch_functional.py")
    core = load("verl.trainer.ppo.core_algos", "verl/trainer/ppo/core_algos.py")
    rch = load("verl.trainer.ppo.rollout_corr_helper", "verl/trainer/ppo/rollout_corr_helper.py")
    return core, rch, ActorConfig


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trl", type=Path, required=True, help="TRL 1.16's wheel or source root")
    ap.add_argument("--verl", type=Path, required=True, help="a verl checkout's root")
    ap.add_argument("--cases", type=int, default=300)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--sources", default="", help="a line naming the versions read")
    a = ap.parse_args(argv)
    N, rows = a.cases, []
    src = trl_sources(a.trl)
    compute_loss, block = trl_compute_loss(src), trl_is_block(src)
    core, rch, ActorConfig = load_verl(a.verl)

    same = old = 0
    for g, lr, A, m in cases(1, N):
        e, lr = 1.0 + 5.0 * float(torch.rand((), generator=g)), lr.clamp(-20, 20)
        want, scale = trl_cispo(compute_loss, lr, A, m, e), float((lr.abs() * A.abs()[:, None]).max()) * e
        got, was = grpo_lab_cispo(lr, A, m, cispo_cap=e), grpo_lab_cispo(lr, A, m, cispo_cap=1 + e)
        same += agree(got[0], want[0], scale) and agree(got[1], want[1], scale)
        old += agree(was[0], want[0], scale) and agree(was[1], want[1], scale)
    rows.append(("`cispo`, `clip.cispo_cap e`", "TRL `_compute_loss`, loss_type cispo, "
                 "epsilon_high e in [1, 6]", same, f"the cap 1 + e (before): {old}/{N}"))
    same = nofloor = 0
    for g, lr, A, m in cases(2, N):
        low, high = 0.1 + 0.3 * float(torch.rand((), generator=g)), 0.28
        lp = lr.clone().requires_grad_(True)
        loss, _ = core.compute_policy_loss_cispo(torch.zeros_like(lr), lp, A[:, None].expand_as(lr),
                                                 m.to(D), "token-mean", ActorConfig(low, high))
        loss.backward()
        scale = float((lr.abs().clamp(max=25) * A.abs()[:, None]).max()) * (1 + high)
        got = grpo_lab_cispo(lr, A, m, cispo_cap=1 + high, cispo_floor=1 - low, log_ratio_clamp=20.0)
        same += agree(got[0], loss.detach(), scale) and agree(got[1], lp.grad * m, scale)
        no = grpo_lab_cispo(lr, A, m, cispo_cap=1 + high, log_ratio_clamp=20.0)
        nofloor += agree(no[0], loss.detach(), scale)
    rows.append(("`cispo`, `cispo_cap 1+h`, `cispo_floor 1-l`, `log_ratio_clamp 20`",
                 "verl `compute_policy_loss_cispo`, token-mean", same,
                 f"without the floor: {nofloor}/{N}"))
    for name in ("token", "sequence", "seq_mean_k1"):
        same = 0
        for g, lw, _, m in cases(10 + len(name), N):
            cap = 1.0 + 2.0 * float(torch.rand((), generator=g))
            if name == "seq_mean_k1":
                want, _ = rch.compute_rollout_rejection_mask(lw, m.to(D), rollout_rs=name,
                                                             rollout_rs_threshold=cap)
            else:
                want, _ = rch.compute_rollout_correction_weights(lw, m.to(D), rollout_is=name,
                                                                 rollout_is_threshold=cap)
            same += agree(is_weight(name, lw, torch.zeros_like(lw), m, cap), want, cap)
        ref = ("`compute_rollout_rejection_mask`, rollout_rs seq_mean_k1 (the modified mask)"
               if name == "seq_mean_k1" else f"`compute_rollout_correction_weights`, rollout_is {name}")
        rows.append((f"`tis.level {name}`", f"verl {ref}", same, ""))
    for mode in ("token_truncate", "sequence_truncate", "token_mask", "sequence_mask"):
        same = before = 0
        for g, lw, _, m in cases(10 + len(mode), N):
            cap = 1.0 + 2.0 * float(torch.rand((), generator=g))
            floor = 0.5 * float(torch.rand((), generator=g))
            env = {"torch": torch, "math": math, "old_per_token_logps": lw,
                   "sampling_per_token_logps": torch.zeros_like(lw), "completion_mask": m.to(D),
                   "tool_mask": None, "self": types.SimpleNamespace(
                       vllm_importance_sampling_mode=mode, vllm_importance_sampling_clip_max=cap,
                       vllm_importance_sampling_clip_min=floor or None)}
            exec(block, env)
            want = env["vllm_importance_sampling_ratio"].expand_as(lw) * m     # the loss's mask
            same += agree(is_weight(mode, lw, torch.zeros_like(lw), m, cap, floor), want, cap)
            before += agree(is_weight("seq_mean_k1", lw, torch.zeros_like(lw), m, cap), want, cap)
        rows.append((f"`tis.level {mode}`, `tis.floor F`", f"TRL vllm_importance_sampling_mode "
                     f"{mode}, clip_min F", same, "" if mode != "sequence_mask" else
                     f"what the name computed before (now seq_mean_k1): {before}/{N}"))
    lines = [f"# Method names against the references' own code ({N} random cases each, float64)",
             "", "`python bench/check_method_references.py --trl TRL_1.16_WHEEL --verl VERL_ROOT`",
             "", *([a.sources, ""] if a.sources else []), "| grpo_lab | reference (its code) | agree | the other convention |",
             "|---|---|---|---|"]
    lines += [f"| {a_} | {b} | {c}/{N} | {d} |" for a_, b, c, d in rows]
    text = "\n".join(lines) + "\n"
    print(text)
    if a.out:
        a.out.write_text(text)
    return 0 if all(r[2] == N for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
