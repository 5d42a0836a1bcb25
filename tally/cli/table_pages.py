"""The `table` format's pages: rows drawn as aligned text, a page at a time.

A page is a header, a rule and its rows, in the style rich draws a table without its edge (a
heavy head), each column as wide as its widest cell on that page. Rows are drawn as strings
joined by one format string per page, not as rich renderables: rich measures and wraps every
cell, about a third of a millisecond per row, which made a 200,000-row scan a minute of
drawing; here a page costs a microsecond or two per row.
"""

from __future__ import annotations

HEAD_SEPARATOR, RULE, RULE_SEPARATOR, SEPARATOR = "┃", "━", "╇", "│"
BOLD, PLAIN = "\x1b[1m", "\x1b[0m"


def _is_terminal(stream) -> bool:
    return bool(getattr(stream, "isatty", lambda: False)())


def _padded(cells: list[str], width: int) -> list[str]:
    """Cells of a column holding wide characters (CJK, emoji), padded to `width` terminal
    cells (str.ljust counts characters, not cells)."""
    from rich.cells import cell_len

    return [cell + " " * (width - cell_len(cell)) for cell in cells]


class PagePrinter:
    """Draws pages of one listing on `stream`: `title` above the first, a header on each; the
    header is bold on a terminal."""

    def __init__(self, stream, header: list[str], title: str | None = None) -> None:
        self.stream = stream
        self.header = [str(h) for h in header]
        self.title = title
        self.pages = 0
        self.bold = _is_terminal(stream)

    def page(self, columns: list[list[str]]) -> None:
        """Draw one page: `columns` holds each column's cell texts (all of one length)."""
        widths, formats, cells = [], [], []
        for name, column in zip(self.header, columns):
            if name.isascii() and "".join(column).isascii():
                width = max(len(name), max(map(len, column), default=0))
                formats.append(f" {{:<{width}}} ")
                cells.append(column)
            else:  # padded here, by terminal cells; the format pads no further
                from rich.cells import cell_len

                width = max(cell_len(name), max(map(cell_len, column), default=0))
                formats.append(" {} ")
                cells.append(_padded(column, width))
            widths.append(width)
        head = HEAD_SEPARATOR.join(f" {name} " for name in
                                   (_padded([n], w)[0] if not n.isascii() else n.ljust(w)
                                    for n, w in zip(self.header, widths)))
        lines = []
        if self.title is not None and not self.pages:
            lines.append(self.title)
        lines.append(f"{BOLD}{head}{PLAIN}" if self.bold else head)
        lines.append(RULE_SEPARATOR.join(RULE * (width + 2) for width in widths))
        row = SEPARATOR.join(formats)
        lines.extend(row.format(*values) for values in zip(*cells))
        lines.append("")
        self.stream.write("\n".join(lines))
        self.stream.flush()
        self.pages += 1
