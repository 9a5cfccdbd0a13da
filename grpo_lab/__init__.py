"""grpo_lab: a notebook-first workbench for GRPO (DeepSeekMath, Shao et al. 2024).

The core is a set of small modules, one idea each (see README "Architecture"):
``model`` (toy char-level GPT), ``tasks`` (verifiable tasks and rewards), ``rollout``
(group sampling with a shared prompt KV cache), ``advantages`` (group-relative
estimators), ``loss`` (the clipped GRPO objective), ``step`` (one step: collect, objective),
``trainer`` (one plain loop).

``LAYERS`` is the architecture as data, top to bottom: a module imports only modules of its
own layer or a lower one (counting imports written inside functions), and the import graph
has no cycle (tests/test_imports.py builds it from the source and checks both).
"""
import os

__version__ = "0.1.0"

# (layer, modules): a name ending in ".*" stands for every module of that sub-package
LAYERS = (
    ("teaching, CLI, reports, harnesses",
     ("cli", "widgets", "widgets.*", "exercises", "exercise_harness", "exercise_advantages",
      "exercise_loss", "exercise_grouper", "exercise_topk", "claims", "claims_data", "claims_table",
      "claims_measure", "claims_gradient", "claims_bytes", "claims_systems", "claims_stats",
      "claims_live", "workshop",
      "report", "reward_model", "experiments", "overlap_timing")),
    ("trainer: the one loop and its setup", ("trainer", "pretrain")),
    ("step: collect and the objectives; the config", ("step", "ranks", "ppo", "config")),
    ("mechanisms: policies, tasks and rewards, rollout, grouping, advantages, loss",
     ("scoring", "samples", "health", "tasks", "rewards", "task_data", "answers", "instruct",
      "word_problems", "countdown", "model", "hf", "policy", "critic", "rollout", "embeddings",
      "grouping", "group_advantages", "group_diagnostics", "reclustering", "advantages",
      "loss", "overlong", "memory")),
    ("distributed: gradient exchange, sharding, compression, topology",
     ("distributed", "distributed.*")),
    ("file formats, paths, the machine",
     ("", "paths", "models", "registry", "checkpoint", "tokenizer", "machine", "rundir",
      "errors", "tables")),
)


def quick_mode() -> bool:
    """True when ``GRPO_LAB_QUICK=1``: notebooks and demos shrink to CI size."""
    return os.environ.get("GRPO_LAB_QUICK", "0") not in ("", "0", "false", "False")
