"""Read the ``# source:`` comments of a TOML data file.

Every number in a preset (clusters, models, failure profiles) carries a
citation as a ``# source:`` comment, on its own line or on the line directly
above. This module maps them to dotted keys; a comment on a table header
covers every key of that table.
"""

from __future__ import annotations

import re

_HEADER_RE = re.compile(r"^\s*\[\[?\s*([^\]]+?)\s*\]\]?\s*(#.*)?$")
_KEY_RE = re.compile(r"^\s*([A-Za-z0-9_\-.\"' ]+?)\s*=")
_SOURCE_RE = re.compile(r"#\s*source:\s*(.*?)\s*$", re.IGNORECASE)


def comment_of(line: str) -> str | None:
    """The comment part of a TOML line (``#`` outside quotes), or None."""
    quote = None
    for i, ch in enumerate(line):
        if quote:
            if ch == quote:
                quote = None
        elif ch in "\"'":
            quote = ch
        elif ch == "#":
            return line[i:]
    return None


def split_key(key: str) -> list[str]:
    """``'a."b".c'`` -> ``['a', 'b', 'c']``."""
    return [part.strip().strip("\"'") for part in key.split(".")]


def source_comments(text: str) -> dict[str, str]:
    """``{dotted key or table: citation}`` for every ``# source:`` comment in ``text``.

    A comment applies to the key (or table header) on its own line or on the
    line directly below it.
    """
    found: dict[str, str] = {}
    table: list[str] = []
    pending: str | None = None
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("#"):
            match = _SOURCE_RE.search(stripped)
            pending = match.group(1) if match else None
            continue
        comment = comment_of(line)
        match = _SOURCE_RE.search(comment) if comment else None
        source = match.group(1) if match else pending
        pending = None
        header = _HEADER_RE.match(line)
        if header:
            table = split_key(header.group(1))
            if source:
                found[".".join(table)] = source
            continue
        key = _KEY_RE.match(line)
        if key and source:
            found[".".join(table + split_key(key.group(1)))] = source
    return found


def table_headers(text: str) -> list[str]:
    """Dotted names of the table headers (``[a.b]``) in ``text``, in order."""
    return [".".join(split_key(m.group(1))) for m in map(_HEADER_RE.match, text.splitlines())
            if m]
