"""Small result tables for notebooks: an HTML table in JupyterLab, aligned text elsewhere.

``Table(rows)`` takes a list of dicts (one per row, keys are the columns) and shows as an HTML
table when it is a cell's last value, and as aligned plain text when printed; numbers are
formatted with ``fmt``. ``Table.from_dict({name: value})`` makes a two-column table of a dict, so
a notebook never shows a raw dict as its result. No pandas: it is not a dependency.
"""
from __future__ import annotations

from html import escape
from numbers import Number


class Table:
    def __init__(self, rows: list[dict], columns: list[str] | None = None, fmt: str = ".4g"):
        self.rows = list(rows)
        self.columns = list(columns) if columns is not None else list(
            dict.fromkeys(k for r in self.rows for k in r))
        self.fmt = fmt

    @classmethod
    def from_dict(cls, d: dict, key: str = "name", value: str = "value", fmt: str = ".4g"):
        """{name: value} -> a two-column table; a dict value becomes one column per key."""
        rows = [{key: k, **v} if isinstance(v, dict) else {key: k, value: v} for k, v in d.items()]
        return cls(rows, fmt=fmt)

    def _cell(self, v) -> str:
        if v is None:
            return ""
        if isinstance(v, Number) and not isinstance(v, bool):
            return format(v, self.fmt) if isinstance(v, float) else str(v)
        if isinstance(v, (list, tuple)):
            return "[" + ", ".join(self._cell(x) for x in v) + "]"
        return str(v)

    def cells(self) -> list[list[str]]:
        """The body as strings, one list per row, in column order."""
        return [[self._cell(r.get(c)) for c in self.columns] for r in self.rows]

    def __str__(self) -> str:
        body = self.cells()
        widths = [max([len(c)] + [len(r[i]) for r in body]) for i, c in enumerate(self.columns)]
        right = [all(isinstance(r.get(c), Number) or r.get(c) is None for r in self.rows)
                 for c in self.columns]
        line = lambda cells: "  ".join(                                   # noqa: E731
            s.rjust(w) if rt else s.ljust(w) for s, w, rt in zip(cells, widths, right)).rstrip()
        return "\n".join([line(self.columns), line(["-" * w for w in widths])] +
                         [line(r) for r in body])

    __repr__ = __str__

    def _repr_html_(self) -> str:
        head = "".join(f"<th>{escape(c)}</th>" for c in self.columns)
        body = "".join("<tr>" + "".join(f"<td>{escape(s)}</td>" for s in r) + "</tr>"
                       for r in self.cells())
        return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def doc(obj, max_chars: int | None = None) -> str:
    """``obj``'s docstring (or a string) for a notebook cell: whole, or its leading whole
    paragraphs up to ``max_chars`` followed by one line saying how many lines are left and where
    to read them (never cut mid-paragraph, let alone mid-word)."""
    import inspect
    text = obj if isinstance(obj, str) else inspect.getdoc(obj) or ""
    if max_chars is None or len(text) <= max_chars:
        return text
    paragraphs, kept = text.split("\n\n"), []
    for p in paragraphs:
        if kept and len("\n\n".join(kept + [p])) > max_chars:
            break
        kept.append(p)
    rest = "\n\n".join(paragraphs[len(kept):])
    name = getattr(obj, "__qualname__", None) or getattr(obj, "__name__", "it")
    module = getattr(obj, "__module__", None)
    where = f"{module}.{name}" if module and module != name else name
    return ("\n\n".join(kept) + f"\n\n[... {len(rest.splitlines())} more lines: "
            f"help({where})]")
