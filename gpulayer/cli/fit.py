"""Tables that fit the terminal without cutting a word.

An id, a date, a state or a price is read (and copied) as a whole, so no cell is ever cut or
folded inside a word. A column of free text (a reason, a note, labels) may wrap between its
words and takes the width left over. When even that does not fit, optional columns are left
out, least useful first, as `kubectl get` shows fewer columns than `-o wide`; a footnote names
them, and --json always has every field.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from rich.cells import cell_len
from rich.console import Console, Group, RenderableType
from rich.table import Table
from rich.text import Text

_GAP = 1
"""Spaces between cells (rich's right padding; the last column has none)."""

_PROSE_WIDTH = 20
"""A free-text column is given at least this much (when it has that much to say), so that a
sentence reads a few words a line, not one."""


@dataclass(frozen=True)
class Column:
    name: str
    prose: bool = False
    """Free text: may wrap between words (never inside one)."""
    drop: int = 0
    """0: always shown; otherwise left out on a narrow terminal, the highest number first."""
    justify: Literal["left", "right"] = "left"
    fold: bool = False
    """A free-form name: folded inside a word as a last resort, when the table fits no other
    way (never an id, a date or a state)."""


_FOLDED_WIDTH = 8
"""The narrowest a foldable name is made."""


def _plain(cell: str) -> str:
    return Text.from_markup(cell).plain


def _longest_word(text: str) -> int:
    return max((cell_len(word) for word in text.split()), default=0)


def _needs(column: Column, index: int, rows: Sequence[Sequence[str]]) -> int:
    """The narrowest the column can be without cutting a word."""
    cells = [_plain(row[index]) for row in rows]
    if column.prose:
        widest = max([cell_len(column.name), *(cell_len(c) for c in cells)])
        longest = max([_longest_word(column.name), *(_longest_word(c) for c in cells)])
        return max(longest, min(widest, _PROSE_WIDTH))
    return max([cell_len(column.name), *(cell_len(c) for c in cells)])


def layout(columns: Sequence[Column], rows: Sequence[Sequence[str]], width: int) -> dict[int, int]:
    """Shown column index -> its least width, fitting ``width`` when the columns allow it:
    optional columns left out as needed, then foldable names narrowed."""
    needs = [_needs(column, i, rows) for i, column in enumerate(columns)]

    def total(indexes: list[int]) -> int:
        return sum(needs[i] for i in indexes) + _GAP * (len(indexes) - 1)

    shown = list(range(len(columns)))
    droppable = sorted(
        (i for i, c in enumerate(columns) if c.drop), key=lambda i: (columns[i].drop, i)
    )
    dropped = []
    while total(shown) > width and droppable:
        dropped.append(droppable.pop())
        shown.remove(dropped[-1])
    # A narrow column left out early may fit again once a wide one is out too.
    for index in reversed(dropped):
        candidate = sorted([*shown, index])
        if total(candidate) <= width:
            shown = candidate
    widths = {i: needs[i] for i in shown}
    over = total(shown) - width
    # Still too wide: free text goes down to its longest word, then names fold.
    for i in shown:
        if over > 0 and columns[i].prose:
            cells = [_plain(row[i]) for row in rows]
            longest = max([_longest_word(columns[i].name), *(_longest_word(c) for c in cells)])
            narrower = max(longest, needs[i] - over)
            over -= needs[i] - narrower
            widths[i] = narrower
    for i in shown:
        if over > 0 and columns[i].fold:
            narrower = max(_FOLDED_WIDTH, needs[i] - over)
            over -= needs[i] - narrower
            widths[i] = narrower
    return widths


def fitted_table(
    columns: Sequence[Column],
    rows: Sequence[Sequence[str]],
    *,
    width: int,
    title: str | None = None,
) -> RenderableType:
    """``rows`` (cells may carry rich markup) as a table at most ``width`` wide when the
    always-shown columns allow it."""
    widths = layout(columns, rows, width)
    table = Table(
        box=None,
        header_style="bold",
        padding=(0, _GAP, 0, 0),
        pad_edge=False,
        title=title,
        title_justify="left",
    )
    for i, need in widths.items():
        column = columns[i]
        if column.fold:
            table.add_column(
                column.name, overflow="fold", min_width=need, max_width=need, justify=column.justify
            )
        elif column.prose:
            table.add_column(column.name, overflow="fold", min_width=need, justify=column.justify)
        else:
            table.add_column(column.name, no_wrap=True, min_width=need, justify=column.justify)
    for row in rows:
        table.add_row(*(row[i] for i in widths))
    left_out = [columns[i].name for i in range(len(columns)) if i not in widths]
    if not left_out or not rows:
        return table
    note = Text(
        f"(narrow terminal: {', '.join(left_out)} left out; --json has every field)", style="dim"
    )
    return Group(table, note)


def print_fitted(
    console: Console,
    columns: Sequence[Column],
    rows: Sequence[Sequence[str]],
    *,
    title: str | None = None,
) -> None:
    console.print(fitted_table(columns, rows, width=console.width, title=title))
