"""Our markdown (receipts, status, comparison tables: written for the Prefect UI and MLflow) as plain
text for a terminal, where ``**interim**`` and backticks would show as typed."""

from __future__ import annotations

import re

_EMPHASIS = re.compile(r"(?<!\\)\*\*(.+?)(?<!\\)\*\*|(?<!\\)`([^`]*?)(?<!\\)`")
_SEPARATOR = re.compile(r"^\|?(\s*:?-{3,}:?\s*\|)+\s*:?-*:?\s*$")
_CELL_BORDER = re.compile(r"(?<!\\)\|")
_ESCAPED = re.compile(r"\\([\\`*_{}\[\]()#+\-.!|<>~])")


def plain(markdown: str) -> str:
    """``markdown`` for a terminal: bold and code marks dropped, headings without their ``#``, each
    table's columns aligned under a dashed header line. Everything else is kept as written."""
    lines, table = [], []
    for line in markdown.splitlines():
        if line.lstrip().startswith("|"):
            table.append(line.strip())
            continue
        if table:
            lines += _table(table)
            table = []
        lines.append(_inline(re.sub(r"^#{1,6}\s+", "", line)))
    return "\n".join(lines + (_table(table) if table else []))


def _inline(text: str) -> str:
    """Bold and code marks dropped, then markdown's escapes undone (a quarantine reason is escaped so
    that it shows as written in the UI; the terminal shows it as written too)."""
    text = _EMPHASIS.sub(lambda m: m.group(1) if m.group(1) is not None else m.group(2), text)
    return _ESCAPED.sub(r"\1", text)


def _cells(row: str) -> list[str]:
    inner = row[1:-1] if row.endswith("|") and not row.endswith("\\|") else row[1:]
    return [_inline(cell.strip().replace("\\|", "|")) for cell in _CELL_BORDER.split(inner)]


def _table(rows: list[str]) -> list[str]:
    """A markdown table's rows as aligned columns: the separator row becomes dashes under the header."""
    cells = [_cells(row) for row in rows if not _SEPARATOR.match(row)]
    width = max(len(row) for row in cells)
    cells = [row + [""] * (width - len(row)) for row in cells]
    widths = [max(len(row[i]) for row in cells) for i in range(width)]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in cells]
    if len(rows) > 1 and _SEPARATOR.match(rows[1]):
        lines.insert(1, "  ".join("-" * w for w in widths))
    return lines
