"""Plain-text tables for the CLI and the benchmarks: one helper instead of a copy in each.

Neither tabulate nor rich is a dependency of the package (rich is installed only as typer's, with
the train extra), and padding columns to their widest cell is all either would do here.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["format_table"]


def format_table(
    header: Sequence[Any],
    rows: Sequence[Sequence[Any]],
    *,
    align: str | None = None,
    title: str | None = None,
    footer: Sequence[str] = (),
    boxed: bool = False,
) -> str:
    """Columns padded to their widest cell, two spaces apart, a dashed rule under the header.

    Args:
        header: the column names.
        rows: one sequence of cells per row, as long as ``header``; cells are shown with ``str``.
        align: one ``l`` (left) or ``r`` (right) per column (default: all left).
        title: a line above the table.
        footer: lines below the table, indented by two spaces.
        boxed: rules above the header and below the last row too (the benchmarks' style).

    Returns:
        The table, lines joined by newlines, without trailing spaces or a final newline.

    Raises:
        ValueError: a row's length differs from the header's, or ``align`` is not one l/r per column.
    """
    width = len(header)
    for i, row in enumerate(rows):
        if len(row) != width:
            raise ValueError(f"row {i} has {len(row)} cells, the header {width}: give every row one cell per column")
    align = align if align is not None else "l" * width
    if len(align) != width or set(align) - {"l", "r"}:
        raise ValueError(f"align={align!r}: use one 'l' or 'r' per column ({width} columns)")
    cells = [[_cell(c) for c in header], *[[_cell(c) for c in row] for row in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(width)]
    rule = "  ".join("-" * w for w in widths)

    def line(row: list[str]) -> str:
        return "  ".join(c.ljust(w) if a == "l" else c.rjust(w) for c, w, a in zip(row, widths, align)).rstrip()

    out = [title] if title is not None else []
    out += [rule] if boxed else []
    out += [line(cells[0]), rule, *(line(row) for row in cells[1:])]
    out += [rule] if boxed else []
    out += [f"  {note}" for note in footer]
    return "\n".join(out)


def _cell(value: Any) -> str:
    return str(value).replace("\r", " ").replace("\n", " ")  # one line per row
