"""grpo_lab: a notebook-first workbench for GRPO (DeepSeekMath, Shao et al. 2024).

The core is a set of small modules, one idea each (see README "Architecture"):
``model`` (toy char-level GPT), ``tasks`` (verifiable tasks and rewards), ``rollout``
(group sampling with a shared prompt KV cache), ``advantages`` (group-relative
estimators), ``loss`` (the clipped GRPO objective), ``trainer`` (one plain loop).
"""
import os

__version__ = "0.1.0"


def quick_mode() -> bool:
    """True when ``GRPO_LAB_QUICK=1``: notebooks and demos shrink to CI size."""
    return os.environ.get("GRPO_LAB_QUICK", "0") not in ("", "0", "false", "False")
