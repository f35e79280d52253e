"""Splitting SQL text into statements, for the migrator and the embedded ClickHouse service.

split_statements(sql)   `;`-separated statements; `;` in strings, quoted identifiers and
                        comments does not split; comment-only pieces are dropped
"""

from __future__ import annotations

import re

__all__ = ["split_statements"]

# Tokens the splitter must step over: strings, quoted identifiers, comments.
_SKIP_RE = re.compile(
    r"'(?:[^'\\]|\\.|'')*'|`(?:[^`\\]|\\.)*`|\"(?:[^\"\\]|\\.)*\"|--[^\n]*|/\*.*?\*/", re.DOTALL
)
_COMMENT_ONLY_RE = re.compile(r"\A(?:\s+|--[^\n]*|/\*.*?\*/)*\Z", re.DOTALL)


def split_statements(sql: str) -> list[str]:
    """Split on `;` outside strings, quoted identifiers and comments; drop empty statements."""
    statements: list[str] = []
    start = pos = 0
    while pos < len(sql):
        skipped = _SKIP_RE.match(sql, pos)
        if skipped:
            pos = skipped.end()
        elif sql[pos] == ";":
            statements.append(sql[start:pos])
            start = pos = pos + 1
        else:
            pos += 1
    statements.append(sql[start:])
    return [s.strip() for s in statements if not _COMMENT_ONLY_RE.match(s)]
