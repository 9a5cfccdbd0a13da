"""ipywidgets explorers: thin views over the library's functions.

Each factory returns ``(box, parts)``: the container to display and a dict of its parts,
so tests and notebooks can drive a widget without a browser (observers fire synchronously).
"""


def show_figure(fig) -> None:
    """Display a matplotlib figure as a PNG image, then close it.

    A widget that displays a bare ``Figure`` shows ``<Figure size ... with N Axes>`` unless
    pyplot's inline backend happens to be active (it depends on what the notebook imported
    first), and ``plt.show()`` draws nothing under Agg. A PNG renders whatever the backend;
    closing the figure keeps the inline backend from drawing it a second time, outside the
    widget. Call it inside ``with output_widget:``.
    """
    from io import BytesIO

    import matplotlib.pyplot as plt
    from IPython.display import Image, display

    buf = BytesIO()
    fig.savefig(buf, format="png", bbox_inches="tight")
    plt.close(fig)                                          # no-op for a figure pyplot never saw
    display(Image(data=buf.getvalue(), format="png"))
