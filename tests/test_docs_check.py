"""tools/docs_check.py: the command blocks of the README run as a reader would run them and print
what the README shows; the checker itself fails on a wrong shown output, a failing command, and
honours (and reports) skip markers."""
from __future__ import annotations

import io
import re
from pathlib import Path

import pytest

from script_modules import load_script

ROOT = Path(__file__).resolve().parents[1]
docs_check = load_script("tools/docs_check.py")

README_LIMIT = 10_000


def test_the_readme_is_short() -> None:
    """Counted in bytes, as `wc -c` counts it (a newcomer's five minutes)."""
    assert len((ROOT / "README.md").read_bytes()) <= README_LIMIT


def test_shown_output_matches_with_wildcards_only_where_the_page_says_so() -> None:
    assert docs_check.matches("a\n...\nRecall@20: 0.4...\n", "a\nx\ny\nRecall@20: 0.41\n")
    assert docs_check.matches("a\n...\n", "a\n")
    assert not docs_check.matches("a\nRecall@20: 0.4...\n", "a\nRecall@20: 0.5\n")
    assert not docs_check.matches("a\n", "a\nmore\n")  # unshown lines need a '...' line


def test_blocks_shown_output_and_skip_markers_are_parsed_and_run(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "# A page\n\n```bash\necho hello\n```\n```text\nhello\n```\n\n"
        "```python\nprint(6 * 7)\n```\n\n```text\n41\n```\n\n"
        "<!-- docs-check: skip needs a GPU -->\n```bash\nexit 3\n```\n\n"
        "Prose.\n\n```text\nnot an output\n```\n\n```bash\nfalse\n```\n",
        encoding="utf-8",
    )
    found = docs_check.blocks(page)
    assert [(b.lang, b.expected, b.skip) for b in found] == [
        ("bash", "hello\n", None), ("python", "41\n", None), ("bash", None, "needs a GPU"), ("bash", None, None)]
    out = io.StringIO()
    assert docs_check.check_page(page, timeout=60, out=out) == 2  # 42 is not the 41 shown; 'false' fails
    text = out.getvalue()
    assert "ok   " in text and "SKIP " in text and "needs a GPU" in text and text.count("FAIL ") == 2


def test_every_block_of_the_readme_runs_as_shown() -> None:
    if not (ROOT / ".venv" / "bin" / "gru4rec").exists():
        pytest.skip("the README's commands run from the checkout's .venv (make venv)")
    out = io.StringIO()
    failures = docs_check.check_page(ROOT / "README.md", timeout=600, out=out)
    assert failures == 0, out.getvalue()
    assert out.getvalue().count("ok   ") >= 3


@pytest.mark.slow
@pytest.mark.parametrize("page", sorted(p.name for p in (ROOT / "docs").glob("*.md")))
def test_every_block_of_the_docs_runs_as_shown(page: str) -> None:
    # Several minutes together (trainings, a study, a server): make test-all, and make docs-check.
    if not (ROOT / ".venv" / "bin" / "gru4rec").exists():
        pytest.skip("the docs' commands run from the checkout's .venv (make venv)")
    out = io.StringIO()
    assert docs_check.check_page(ROOT / "docs" / page, timeout=600, out=out) == 0, out.getvalue()


# The README's data set; a page that makes it again must make the very same files.
README_DATA = "gru4rec synth data --n-sessions 5000 --seed 1"
SYNTH = re.compile(r"gru4rec\s+synth\s+(?P<folder>\S+)(?P<rest>[^#\n]*)")


def _synth_commands(page: Path) -> list[tuple[str, str]]:
    """``(folder, the command)`` of every ``gru4rec synth`` a page's runnable blocks run (``$R``
    and the like resolved from the block's own ``NAME=value`` lines)."""
    found = []
    for block in docs_check.blocks(page):
        if block.skip is not None or block.lang != "bash":
            continue
        names = dict(re.findall(r"^(\w+)=(\S+)$", block.text, flags=re.M))
        for match in SYNTH.finditer(block.text):
            folder = match["folder"]
            for name, value in names.items():
                folder = folder.replace(f"${name}", value)
            found.append((folder, " ".join(f"gru4rec synth {folder}{match['rest']}".split())))
    return found


def test_every_docs_page_works_in_its_own_folder_or_remakes_the_readmes_data() -> None:
    """Issue 50 item 4: a reader who followed the README, then a page of docs/, in one folder —
    the page's first command failed (`synth data` without --force), and with --force it replaced
    the README's data. A page makes its data in a folder of its own, or makes the README's data
    set again, the same files (the same seed and size, --force)."""
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    owners: dict[str, set[str]] = {}
    for page in pages:
        for folder, command in _synth_commands(page):
            owners.setdefault(folder.rstrip("/"), set()).add(page.name)
            if page.name != "README.md" and folder.rstrip("/") == "data":
                assert command.startswith(README_DATA) and "--force" in command.split(), (page.name, command)
    assert owners["data"] >= {"README.md"}
    shared = {folder: names for folder, names in owners.items() if folder != "data" and len(names) > 1}
    assert not shared, f"pages that write into one folder: {shared}"


