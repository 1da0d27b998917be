"""The command line's one table style: every command that prints a table builds it here and
prints it here, with ``rich`` (rich.readthedocs.io, "Tables").

- :func:`table`: a ``rich`` Table in the house style: a bold header over a rule, no outer
  border, the title on the left above it; a column named with :func:`num` is right-justified
  (counts, rewards, seconds); a cell too long for its column wraps, never cut;
- :func:`cell`: one value as a cell: ``-`` for nothing, ``yes``/``NO`` for a flag, a float
  with a fixed number of decimals;
- :func:`console`: where tables go: stdout (or ``file``); on a pipe or a log file it is 200
  columns wide, since ``rich`` would otherwise cut every column to fit 80, and never coloured;
- :func:`show`: print renderables (tables, lines) on such a console;
- :func:`text`: a table as plain text, for functions that return what a command prints.

A command that also gives machine-readable output does so with ``--json``, never by parsing
its table.
"""

from __future__ import annotations

import io
from collections.abc import Iterable
from typing import IO, Any

from rich import box
from rich.console import Console, RenderableType
from rich.table import Column, Table

__all__ = ["PIPE_WIDTH", "Table", "cell", "console", "num", "show", "table", "text"]

#: the width of a table printed to a pipe or a file (a terminal's own width otherwise)
PIPE_WIDTH = 200


def num(header: str) -> Column:
    """A right-justified column (a count, a reward, seconds)."""
    return Column(header, justify="right")


def table(
    *columns: str | Column,
    title: str | None = None,
    caption: str | None = None,
    rows: Iterable[Iterable[Any]] = (),
) -> Table:
    """A table in the house style.

    Args:
        columns: the headers, in order: a name (left-justified) or a :class:`rich.table.Column`
            (:func:`num` for a right-justified one).
        title: printed on the left above the table.
        caption: printed on the left under it (a count, a note).
        rows: rows to add at once, each as many values as there are columns, each passed
            through :func:`cell`.

    Returns:
        The table; add more rows with ``table.add_row(*map(cell, values))``.
    """
    built = Table(
        *columns,
        title=title,
        caption=caption,
        box=box.SIMPLE_HEAD,
        header_style="bold",
        title_style="bold",
        title_justify="left",
        caption_justify="left",
        show_edge=False,
        pad_edge=False,
        highlight=False,
    )
    for column in built.columns:  # a long word (a path, a digest) wraps, never cut with "…"
        column.overflow = "fold"
    for row in rows:
        built.add_row(*(cell(v) for v in row))
    return built


def cell(value: Any, digits: int = 2) -> str:
    """One value as a table cell.

    Args:
        value: None (``-``), a bool (``yes``/``NO``, upper case to stand out), a float (with
            ``digits`` decimals), anything else (``str``; an empty string is ``-``).
        digits: decimals of a float.
    """
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "NO"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value) or "-"


def console(file: IO[str] | None = None) -> Console:
    """The console tables print on: ``file`` (default stdout); :data:`PIPE_WIDTH` columns wide
    and without colour when it is not a terminal, so a log keeps whole cells."""
    out = Console(file=file, highlight=False)
    if out.is_terminal:
        return out
    return Console(file=file, width=PIPE_WIDTH, highlight=False, no_color=True)


def show(*renderables: RenderableType | str, file: IO[str] | None = None) -> None:
    """Print tables and lines on :func:`console`; a string is printed as it is (no markup)."""
    out = console(file)
    for renderable in renderables:
        if isinstance(renderable, str):
            out.print(renderable, markup=False, soft_wrap=True)
        else:
            out.print(renderable)


def text(renderable: RenderableType, width: int = PIPE_WIDTH) -> str:
    """What :func:`show` prints to a pipe, as a string (trailing spaces removed)."""
    buffer = io.StringIO()
    Console(file=buffer, width=width, highlight=False, no_color=True).print(renderable)
    return "\n".join(line.rstrip() for line in buffer.getvalue().splitlines())
