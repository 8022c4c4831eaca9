"""Issue 50 item 7: a script beside a folder named ``gru4rec`` (a clone of this repository)
imports that folder as a namespace package and fails with Python's own ``ImportError ...
(unknown location)``. No code of the package runs then (a namespace package has no
``__init__``), so the README names the error and the way out, and this test holds the README to
the error a real interpreter prints."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def shadowed_import_error(tmp_path: Path) -> str:
    """The last line a script beside an empty folder named ``gru4rec`` prints (``-S``: no
    site-packages, so no installed gru4rec can win over the folder, as with an editable install
    whose finder comes after the script's folder)."""
    (tmp_path / "gru4rec").mkdir()
    script = tmp_path / "script.py"
    script.write_text("from gru4rec import Config\n")
    proc = subprocess.run([sys.executable, "-S", str(script)], capture_output=True, text=True, cwd=tmp_path,
                          env={"PATH": "/usr/bin:/bin"}, timeout=60)
    assert proc.returncode == 1
    return proc.stderr.strip().splitlines()[-1]


def test_the_readme_names_the_shadowed_import_error_and_the_way_out(tmp_path: Path) -> None:
    error = shadowed_import_error(tmp_path)
    assert error.startswith("ImportError: ") and "(unknown location)" in error
    python_part = (ROOT / "README.md").read_text(encoding="utf-8").split("## Python", 1)[1].split("\n## ", 1)[0]
    paragraphs = [" ".join(p.split()) for p in python_part.split("\n\n")]
    said = [p for p in paragraphs if error.removeprefix("ImportError: ") in p]
    assert len(said) == 1, "the README's Python section should quote the error in one paragraph"
    assert "folder named `gru4rec`" in said[0] and "from another folder" in said[0]
