"""Run the command blocks of Markdown pages as a reader would, and compare what they print with
what the page shows (``make docs-check``).

    python tools/docs_check.py README.md docs/*.md
    python tools/docs_check.py --list docs/serving.md      # what would run, what is skipped and why

Rules, for the writer of a page:

* every ```` ```bash ```` and ```` ```python ```` block runs, in order, in one fresh folder per page
  (so a page's blocks share the files its first block makes, as they do for a reader who follows
  it); ``paramfiles/``, ``paramspaces/``, ``examples/``, ``run.py`` and ``paropt.py`` are linked
  there from the checkout, the ``gru4rec`` of this checkout's ``.venv`` comes first on PATH, and
  ``OMP_NUM_THREADS=1`` makes the numbers repeatable;
* a ```` ```text ```` block right after a runnable one is what it prints (standard output and
  error together) and must match it line for line, where ``...`` inside a line stands for any
  text and a line that is only ``...`` for any number of lines;
* a block that cannot run here (it needs a GPU, real data, a long run, a database server) has
  the line ``<!-- docs-check: skip REASON -->`` right before it; the reason is printed;
* a block that fails (exit code not 0) or prints something else fails the check (exit code 1).

A figure in the prose (a duration, a speed, a speed-up, a count of tests) is not checked by
running anything, so its sentence carries the date it was measured on (``2026-12-05``) and names
the command or the page of commands that produced it: ``--figures`` lists the sentences with a
figure and no date (exit code 1 when there is one). A sentence is also dated by a date in its
section's heading (or a heading above it) or in its paragraph's bold run-in heading
(``**Round 2 (2026-12-05).** ...``), and a table's row by a date in the row, in its caption
(the paragraph right before the table) or in its heading. A figure that is no measurement of ours
— one a command block of the page prints (so the run checks it), a setting, a published figure —
carries ``<!-- figure: REASON -->`` inside its sentence (before the next sentence starts).
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RUNNABLE = ("bash", "python")
SKIP = re.compile(r"<!--\s*docs-check:\s*skip\s+(?P<reason>.+?)\s*-->")
LINKED = ("paramfiles", "paramspaces", "examples", "run.py", "paropt.py")
FENCE = re.compile(r"^```(?P<lang>[\w-]*)\s*$")


@dataclasses.dataclass
class Block:
    """One fenced block of a page: its language, first line number, text, and for a runnable
    block the output shown after it and why it is skipped (None: it runs)."""

    path: Path
    line: int
    lang: str
    text: str
    expected: str | None = None
    skip: str | None = None


def blocks(path: Path) -> list[Block]:
    """The runnable blocks of a Markdown file, each with its shown output and skip reason."""
    lines = path.read_text(encoding="utf-8").splitlines()
    found: list[Block] = []
    i = 0
    previous: Block | None = None  # the last runnable block, while only blank lines follow it
    while i < len(lines):
        match = FENCE.match(lines[i])
        if not match or not match["lang"]:
            if lines[i].strip() and not SKIP.search(lines[i]):
                previous = None
            i += 1
            continue
        start, lang = i, match["lang"]
        end = i + 1
        while end < len(lines) and lines[end].strip() != "```":
            end += 1
        text = "\n".join(lines[start + 1:end]) + "\n"
        before = next((lines[j] for j in range(start - 1, -1, -1) if lines[j].strip()), "")
        if lang in RUNNABLE:
            skip = SKIP.search(before)
            previous = Block(path, start + 1, lang, text, skip=skip["reason"] if skip else None)
            found.append(previous)
        elif lang == "text" and previous is not None and previous.expected is None:
            previous.expected = text
            previous = None
        else:
            previous = None
        i = end + 1
    return found


#: What a measured figure looks like in prose: a duration, a speed, a speed-up, a count of tests.
FIGURE = re.compile(
    r"\b\d[\d,.]*\s?(?:s|ms|µs|min|seconds?|minutes?|hours?)\b(?!/)"  # 28 s, 3 min 41 s, 5 seconds
    r"|\b(?:about|under|over|in) (?:a|one|half a) (?:second|minute|hour)\b"  # about a minute
    r"|\b\d[\d,.]*k?\s?(?:mb/s|e/s|events/s|clicks/s|mini-batches/s|pred/s)"  # speeds
    r"|\b\d+(?:\.\d+)?\s?×(?!\d)"  # speed-ups: 1.25×
    r"|\b\d[\d,]* tests\b"  # a count of tests
)
DATE = re.compile(r"\b20\d\d-\d\d-\d\d\b")
#: A figure that needs no date, and why: ``<!-- figure: printed by the block above -->``.
NOT_MEASURED = re.compile(r"<!--\s*figure:\s*\S.*?-->")
HEADING = re.compile(r"^(?P<level>#{1,6})\s")
RUN_IN = re.compile(r"^\*\*[^*]+\*\*")


def undated_figures(path: Path) -> list[tuple[int, str]]:
    """``(line, sentence)`` of every sentence of the page's prose and every table row that holds a
    :data:`FIGURE` and is not dated (see the module: a :data:`DATE` in the sentence, its section's
    headings or, for a row, the table's caption) nor marked :data:`NOT_MEASURED`. Fenced blocks
    and headings are not prose; the comments of a command block are (running the command does not
    check them)."""
    lines = path.read_text(encoding="utf-8").splitlines()
    # (line, text, dated by its headings or caption, is a table row)
    paragraphs: list[tuple[int, str, bool, bool]] = []
    headings: list[tuple[int, bool]] = []  # (level, has a date) of the current section's headings
    fenced, start, text = False, 0, []
    caption = ""  # the last paragraph, while only blank lines follow it
    for number, line in enumerate(lines + [""], 1):
        section_dated = any(dated for _, dated in headings)
        stripped = line.strip()
        if FENCE.match(line):
            fenced = not fenced
        elif fenced and "  # " in line:
            paragraphs.append((number, line.split("  # ", 1)[1].strip(), section_dated, False))
        heading = HEADING.match(line) if not fenced else None
        if heading:
            level = len(heading["level"])
            headings = [h for h in headings if h[0] < level] + [(level, bool(DATE.search(line)))]
        row = not fenced and stripped.startswith("|")
        if row:
            dated = section_dated or bool(DATE.search(caption))
            paragraphs.append((number, stripped, dated, True))
        prose = not fenced and not FENCE.match(line) and stripped and not stripped.startswith(("|", "#", "<!--"))
        if prose:
            if not text:
                start = number
            text.append(stripped)
        elif text:
            caption = " ".join(text)
            lead = RUN_IN.match(caption)  # a bold run-in heading dates its paragraph as a heading does
            paragraphs.append((start, caption, section_dated or bool(lead and DATE.search(lead[0])), False))
            text = []
        elif stripped and not row:
            caption = ""
    found = []
    for number, paragraph, dated, is_row in paragraphs:
        if dated:
            continue
        # Sentences end at '. ' before a capital or a backquote; numbers like 0.5 and 'e.g. x' stay whole.
        sentences = [paragraph] if is_row else re.split(r"(?<=[.!?])\s+(?=[A-Z`(\[*])", paragraph)
        for sentence in sentences:
            if FIGURE.search(sentence) and not DATE.search(sentence) and not NOT_MEASURED.search(sentence):
                found.append((number, sentence))
    return found


def _line_pattern(line: str) -> str:
    return ".*".join(re.escape(part) for part in line.rstrip().split("..."))


def matches(expected: str, actual: str) -> bool:
    """Whether ``actual`` is what ``expected`` shows (``...`` wildcards, see the module)."""
    parts = []
    for line in expected.rstrip("\n").splitlines():
        parts.append(r"(?:[^\n]*\n)*?" if line.strip() == "..." else _line_pattern(line) + r"[ \t]*\n")
    normalised = "\n".join(line.rstrip() for line in actual.rstrip("\n").splitlines()) + "\n"
    return re.fullmatch("".join(parts), normalised, flags=re.DOTALL) is not None


def environment() -> dict[str, str]:
    """The blocks' environment: this checkout's .venv first on PATH, one thread, no user storage."""
    env = dict(os.environ)
    env["PATH"] = f"{ROOT / '.venv' / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", COLUMNS="100", PYTHONUNBUFFERED="1")
    env.pop("GRU4REC_OPTUNA_STORAGE", None)
    return env


def run_block(block: Block, workdir: Path, timeout: float) -> tuple[bool, str, float]:
    """Run one block in ``workdir``; returns (passed, what it printed, seconds)."""
    python = ROOT / ".venv" / "bin" / "python"
    command = (["bash", "-euo", "pipefail", "-c", block.text] if block.lang == "bash"
               else [str(python if python.exists() else sys.executable), "-c", block.text])
    start = time.perf_counter()
    try:
        done = subprocess.run(command, cwd=workdir, env=environment(), stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        return False, out + f"\n[timed out after {timeout:.0f} s]", time.perf_counter() - start
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        return False, done.stdout + f"\n[exit code {done.returncode}]", seconds
    if block.expected is not None and not matches(block.expected, done.stdout):
        return False, done.stdout + "\n[the output differs from the block shown after it]", seconds
    return True, done.stdout, seconds


def check_page(path: Path, *, timeout: float, out=sys.stdout) -> int:  # type: ignore[no-untyped-def]
    """Run a page's blocks in a fresh folder; returns the number of failures."""
    failures = 0
    with tempfile.TemporaryDirectory(prefix="docs-check-") as tmp:
        workdir = Path(tmp)
        for name in LINKED:
            (workdir / name).symlink_to(ROOT / name)
        for block in blocks(path):
            where = f"{path}:{block.line} ({block.lang})"
            if block.skip is not None:
                print(f"SKIP {where}: {block.skip}", file=out, flush=True)
                continue
            passed, printed, seconds = run_block(block, workdir, timeout)
            if passed:
                print(f"ok   {where} {seconds:.1f} s", file=out, flush=True)
                continue
            failures += 1
            print(f"FAIL {where} {seconds:.1f} s\n--- the block:\n{block.text}--- printed:\n{printed}", file=out, flush=True)
            if block.expected is not None:
                print(f"--- shown:\n{block.expected}", file=out, flush=True)
    return failures


def main(argv: list[str] | None = None) -> int:
    """Check the pages given; exit code 1 when a block failed."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("pages", nargs="+", type=Path)
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per block (default 600)")
    parser.add_argument("--list", action="store_true", help="list the blocks and skip reasons; run nothing")
    parser.add_argument("--figures", action="store_true",
                        help="list the prose's figures without a date (exit code 1 when there is one); run nothing")
    args = parser.parse_args(argv)
    if args.figures:
        undated = [(page, number, sentence) for page in args.pages for number, sentence in undated_figures(page)]
        for page, number, sentence in undated:
            print(f"{page}:{number}: {sentence}")
        print(f"docs-check: {len(undated)} figure(s) without a date" if undated else "docs-check: every figure is dated")
        return 1 if undated else 0
    if args.list:
        for page in args.pages:
            for block in blocks(page):
                state = f"skip: {block.skip}" if block.skip else ("runs, output compared" if block.expected else "runs")
                print(f"{page}:{block.line} ({block.lang}) {state}")
        return 0
    failures = sum(check_page(page, timeout=args.timeout) for page in args.pages)
    print(f"docs-check: {failures} failed block(s)" if failures else "docs-check: every block ran as shown")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