def test_a_figure_without_a_date_is_found(tmp_path: Path) -> None:
    """``--figures``: the figures issue 50 found drifted, each in prose without a date, are listed;
    with the date they were measured on they are not, nor are fenced blocks, tables and headings."""
    page = tmp_path / "page.md"
    page.write_text(
        "# 28 s in a heading\n\n`make demo` takes 28 s once installed. On a small data set (about a minute on\n"
        "one CPU core). The suite's 1,972 tests, e.g. 0.5 of them. It runs 10.6× the port, at 2,640 mini-batches/s.\n\n"
        "`make test` took 3 min 41 s (2026-12-05, `make test`). Recall@20 0.52, a metric line the blocks check.\n\n"
        "| table | 47.1k e/s |\n|---|---|\n\n```bash\nsleep 5   # waits 5 s\nsleep 1   # 2026-12-05: 1 s\n```\n",
        encoding="utf-8",
    )
    found = docs_check.undated_figures(page)
    assert [line for line, _ in found] == [3, 3, 3, 3, 12]
    assert [sentence.split()[0] for _, sentence in found] == ["`make", "On", "The", "It", "waits"]
    assert docs_check.main(["--figures", str(page)]) == 1


DOCS_PAGES = ["README.md", *sorted(f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md"))]


@pytest.mark.parametrize("page", DOCS_PAGES)
def test_every_figure_of_these_pages_is_dated(page: str) -> None:
    """Issue 50 item 5: make demo's 28 s, 1,972 tests, cli.md's 'about a minute', ... had drifted
    from what runs today. A figure that make docs-check cannot check carries its date (and the
    command or the page of commands that produced it), in its sentence, its table's caption or its
    heading; one that is no measurement says why (``<!-- figure: ... -->``). Every page."""
    assert docs_check.undated_figures(ROOT / page) == []


def test_make_docs_check_lists_undated_figures_of_every_page() -> None:
    """``make docs-check`` runs ``--figures`` over the pages whose blocks it runs."""
    recipe = re.search(r"^docs-check:.*\n((?:\t.*\n)+)", (ROOT / "Makefile").read_text(encoding="utf-8"), re.M)
    assert recipe is not None
    assert "tools/docs_check.py --figures README.md docs/*.md" in recipe[1]
    assert len(DOCS_PAGES) > 10  # the glob found the pages


def test_a_table_row_a_section_and_a_marked_figure_are_dated_by_their_caption_heading_or_reason(tmp_path: Path) -> None:
    """Issue 50 item 5: README's results table had no dates of its own and tables were not
    checked. A row with a figure is dated by a date of its own, of the table's caption (the
    paragraph right before it) or of its section's heading; a paragraph by its heading or its
    dated bold run-in heading (a date inside a sentence dates only that sentence); a figure that
    is no measurement of ours says why in ``<!-- figure: ... -->``."""
    page = tmp_path / "page.md"
    page.write_text(
        "# Page\n\n"  # 1
        "Speed:\n\n| what | figure |\n|---|---|\n| training | 47.1k e/s |\n| dated row | 2.1× (2026-12-05) |\n\n"  # 3-8
        "Speed, 2026-12-04, `python -m benchmarks.x`:\n\n| training | 47.1k e/s |\n\n"  # 10, 12
        "## Round 1 (2026-12-03)\n\nIt ran at 1,013 mb/s.\n\n### Details\n\nA step took 0.98 ms.\n\n"  # 14-20
        "## Round 2\n\nIt ran at 1,072 mb/s. The line shows `(12.34s)` <!-- figure: printed by the block above -->."
        " A pause of 50 ms <!-- figure: -->.\n\n"  # 22-24
        "A paragraph between.\n\n| caption not right before | 3 s |\n\n"  # 26, 28
        "**Round 3 (2026-12-05).** It ran at 1,100 mb/s. Then 1,200 mb/s.\n\n"  # 30: a dated run-in heading
        "**Round 4.** It ran at 1,300 mb/s (2026-12-05). Then 1,400 mb/s.\n",  # 32
        encoding="utf-8",
    )
    found = docs_check.undated_figures(page)
    assert [(line, sentence.split()[0]) for line, sentence in found] == [
        (7, "|"), (24, "It"), (24, "A"), (28, "|"), (32, "Then")]
    assert "47.1k" in found[0][1] and "50 ms" in found[2][1]  # an empty reason does not count
