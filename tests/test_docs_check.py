"""tools/docs_check.py: the command blocks of the README run as a reader would run them and print
what the README shows; the checker itself fails on a wrong shown output, a failing command, and
honours (and reports) skip markers."""
from __future__ import annotations

import io
from pathlib import Path

import pytest

from script_modules import load_script

ROOT = Path(__file__).resolve().parents[1]
docs_check = load_script("tools/docs_check.py")

README_LIMIT = 10_000


def test_the_readme_is_short() -> None:
    assert len((ROOT / "README.md").read_text(encoding="utf-8")) <= README_LIMIT


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
