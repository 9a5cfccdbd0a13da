"""The optional math_verify reward (grpo_lab/tasks/math_reward.py): never imported on the
default path; a clear install hint without math-verify; with it, answers compared as math."""
import importlib.util
import subprocess
import sys

import pytest

from grpo_lab.tasks import Example

HAS_MV = importlib.util.find_spec("math_verify") is not None


@pytest.fixture(autouse=True)
def _unregister():
    """Importing the plugin registers the reward: take it out again for the other tests."""
    yield
    from grpo_lab.tasks.rewards import REWARDS
    REWARDS.pop("math_verify", None)


def test_default_path_never_imports_math_verify():
    code = ("import sys, grpo_lab.training.config, grpo_lab.training.trainer; "
            "print('math_verify' in sys.modules, 'grpo_lab.tasks.math_reward' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]


@pytest.mark.skipif(HAS_MV, reason="math-verify is installed: the missing-package hint cannot show")
def test_without_math_verify_the_reward_says_what_to_install():
    from grpo_lab.registry import load_plugins
    (mod,) = load_plugins("grpo_lab.tasks.math_reward")       # imports without math-verify
    with pytest.raises(ImportError, match=r'pip install -e "\.\[math\]"'):
        mod.math_verify_reward(["1"], [Example("q", "1", "word_problems", fmt="boxed")], [True])


@pytest.mark.skipif(not HAS_MV, reason='needs pip install -e ".[math]"')
def test_math_verify_reward_by_hand():
    from grpo_lab.tasks.math_reward import math_verify_reward
    ex = [Example("q", "0.5", "word_problems", fmt="boxed")] * 4
    done = [True, True, True, False]
    got = math_verify_reward(["so \\boxed{\\frac{1}{2}}", "it is 1/3", "$0.50$", "\\boxed{0.5}"],
                             ex, done)
    assert got == [1.0, 0.0, 1.0, 0.0]           # 1/2 = 0.5 = 0.50; 1/3 wrong; not stopped: 0
