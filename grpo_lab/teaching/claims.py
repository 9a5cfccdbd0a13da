"""Claims about "GRPO" from popular write-ups: this workbench's measurement and a verdict.

Popular write-ups mix GRPO (Group Relative Policy Optimization, DeepSeekMath, Shao et al. 2024,
arXiv 2402.03300: G completions per prompt, the group's mean/std as the baseline, no critic)
with invented systems claims. This module is the list (``CLAIMS``, the repository's copy;
``data/claims.md`` is rendered from it by ``python -m grpo_lab.teaching.claims``): each ``Claim`` holds

  * the claim as written, its scale (toy: a CPU toy can test it; sim: only a cost model; no: not
    testable; fact: settled by a definition or arithmetic) and what a fair test looks like;
  * ``measured``: the measurement, as a sentence with its numbers. Every number in it, in
    ``why`` and in ``qualifier`` comes from ``quotes`` (file, exact text: a bench result, or the
    code's own arithmetic) or, for a ``live`` row, from the measurement computed now
    (``claims_live.LIVE``, the registry of cheap measurements); tests/test_claims.py checks
    both, so a re-run bench that moves a number breaks the test instead of leaving a stale row;
  * ``verdict``: one of ``VERDICTS``; "holds only as" takes ``qualifier`` (as what), "open"
    takes ``qualifier`` too (what would settle it); ``why`` and ``remember`` (one sentence).

One rule for every complexity or saving claim: the verdict judges the total (work, bytes,
memory); what each device or part does is reported beside it as what it is. A comparison
between two methods is judged on one scale for every claim that reads the same data: the
ratio, with the 95% t-interval of its logarithm over paired seeds.

The rows answer five write-ups: ``claims_seeds.SEEDS`` numbers their 72 checkable claims by
write-up and claim in reading order ("0.1" ... "4.15") with the rows that settle each, and
data/claims.md's header states how many have a row. Notebook 08 renders the table and
re-computes the cheap measurements live.
"""
from __future__ import annotations

# two modules hold it: claims_data.py (Claim, VERDICTS, CLAIMS: the records, data only) and
# claims_table.py (measure, counts, table, html_table, markdown: rendering)
from grpo_lab.teaching.claims_data import CLAIMS, VERDICTS, Claim
from grpo_lab.teaching.claims_table import counts, html_table, markdown, measure, table

__all__ = ["Claim", "VERDICTS", "CLAIMS", "measure", "counts", "table", "html_table", "markdown"]

if __name__ == "__main__":
    print(markdown(), end="")
