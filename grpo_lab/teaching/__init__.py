"""Teaching: the widgets the notebooks show, the workshop's exercises, and the claims table.

``widgets`` (ipywidgets explorers, one per mechanism), ``exercises`` (each learner-facing check;
``exercise_harness`` runs a learner's function and judges it), ``claims`` (popular claims about
GRPO beside this workbench's measurement; ``claims_data`` holds them, ``claims_table`` renders
them), ``workshop`` (what a workshop room runs).
"""
