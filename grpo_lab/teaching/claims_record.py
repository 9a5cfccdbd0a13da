"""One claim about "GRPO" as a record: ``Claim`` (its fields), ``VERDICTS`` and how a verdict is
written (``verdict_text``). claims.py says what each field means and the rules the verdicts
follow; the records themselves are in claims_data.py and claims_more.py."""
from __future__ import annotations

from dataclasses import dataclass, field

VERDICTS = ("holds", "does not hold", "holds only as", "cannot be tested here", "open")


@dataclass(frozen=True)
class Claim:
    number: int
    claim: str          # as written in the write-ups
    scale: str          # toy | sim | sim/no | no | fact | toy (partly)
    fair_test: str      # what a fair test looks like
    verdict: str        # one of VERDICTS
    qualifier: str      # "holds only as ...": as what; "open": what would settle it
    why: str
    remember: str       # one sentence a learner keeps
    measured: str       # the measurement, with its numbers
    source: str         # where ``measured`` comes from: a bench file and its command, or a function
    quotes: tuple = field(default=())   # ((file, exact text in it), ...) backing every number
    live: str = ""      # a key of claims_live.LIVE: computed when the table is shown
    # a claim of several figures whose verdicts differ: ((figure, verdict, qualifier), ...), the
    # first one's verdict and qualifier repeated in ``verdict`` and ``qualifier`` (what counts
    # and colours the row)
    parts: tuple = field(default=())

    @property
    def verdict_text(self) -> str:
        if self.parts:
            return "; ".join(f"{figure}: {verdict_text(v, q)}" for figure, v, q in self.parts)
        return verdict_text(self.verdict, self.qualifier)


def verdict_text(verdict: str, qualifier: str) -> str:
    """One verdict as the table writes it: "holds only as" + as what, "open: settled by" + what."""
    if verdict == "holds only as":
        return f"holds only as {qualifier}"
    if verdict == "open":
        return f"open: settled by {qualifier}"
    return verdict
