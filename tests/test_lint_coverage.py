"""ruff lints every tracked Python file: no product folder is skipped as build output (ruff excludes folders named
``dist``, ``build``, ... by default, which once hid ``agents/dist/``)."""
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(shutil.which("ruff") is None or not (ROOT / ".git").exists(), reason="needs ruff and a git checkout")
def test_ruff_sees_every_tracked_python_file():
    tracked = subprocess.run(["git", "ls-files", "*.py"], cwd=ROOT, capture_output=True, text=True, check=True)
    linted = subprocess.run(["ruff", "check", ".", "--show-files"], cwd=ROOT, capture_output=True, text=True,
                            check=True)
    seen = {Path(line.strip()).resolve() for line in linted.stdout.splitlines() if line.strip().endswith(".py")}
    missed = sorted(p for p in tracked.stdout.split() if (ROOT / p).resolve() not in seen)
    assert not missed, f"ruff skips {missed}"
