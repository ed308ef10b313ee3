"""The README's library programs run as written.

The fenced blocks of the sections named in ``SECTIONS`` are found by their headings and each one is run, as
it stands, in a fresh Python process outside the checkout. A renamed section, an added, removed or
unlabeled block fails here, so every snippet of these sections stays a complete program. The programs carry
their own (small) budgets and their own asserts.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"

#: heading -> number of python blocks it holds (each a complete program)
SECTIONS = {
    "## The replay library in your own code": 2,
    "### With Stable-Baselines3": 1,
}

_FENCE = re.compile(r"^(`{3,}|~{3,})(.*)$")


def section_blocks(text: str, heading: str) -> list[tuple[str, str]]:
    """``(info string, code)`` of the fenced blocks between ``heading`` and the next heading of any level.

    Lines starting with ``#`` inside fenced blocks are code comments, not headings.

    Raises:
        LookupError: no line equals ``heading``.
    """
    lines = text.splitlines()
    try:
        start = lines.index(heading)
    except ValueError:
        raise LookupError(f"README.md has no heading {heading!r}") from None
    blocks: list[tuple[str, str]] = []
    fence, info, body = None, "", []
    for line in lines[start + 1:]:
        if fence is None:
            m = _FENCE.match(line)
            if m:
                fence, info, body = m.group(1), m.group(2).strip(), []
            elif line.startswith("#"):
                break
        elif line.strip() == fence:
            blocks.append((info, "\n".join(body) + "\n"))
            fence = None
        else:
            body.append(line)
    assert fence is None, f"unclosed code block in section {heading!r}"
    return blocks


CASES = [(h, i) for h, n in SECTIONS.items() for i in range(n)]


def test_sections_hold_the_expected_python_blocks():
    text = README.read_text()
    for heading, n in SECTIONS.items():
        blocks = section_blocks(text, heading)
        assert [info for info, _ in blocks] == ["python"] * n, (
            f"{heading!r}: expected {n} ```python blocks, found {[info for info, _ in blocks]}; "
            "update SECTIONS when a block is added or removed")


@pytest.mark.parametrize(("heading", "index"), CASES, ids=[f"{h.lstrip('# ')}[{i}]" for h, i in CASES])
def test_readme_program_runs(heading, index, tmp_path):
    info, code = section_blocks(README.read_text(), heading)[index]
    assert info == "python"
    if "stable_baselines3" in code:
        pytest.importorskip("stable_baselines3")
    script = tmp_path / "snippet.py"
    script.write_text(code)
    env = {**os.environ, "WANDB_MODE": "disabled", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
           "PYTHONWARNINGS": "ignore"}
    proc = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, f"README block {heading!r}[{index}] failed:\n{code}\n{proc.stdout}\n{proc.stderr}"
