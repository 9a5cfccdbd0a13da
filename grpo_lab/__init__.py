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

``MOVED``: the flat module names of release 0.1 (``grpo_lab.step``, ``grpo_lab.widgets``, ...)
still import, for one release, as aliases of the same module objects in their folders (so a
monkeypatch through either name patches both), with a ``FutureWarning`` naming the new path.
"""
import importlib
import importlib.abc
import importlib.util
import os
import sys
import warnings

__version__ = "0.1.0"

# (layer, modules): a name ending in ".*" stands for every module of that sub-package
LAYERS = (
    ("teaching and the command line", ("cli", "teaching", "teaching.*")),
    ("harnesses around the loop: reports, experiments, the learned reward, overlap timing",
     ("training.report", "training.experiments", "training.power", "training.reward_model",
      "training.overlap_timing")),
    ("the loop and its setup", ("training", "training.trainer", "training.pretrain")),
    ("one step: collect and the objectives; the config and its tracker sinks",
     ("training.step", "training.ranks", "training.ppo", "training.config",
      "training.trackers", "training.config_file")),
    ("mechanisms: the algorithm, policies, tasks and rewards",
     ("algorithm", "algorithm.*", "policies", "policies.*", "tasks", "tasks.*")),
    ("distributed: gradient exchange, sharding, compression, topology",
     ("distributed", "distributed.*")),
    ("the floor: file formats, paths, the registry helpers, the machine, the user-code time limit",
     ("", "paths", "models", "registry", "checkpoint", "tokenizer", "machine", "rundir",
      "errors", "tables", "timelimit")),
)

# release 0.1's flat module names -> their folder (one-release aliases, see the docstring)
MOVED = {
    **dict.fromkeys(("advantages", "group_advantages", "group_diagnostics", "grouping",
                     "reclustering", "embeddings", "loss", "overlong", "rollout", "scoring",
                     "samples", "health", "critic"), "algorithm"),
    **dict.fromkeys(("model", "hf", "policy", "memory"), "policies"),
    **dict.fromkeys(("rewards", "task_data", "answers", "instruct", "word_problems",
                     "countdown"), "tasks"),
    **dict.fromkeys(("trainer", "pretrain", "step", "ranks", "ppo", "config", "report",
                     "experiments", "reward_model", "overlap_timing"), "training"),
    **dict.fromkeys(("widgets", "exercises", "exercise_harness", "exercise_advantages",
                     "exercise_loss", "exercise_grouper", "exercise_topk", "claims",
                     "claims_data", "claims_table", "claims_measure", "claims_gradient",
                     "claims_bytes", "claims_systems", "claims_stats", "claims_live",
                     "workshop"), "teaching"),
}


def new_name(name: str) -> str | None:
    """``grpo_lab.step`` -> ``grpo_lab.training.step`` (and ``grpo_lab.widgets.x`` ->
    ``grpo_lab.teaching.widgets.x``); None for a name that did not move."""
    head, _, rest = name.partition(".")
    first, _, tail = rest.partition(".")
    if head != __name__ or first not in MOVED:
        return None
    return f"{__name__}.{MOVED[first]}.{first}" + (f".{tail}" if tail else "")


def _importer_level() -> int:
    """The ``stacklevel`` of the first frame outside the import system: the line that imported."""
    frame, level = sys._getframe(1), 1
    while frame is not None and (frame.f_code.co_filename.startswith("<frozen importlib")
                                 or frame.f_code.co_filename == __file__):
        frame, level = frame.f_back, level + 1
    return level


class _MovedFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports an old flat name as the very module object of its new path (not a copy: one
    module, one registry, one monkeypatch target); ``python -m <old name>`` runs it too."""

    def find_spec(self, name, path=None, target=None):
        real = new_name(name)
        if real is None:
            return None
        spec = importlib.util.spec_from_loader(name, self, origin=real)
        found = importlib.util.find_spec(real)
        if found is not None and found.submodule_search_locations is not None:
            spec.submodule_search_locations = list(found.submodule_search_locations)
        return spec

    def create_module(self, spec):
        warnings.warn(f"{spec.name} is now {spec.origin}; the old name is an alias for one "
                      f"release", FutureWarning, stacklevel=_importer_level())
        module = importlib.import_module(spec.origin)
        spec.loader_state = module.__spec__
        return module

    def exec_module(self, module):
        # the import system stamped the alias's spec on the module: give it back its own
        module.__spec__ = module.__spec__.loader_state

    def get_code(self, name):                    # runpy: ``python -m grpo_lab.claims``
        real = new_name(name)
        return importlib.util.find_spec(real).loader.get_code(real)


if not any(isinstance(f, _MovedFinder) for f in sys.meta_path):
    sys.meta_path.insert(0, _MovedFinder())


def quick_mode() -> bool:
    """True when ``GRPO_LAB_QUICK=1``: notebooks and demos shrink to CI size."""
    return os.environ.get("GRPO_LAB_QUICK", "0") not in ("", "0", "false", "False")
