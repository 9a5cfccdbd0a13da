"""Widgets show their figures as PNG images, whatever matplotlib backend is active."""
import matplotlib
import matplotlib.pyplot as plt
import pytest
from matplotlib.figure import Figure

from grpo_lab.teaching import widgets


@pytest.fixture
def shown(monkeypatch):
    out = []
    monkeypatch.setattr("IPython.display.display", lambda *objs: out.extend(objs))
    return out


@pytest.mark.parametrize("pyplot", [False, True], ids=["bare Figure", "pyplot figure"])
def test_show_figure_displays_a_png_and_closes_the_figure(pyplot, shown):
    fig = plt.figure() if pyplot else Figure()
    fig.subplots().plot([0, 1], [1, 0])
    widgets.show_figure(fig)
    (img,) = shown
    assert img.data[:8] == b"\x89PNG\r\n\x1a\n" and len(img.data) > 1000
    if pyplot:                                          # closed: inline will not redraw it
        assert fig.number not in plt.get_fignums()


def test_show_figure_works_under_agg(shown):
    backend = matplotlib.get_backend()
    plt.switch_backend("agg")                           # plt.show() would draw nothing here
    try:
        widgets.show_figure(plt.figure())
    finally:
        plt.switch_backend(backend)
    assert shown and shown[0].format == "png"


@pytest.mark.parametrize("module", ["advantage", "grouping", "sharder", "compression",
                                    "compression_pays"])
def test_no_widget_displays_a_bare_figure(module):
    """The widget modules route every figure through show_figure (no plt.show, no
    display(fig)): the browser test catches a `<Figure size` text as well."""
    import importlib
    import inspect
    src = inspect.getsource(importlib.import_module(f"grpo_lab.teaching.widgets.{module}"))
    assert "plt.show()" not in src and "display(_figure" not in src
    assert "show_figure(" in src
