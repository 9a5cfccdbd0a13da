"""The compression explorer, driven without a browser through its parts."""
import torch

from grpo_lab.distributed.compression import trace_step
from grpo_lab.teaching.widgets.compression import compression_explorer


def test_controls_drive_the_numbers():
    box, parts = compression_explorer(seed=0, plots=False)
    ratio = float(parts["ratio"].value)
    parts["density"].value = 0.01                       # fewer kept entries: a higher ratio
    assert float(parts["ratio"].value) > 3 * ratio
    bits = parts["bits"].value
    parts["codec"].value = "raw_int32"
    assert parts["bits"].value.startswith("32.00 bits/index") and parts["bits"].value != bits
    fp8 = parts["fp8"].value
    parts["format"].value = "e5m2"
    assert parts["fp8"].value.startswith("e5m2") and parts["fp8"].value != fp8


def test_step_carries_the_residual_and_reset_clears_it():
    x = torch.randn(8, 16, generator=torch.Generator().manual_seed(1))
    box, parts = compression_explorer(x, plots=False)
    parts["density"].value = 0.1
    assert parts["steps"].value.startswith("step 0: residual L2 0")
    parts["step"].click()
    expect = trace_step(x, None, 0.1, "e4m3", "huffman")["residual"].norm()
    assert parts["steps"].value == f"step 1: residual L2 {float(expect):.3g}"
    parts["step"].click()
    assert parts["steps"].value.startswith("step 2")
    parts["reset"].click()
    assert parts["steps"].value.startswith("step 0: residual L2 0")


def test_plots_build(capsys):
    box, parts = compression_explorer(torch.randn(100), plots=True)   # a 1-D tensor shows as a row
    parts["density"].value = 0.2
    assert "display.Image object" in capsys.readouterr().out  # a PNG; outside a kernel display() prints it
