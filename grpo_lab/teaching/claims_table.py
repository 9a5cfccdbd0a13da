"""The claims list rendered: each claim's measurement (a ``live`` row's computed now), the
verdict counts, the rows notebook 08 shows (``table``, ``html_table``) and ``data/claims.md``
(``markdown``, written by ``python -m grpo_lab.teaching.claims``).
"""
from __future__ import annotations

from grpo_lab.teaching.claims_data import CLAIMS, VERDICTS
from grpo_lab.teaching.claims_live import LIVE
from grpo_lab.teaching.claims_seeds import NOT_COUNTED, SEEDS, WRITE_UPS, coverage


def measure(number: int) -> str:
    """The measurement of one claim as text: a ``live`` row's computation
    (``claims_live.LIVE``) run now, after any bench figures it quotes; ``measured`` otherwise."""
    c = CLAIMS[number - 1]
    if not c.live:
        return c.measured
    now = LIVE[c.live]()
    quoted = c.measured[:-len(now)] if c.measured.endswith(now) else ""   # the bench part, if any
    return quoted + now


def counts() -> dict:
    """{verdict: number of verdicts} over ``VERDICTS``: a row counts once, or once per figure
    where its figures have verdicts of their own (``Claim.parts``)."""
    kinds = [v for c in CLAIMS for v in ([p[1] for p in c.parts] or [c.verdict])]
    return {v: kinds.count(v) for v in VERDICTS}


def table(live: bool = True) -> list[dict]:
    """One row per claim: {number, claim, scale, measured, verdict, why, remember, source};
    ``live=False`` shows every row's stored ``measured`` (no computation)."""
    return [{"number": c.number, "claim": c.claim, "scale": c.scale,
             "measured": measure(c.number) if live else c.measured, "verdict": c.verdict_text, "kind": c.verdict,
             "why": c.why, "remember": c.remember, "source": c.source} for c in CLAIMS]


_COLOURS = {"holds": "#d8f0d8", "does not hold": "#f6d5d5", "holds only as": "#fbeccb",
            "cannot be tested here": "#e6e6e6", "open": "#d9e6f6"}
_WIDTHS = {"#": "3%", "claim": "19%", "scale": "5%", "measured here": "21%", "verdict": "15%",
           "why": "22%", "remember": "15%"}


def _kind(verdict_text: str) -> str:
    return next(v for v in VERDICTS[::-1] if verdict_text.startswith(v))   # "holds" tried last


def html_table(rows: list[dict]) -> str:
    """``table()`` rows -> one HTML table: fixed column widths, wrapped text, the verdict cell
    coloured by kind, the measurement's source in small grey under it."""
    from html import escape
    style = "text-align:left;vertical-align:top;white-space:normal;overflow-wrap:anywhere;padding:4px"
    head = "".join(f'<th style="width:{w};text-align:left">{escape(h)}</th>' for h, w in _WIDTHS.items())
    body = []
    for r in rows:
        kind = r.get("kind") or _kind(r["verdict"])
        verdict = (f'<b>{escape(kind)}</b>{escape(r["verdict"][len(kind):])}' if r["verdict"].startswith(kind)
                   else escape(r["verdict"]))                               # per figure: as written
        source = f'<br><span style="color:#777;font-size:90%">{escape(r["source"])}</span>' if r["source"] else ""
        cells = [(str(r["number"]), style), (escape(r["claim"]), style), (escape(r["scale"]), style),
                 (escape(r["measured"]) + source, style),
                 (verdict, f"{style};background:{_COLOURS[kind]}"),
                 (escape(r["why"]), style), (f'<i>{escape(r["remember"])}</i>', style)]
        body.append("<tr>" + "".join(f'<td style="{st}">{c}</td>' for c, st in cells) + "</tr>")
    return ('<table style="table-layout:fixed;width:100%;font-size:12px;border-collapse:collapse">'
            f"<tr>{head}</tr>{''.join(body)}</table>")


def markdown() -> str:
    """The list as markdown (``data/claims.md``): one table row per claim, then each claim's why,
    source and sentence to remember. Uses the stored measurements: no computation."""
    cell = lambda s: s.replace("|", "\\|")                                  # noqa: E731
    cov = coverage(len(CLAIMS))
    lines = ["# Claims about \"GRPO\" from popular write-ups, and what this workbench measured", "",
             "Rendered from `grpo_lab/teaching/claims.py` by `python -m grpo_lab.teaching.claims > data/claims.md` "
             "(tests/test_claims.py checks that this file is up to date and that every number below "
             "is in the file it is quoted from). Scale: toy (a CPU toy can test it), sim (a cost model "
             "only), no (not testable), fact (a definition or arithmetic settles it). Notebook 08 "
             "shows the same table with the cheap measurements computed live.", "",
             f"Seed claims with a row: {cov['with_row']} of the {cov['total']} checkable claims of the five write-ups "
             "(each numbered by write-up and claim in reading order and mapped to its rows at the end of this file, "
             "from `grpo_lab/teaching/claims_seeds.py`).", "",
             "Verdicts: " + ", ".join(f"{v} {n}" for v, n in counts().items()) + " (a row whose figures have "
             "verdicts of their own counts once per figure).", "",
             "| # | claim as written | scale | what a fair test looks like | measured here | verdict |",
             "|---|---|---|---|---|---|"]
    lines += [f"| {c.number} | {cell(c.claim)} | {c.scale} | {cell(c.fair_test)} | {cell(c.measured)} | "
              f"**{cell(c.verdict_text)}** |" for c in CLAIMS]
    lines += ["", "## Why, and where each number comes from", ""]
    for c in CLAIMS:
        lines += [f"**{c.number}.** {c.why} *{c.remember}*" + (f" Source: {c.source}." if c.source else ""), ""]
    lines += ["## The write-ups' claims, one by one", "",
              "Five write-ups: " + "; ".join(WRITE_UPS.values()) + ". Their checkable claims in reading order, "
              "with the rows above that settle each; the last column names a part that a row measuring the rest "
              "leaves unmeasured (rows 41-53 and the other \"cannot be tested here\" rows measure nothing).", "",
              "| claim | in short | row(s) | part not measured |", "|---|---|---|---|"]
    lines += [f"| {s.id} | {cell(s.words)} | {', '.join(map(str, s.rows))} | {cell(s.note)} |" for s in SEEDS]
    lines += ["", "Read but not counted (advice, plans, background, or nothing to be true or false about): "
              + "; ".join(f"{w}: {text}" for w, text in NOT_COUNTED) + ".", ""]
    return "\n".join(lines)

