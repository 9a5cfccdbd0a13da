"""The algorithm: group sampling, rewards judged within a group, and the GRPO loss.

``rollout`` (G completions per prompt, the prompt's KV cache computed once; decoded and
rewarded by ``sample_and_score``) -> ``grouping`` / ``reclustering`` / ``embeddings`` (which
completions share a baseline) -> ``advantages`` (the group-relative estimators, a cluster's
baseline) -> ``loss`` (the clipped objective) and ``overlong`` (cut-off completions).
``critic`` is the part GRPO drops (PPO's GAE and value loss); ``health``, ``samples`` and
``advantages``' diagnostics say what a step did.
"""
