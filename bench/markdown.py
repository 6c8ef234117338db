"""Markdown for the reports, with no imports beyond the standard library, so that a
section can run where the service's own dependencies are not installed (the GPU machine).

BENCHMARKS.md mixes two kinds of text: what a benchmark run writes (tables, measured
numbers) and what people write (analysis, history, models). A run owns only the text
between its section's markers, `<!-- bench:KEY:begin -->` and `<!-- bench:KEY:end -->`;
`replace_block` rewrites that and nothing else.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    out = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(out)


def begin_marker(key: str) -> str:
    return f"<!-- bench:{key}:begin -->"


def end_marker(key: str) -> str:
    return f"<!-- bench:{key}:end -->"


def replace_block(
    text: str, key: str, block: str, heading: str, followers: Iterable[str] = ()
) -> str:
    """`text` with section `key`'s generated block replaced by `block`.

    Only the text between the section's two markers changes. A section that `text` lacks
    is added (`heading`, then `block` inside new markers) before the first section of
    `followers` (keys, in report order) that `text` has, else at the end.

    Raises ValueError, changing nothing, when the markers are not exactly one begin before
    one end, or when `heading` is in `text` without markers (its generated part must be
    marked by hand first: a guess could overwrite someone's analysis).
    """
    begin, end = begin_marker(key), end_marker(key)
    block = block.strip("\n")
    n_begin, n_end = text.count(begin), text.count(end)
    if n_begin == n_end == 1 and text.index(begin) < text.index(end):
        start, stop = text.index(begin) + len(begin), text.index(end)
        return f"{text[:start]}\n{block}\n{text[stop:]}"
    if n_begin or n_end:
        raise ValueError(f"section {key!r}: expected one {begin} before one {end}")
    if re.search(rf"^{re.escape(heading)}[ \t]*$", text, re.MULTILINE):
        raise ValueError(
            f"{heading!r} has no {begin} ... {end}: mark what the benchmark writes, so that "
            "the text around it (written by hand) stays as it is"
        )
    new = f"{heading}\n\n{begin}\n{block}\n{end}\n"
    for later in followers:
        at = text.find(begin_marker(later))
        if at >= 0:
            title = text.rfind("\n## ", 0, at)  # that section's heading
            at = title + 1 if title >= 0 else at
            return f"{text[:at]}{new}\n{text[at:]}"
    return text.rstrip("\n") + "\n\n" + new
