"""Agents: multi-turn GRPO with tools and environments (issue 47).

    environments.py  environments and tools as records (reset / step / state_key, a turn
                     limit, AgentSettings), their errors as observations or named failures
    episodes.py      the multi-turn rollout: G episodes per prompt, the KV cache kept across
                     turns, the observation tokens masked out of the loss
    credit.py        credit assignment records: episode-level, GiGPO's anchor-state step groups,
                     MT-GRPO's turn-level advantages
    games.py         the shipped environments: guess the number (guess, guess4), add_tool
    step.py          objective "agent": the step's collect for episodes, evaluation
    adapters.py      the field's environments through one adapter: OpenEnv's Environment
                     interface and TextArena's games (the optional extra grpo_lab[openenv])

Importing ``agents.step`` registers the shipped environments and the objective (config.py
does, as it builds a TrainConfig).
"""
