"""bench/bench_agents_trl.py hands grpo_lab's episodes to TRL's rollout_func: the lists it
builds, worked out by hand (TRL itself is a bench dependency, not needed here)."""
from pathlib import Path

import torch

from grpo_lab.algorithm.rollout import Rollout
from scripts import load_script

ROOT = Path(__file__).resolve().parent.parent
bench = load_script("bench/bench_agents_trl.py")


def test_rows_of_unpads_and_flags_the_environment_tokens():
    # row 0: prompt [7, 8] left-padded; action 5, '=' 6, observation 9 9, action 4, <eos> 1
    # row 1: prompt [3, 7, 8]; action 2, <eos> 1, then padding
    r = Rollout(torch.tensor([[0, 7, 8], [3, 7, 8]]),
                torch.tensor([[False, True, True], [True, True, True]]),
                torch.tensor([[5, 6, 9, 9, 4, 1], [2, 1, 0, 0, 0, 0]]),
                torch.tensor([[True] * 6, [True, True, False, False, False, False]]),
                torch.tensor([[-.5, -.25, 0., 0., -1., -2.], [-.75, -.125, 0., 0., 0., 0.]]),
                torch.tensor([0, 0]), torch.tensor([True, True]),
                loss_mask=torch.tensor([[True, True, False, False, True, True],
                                        [True, True, False, False, False, False]]))
    out = bench.rows_of(r)
    assert out["prompt_ids"] == [[7, 8], [3, 7, 8]]
    assert out["completion_ids"] == [[5, 6, 9, 9, 4, 1], [2, 1]]
    assert out["logprobs"] == [[-.5, -.25, 0., 0., -1., -2.], [-.75, -.125]]
    assert out["env_mask"] == [[1, 1, 0, 0, 1, 1], [1, 1]]      # TRL's tool_mask: 0 = not trained
