"""add_retry with GiGPO's step groups, as another environment (tests/test_agents.py)."""
from grpo_lab.agents.environments import with_settings

with_settings("add_retry", "add_retry_gigpo", credit="gigpo")
