"""Completions of real length (issue 40): the tiny HF model writing 1,024 tokens a completion,
scored by the shipped rewards on hostile text a model in a repetition loop writes (tags and
boxes never closed, parentheses, spaces), finishes its step in bounded time. Before the linear
readers, 4,000 characters of repeated ``\\boxed{`` alone took 0.8 s a call and 4x a doubling."""
import json
import shutil
from pathlib import Path

from grpo_lab.training.config import preset
from grpo_lab.training.trainer import train

ROOT = Path(__file__).resolve().parent.parent

HOSTILE = '''
from grpo_lab.tasks.rewards import register_reward
from grpo_lab.tasks.rewards import accuracy_reward, format_reward

LOOP = "<answer>" * 2000 + "\\\\boxed{" * 2000 + "(" * 8000 + " " * 8000   # 46,000 characters

@register_reward("hostile")
def hostile(completions, examples, stopped):
    texts = [c + LOOP for c in completions]
    return [a + f for a, f in zip(accuracy_reward(texts, examples, stopped),
                                  format_reward(texts, examples, stopped))]
'''


def test_a_step_of_1024_token_completions_on_hostile_text_is_bounded(tmp_path):
    model = tmp_path / "tiny"
    shutil.copytree(ROOT / "data" / "hf_tiny", model)
    config = json.loads((model / "config.json").read_text())
    config["max_position_embeddings"] = 2048             # RoPE: any length; the check reads this
    (model / "config.json").write_text(json.dumps(config))
    tok = json.loads((model / "tokenizer_config.json").read_text())
    tok["eos_token"] = "<pad>"                           # a token it never samples: no early stop
    (model / "tokenizer_config.json").write_text(json.dumps(tok))
    (tmp_path / "hostile.py").write_text(HOSTILE)
    history = train(preset("hf_tiny_cpu", base_checkpoint=str(model), out_dir=str(tmp_path / "run"),
                           threads=1, steps=1, max_new_tokens=1024, prompts_per_step=2,
                           group_size=2, eval_size=0, answer_format="boxed",
                           reward_weights={"accuracy": 1.0, "format": 0.5, "hostile": 1.0},
                           plugins=str(tmp_path / "hostile.py")), progress=False)
    step = history[-1]
    assert step["completion/mean_len"] == 1024.0
    # 4 completions of 1,024 tokens plus 46,000 hostile characters each, through every reader:
    # 0.015 s measured; a quadratic reader needs minutes here
    assert step["time/score_s"] < 5.0, step["time/score_s"]
