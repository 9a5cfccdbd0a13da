"""ipywidgets explorers: thin views over the library's functions.

Each factory returns ``(box, parts)``: the container to display and a dict of its parts,
so tests and notebooks can drive a widget without a browser (observers fire synchronously).
"""
