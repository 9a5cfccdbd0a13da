"""Training: the config, one step, the one loop, and what runs the loop.

``config`` (one dataclass per concern) -> ``step`` (collect, then the objective; ``ranks`` keeps
the multi-rank bookkeeping out of its way; ``ppo`` is the critic's objective) -> ``trainer`` (the
loop and its setup; ``pretrain`` is its supervised preset) -> ``report`` (a run's figure and
summary), ``experiments`` (strategies x seeds), ``reward_model`` (a learned reward, as a
plugin), ``overlap_timing`` (backward overlapped with the exchange, on the toy).
"""
