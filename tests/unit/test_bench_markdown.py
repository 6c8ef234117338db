"""BENCHMARKS.md's markers: a benchmark run rewrites only what lies between its section's
markers (bench.markdown.replace_block, bench.__main__.write_section); the analysis written
by hand around them survives every run."""

from __future__ import annotations

import pytest

from bench.__main__ import SECTIONS, write_section
from bench.markdown import begin_marker, end_marker, replace_block

B, E = begin_marker, end_marker


def _doc(*sections: str) -> str:
    return "# Benchmarks\n\nIntro by hand.\n\n" + "".join(sections)


def _section(heading: str, key: str, block: str, prose: str) -> str:
    return f"{heading}\n\nabove, by hand\n\n{B(key)}\n{block}\n{E(key)}\n\n{prose}\n\n"


def test_write_section_replaces_the_block_and_keeps_the_prose(tmp_path):
    out = tmp_path / "BENCHMARKS.md"
    shadow = f"## {SECTIONS['shadow'][0]}"
    ingest = f"## {SECTIONS['ingest'][0]}"
    out.write_text(
        _doc(
            _section(shadow, "shadow", "| old | 1.0 |\n\n_Measured long ago._", "Why: noise."),
            _section(ingest, "ingest", "| ingest | 2.0 |", "**Model, not measured**: N x."),
        )
    )
    write_section(out, "shadow", "| new | 9.9 |", 12.0)
    text = out.read_text()
    assert "| old | 1.0 |" not in text and "_Measured long ago._" not in text
    block = text[text.index(B("shadow")) : text.index(E("shadow"))]
    assert "| new | 9.9 |" in block and SECTIONS["shadow"][2] in block
    assert "; 12 s._" in block  # the run's own stamp, inside the markers
    for by_hand in ("Intro by hand.", "above, by hand", "Why: noise.", "**Model, not measured**"):
        assert by_hand in text
    assert "| ingest | 2.0 |" in text  # the other section's block is untouched
    # and a second run finds its markers again, changing only the block
    write_section(out, "shadow", "| newer | 8.8 |", 3.0)
    again = out.read_text()
    assert "| new | 9.9 |" not in again and "| newer | 8.8 |" in again
    assert again.replace("| newer | 8.8 |", "").replace("; 3 s._", "") == text.replace(
        "| new | 9.9 |", ""
    ).replace("; 12 s._", "")


def test_only_the_text_between_the_markers_changes():
    text = _doc(_section("## A", "a", "old\nlines", "after"), _section("## B", "b", "keep", "x"))
    new = replace_block(text, "a", "\nfresh\n", "## A")
    assert new == text.replace("old\nlines", "fresh")


def test_a_missing_section_goes_before_the_next_one_present():
    text = _doc(_section("## A", "a", "1", "p"), _section("## C", "c", "3", "q"))
    new = replace_block(text, "b", "2", "## B", followers=["c", "d"])
    assert new.index("## A") < new.index(f"## B\n\n{B('b')}\n2\n{E('b')}\n") < new.index("## C")
    assert replace_block(text, "d", "4", "## D").endswith(f"## D\n\n{B('d')}\n4\n{E('d')}\n")


@pytest.mark.parametrize(
    "text",
    [
        "## A\n\nall of it written before the markers existed\n",
        f"## A\n\n{B('a')}\nno end\n",
        f"## A\n\n{E('a')}\nend before begin\n{B('a')}\n",
        f"## A\n\n{B('a')}\n1\n{E('a')}\n{B('a')}\n2\n{E('a')}\n",
    ],
)
def test_unmarked_or_broken_sections_are_refused(text):
    with pytest.raises(ValueError, match="bench:a:"):
        replace_block(text, "a", "new", "## A")


def test_the_report_has_one_marked_block_per_section():
    from ragplane.testkit.harness import ROOT

    text = (ROOT / "BENCHMARKS.md").read_text()
    for key, (title, _, _) in SECTIONS.items():
        if f"## {title}" in text:
            assert text.count(B(key)) == text.count(E(key)) == 1, key
            replace_block(text, key, "x", f"## {title}")  # would not raise in `make bench`
