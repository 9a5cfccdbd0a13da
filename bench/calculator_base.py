"""Base held-out accuracy of SmolLM2-135M-Instruct on the calculator task, greedy, with and
without the tool: python bench/calculator_base.py N (the first N held-out questions)."""
import sys, time, torch
sys.path.insert(0, "bench")
from bench_calculator import held_out_eval, SYSTEM
from grpo_lab.policies.hf import load_hf_policy
torch.set_num_threads(2)
n = int(sys.argv[1])
t = time.time()
m = load_hf_policy("smollm2-135m", chat_template=True)
m.cfg.system_prompt = SYSTEM
r, rows = held_out_eval(m, "calculator", n, samples=3)
print("with tool", n, r, f"{time.time()-t:.0f}s", rows, flush=True)
m.cfg.system_prompt = ""
r, rows = held_out_eval(m, "calculator_plain", n, samples=2)
print("without tool", n, r, f"{time.time()-t:.0f}s", rows, flush=True)
