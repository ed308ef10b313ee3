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


def test_mypy_checks_every_product_package():
    """`mypy` (in .ci/run) reads its folders from pyproject.toml: each product package is among them, and the
    mapping of the installed name `her_envs` (which agents/ imports) to envs/ is on its path."""
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11

    mypy = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mypy"]
    assert sorted(mypy["files"]) == ["agents", "envs", "her"]
    assert (ROOT / mypy["mypy_path"] / "her_envs" / "__init__.pyi").is_file()
    assert "\nmypy\n" in (ROOT / ".ci" / "run").read_text()


def test_no_product_module_is_over_500_lines():
    """Each module of the product packages fits in 500 lines (split by concern above that)."""
    sizes = {str(p.relative_to(ROOT)): len(p.read_text().splitlines())
             for package in ("her", "agents", "envs") for p in (ROOT / package).rglob("*.py")}
    assert len(sizes) > 50
    assert {name: n for name, n in sizes.items() if n > 500} == {}
