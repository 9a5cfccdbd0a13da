"""grpo_lab: a notebook-first workbench for GRPO (DeepSeekMath, Shao et al. 2024).

The folders name the parts (docs/reference/architecture.md), top to bottom:
``teaching/`` (widgets, exercises, the claims table) and ``cli``; ``training/`` (the config, one
step, the one loop); ``algorithm/`` (rollout, grouping, advantages, the loss), ``policies/`` (the
toy GPT, any HF causal LM), ``tasks/`` (verifiable tasks and their rewards); ``distributed/``
(gradient exchange, sharding, compression, topology); and at the top level the floor every part
stands on (checkpoint files, paths, the registry helpers, errors, the char tokenizer).

``LAYERS`` is the architecture as data, top to bottom: a module imports only modules of its
own layer or a lower one (counting imports written inside functions), and the import graph
has no cycle (tests/test_imports.py builds it from the source and checks both).
"""
import os

__version__ = "0.1.0"

# (layer, modules): a name ending in ".*" stands for every module of that sub-package
LAYERS = (
    ("teaching and the command line", ("cli", "teaching", "teaching.*")),
    ("harnesses around the loop: reports, experiments, the learned reward, overlap timing",
     ("training.report", "training.experiments", "training.power", "training.sequential",
      "training.workers", "training.placement", "training.reward_model",
      "training.overlap_timing")),
    ("the loop and its setup", ("training", "training.trainer", "training.pretrain",
                                "training.speed_probe")),
    ("one step: collect and the objectives; the config and its tracker sinks",
     ("training.step", "training.async_rollout", "training.ppo", "training.ppo_config", "training.speed_config",
      "training.dynamic_config", "training.pretrain_config", "training.config",
      "training.saved_config", "training.trackers", "training.config_file", "training.trl_keys",
      "agents.step")),
    ("mechanisms: the algorithm, policies, tasks and rewards, environments",
     ("algorithm", "algorithm.*", "policies", "policies.*", "tasks", "tasks.*", "agents",
      "agents.environments", "agents.episodes", "agents.credit", "agents.games",
      "agents.warmup", "agents.quick", "agents.adapters", "agents.calculator")),
    ("distributed: gradient exchange, sharding, compression, topology",
     ("distributed", "distributed.*")),
    ("the floor: file formats, paths, the registry helpers, the machine, the user-code time limit",
     ("", "paths", "models", "registry", "checkpoint", "tokenizer", "machine", "rundir",
      "errors", "tables", "timelimit")),
)


def quick_mode() -> bool:
    """True when ``GRPO_LAB_QUICK=1``: notebooks and demos shrink to CI size."""
    return os.environ.get("GRPO_LAB_QUICK", "0") not in ("", "0", "false", "False")
