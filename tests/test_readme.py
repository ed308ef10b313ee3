"""The README is the front page: under 16 KB, its first commands are the contract (set-up, main job, tests), and
it links the docs pages. Its Python example runs in ``tests/test_docs.py`` with the docs' examples."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"

_BASH = re.compile(r"^```bash\n(.*?)^```", re.M | re.S)
SETUP = re.compile(r'python3 -m venv \.venv && \. \.venv/bin/activate && pip install torch==[\d.]+ && '
                   r'pip install -e "\.\[test[\w,]*\]"')


def test_readme_is_a_front_page():
    assert README.stat().st_size < 16 * 1024, f"README.md is {README.stat().st_size} bytes; move detail to docs/"


def test_readme_first_commands_are_the_contract():
    first = [block.strip() for block in _BASH.findall(README.read_text())[:3]]
    assert len(first) == 3 and SETUP.fullmatch(first[0]), first[:1]
    assert first[1:] == ["her-train", "pytest -q -n 2"], first


def test_readme_links_the_docs_pages():
    text = README.read_text()
    linked = set(re.findall(r"\]\(docs/([\w-]+\.md)", text))
    pages = {p.name for p in (ROOT / "docs").glob("*.md")}
    assert pages - linked == set(), f"README.md does not link docs/{sorted(pages - linked)}"
    assert linked <= pages, sorted(linked - pages)
