"""Plugins known by resolved path and content hash (registry.py): an edited file is executed
again with its registrations replaced (notebook 06's workflow), same-named files in two folders
are two plugins, name-then-path is one plugin, and a resume with other plugin code is refused
unless overridden."""
import json
import sys
import textwrap

import numpy as np
import pytest

from grpo_lab.training.config import preset
from grpo_lab.algorithm.grouping import GROUPERS, PromptBatch, get_grouper
from grpo_lab.registry import PluginReloaded, load_plugins, plugin_digests
from grpo_lab.tasks.rewards import REWARDS
from grpo_lab.training.trainer import train

GROUPER = """
import numpy as np
from grpo_lab.algorithm.grouping import register_grouper
from grpo_lab.tasks.rewards import register_reward

@register_grouper("{name}", takes_k=False)
def chunks(batch, seed=0):
    return np.arange(len(batch.prompts)) // {size}

@register_reward("{reward}")
def bonus(completions, examples, stopped):
    return [0.0] * len(completions)
"""


def write(path, name, size, reward):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(GROUPER.format(name=name, size=size, reward=reward))


def test_an_edited_plugin_is_executed_again_with_its_registrations_replaced(tmp_path):
    f = tmp_path / "edit_me.py"
    write(f, "edited_chunks", 2, "edited_bonus_v1")
    load_plugins(str(f))
    batch = PromptBatch([f"{i}+1=" for i in range(8)])
    assert get_grouper("edited_chunks")(batch, 1).tolist() == [0, 0, 1, 1, 2, 2, 3, 3]
    load_plugins(str(f))                                        # unchanged: not executed again
    write(f, "edited_chunks", 4, "edited_bonus_v2")             # the notebook rewrites the file
    with pytest.warns(PluginReloaded, match="changed since it was loaded .*executed again"):
        load_plugins(str(f))
    assert get_grouper("edited_chunks")(batch, 1).tolist() == [0, 0, 0, 0, 1, 1, 1, 1]
    assert "edited_bonus_v2" in REWARDS and "edited_bonus_v1" not in REWARDS   # replaced
    f.write_text("def broken(:\n")                              # a broken edit: an error, and
    with pytest.raises(ValueError, match="could not be imported: SyntaxError"):
        load_plugins(str(f))
    assert "edited_chunks" in GROUPERS and "edited_bonus_v2" in REWARDS     # the last good code


def test_same_file_name_in_two_folders_both_load(tmp_path):
    a, b = tmp_path / "a" / "plug.py", tmp_path / "b" / "plug.py"
    write(a, "stem_a", 2, "stem_reward_a")
    write(b, "stem_b", 3, "stem_reward_b")
    ma, mb = load_plugins(f"{a},{b}")
    assert ma is not mb and {"stem_a", "stem_b"} <= set(GROUPERS)
    assert {"stem_reward_a", "stem_reward_b"} <= set(REWARDS)
    assert set(plugin_digests(f"{a},{b}")) == {str(a.resolve()), str(b.resolve())}


@pytest.mark.parametrize("order", ["name_then_path", "path_then_name"])
def test_a_plugin_by_name_and_by_path_is_one_plugin(tmp_path, monkeypatch, order):
    mod = f"idem_{order}"
    f = tmp_path / f"{mod}.py"
    f.write_text(textwrap.dedent(f"""
        import os
        from grpo_lab.tasks.rewards import register_reward
        with open(os.path.join(os.path.dirname(__file__), "runs.txt"), "a") as log:
            log.write("x")
        @register_reward("{mod}_r")
        def r(completions, examples, stopped):
            return [0.0] * len(completions)
        """))
    monkeypatch.syspath_prepend(str(tmp_path))
    specs = [mod, str(f)] if order == "name_then_path" else [str(f), mod]
    first = load_plugins(specs[0])[0]
    second = load_plugins(specs[1])[0]                     # no "already registered" error
    assert first is second and (tmp_path / "runs.txt").read_text() == "x"   # executed once
    sys.modules.pop(mod, None)


def test_resume_with_other_plugin_code_is_refused_unless_overridden(tmp_path):
    f = tmp_path / "run_plugin.py"
    write(f, "resume_chunks", 4, "resume_bonus")
    kw = dict(plugins=str(f), grouping="resume_chunks", steps=4, eval_size=10, threads=1,
              out_dir=str(tmp_path / "run"))
    train(preset("quick", time_budget_s=1e-9, **kw), progress=False)          # stops after step 0
    first = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[0])
    assert first["plugins/sha256"] == plugin_digests(str(f))          # the code the run used
    write(f, "resume_chunks", 8, "resume_bonus")                      # edited after the run
    with pytest.warns(PluginReloaded):
        load_plugins(str(f))
    c = preset("quick", time_budget_s=0.0, **kw)
    with pytest.raises(ValueError, match="plugin code differs .*--override"):
        train(c, resume=True, progress=False)
    h = train(c, resume=True, progress=False, allow_override=True)
    assert [r["step"] for r in h] == [-1, 0, 1, 2, 3]
    old, new = h[2]["resume/overrides"]["plugins/sha256"]
    assert old == first["plugins/sha256"] and new == plugin_digests(str(f)) and old != new
