"""The docs site (``docs/``, ``mkdocs.yml``) and the README: every example runs, every reference resolves.

- Every fenced block of README.md and ``docs/*.md`` names its language, and every ``python`` block is a complete
  program, run as it stands in a fresh Python process outside the checkout (the programs carry their own small
  budgets and asserts). Blocks importing an optional package that is not installed are skipped.
- Every ``her-train`` command line of a ``bash`` block (also after ``torchrun ... -m her_agents.cli``) is
  accepted by ``her-train ... --print-config``: its config name and keys exist and its values pass the checks.
- The generated config reference (``docs/config.md``) matches the config dataclasses
  (``scripts/gen_config_reference.py``).
- ``mkdocs.yml``'s nav lists exactly the pages in ``docs/`` (sub-folders included); repository files the pages name
  exist; every page is reachable from the README (linked there, or from a page it links).
- The packages' docstrings use mkdocstrings cross-references, not Sphinx roles (which render as raw text).
"""

from __future__ import annotations

import ast
import contextlib
import importlib.util
import io
import os
import re
import shlex
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
PAGES = [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]
#: imports a block may need that the test extra does not install -> the package to skip without
OPTIONAL = {"stable_baselines3": "stable_baselines3", "torchrl": "torchrl", "tensordict": "tensordict",
            "her.sb3": "stable_baselines3", "her.torchrl": "torchrl"}
LANGUAGES = {"python", "bash", "yaml", "text", "console", "toml"}

_FENCE = re.compile(r"^(\s*)(`{3,}|~{3,})\s*([^`\s]*)")


def blocks(path: Path) -> list[tuple[int, str, str]]:
    """``(line number, language, code)`` of each fenced block of ``path``.

    Raises:
        AssertionError: an unclosed block.
    """
    out: list[tuple[int, str, str]] = []
    fence = None
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if fence is None:
            m = _FENCE.match(line)
            if m:
                indent, fence, lang, start, body = m.group(1), m.group(2), m.group(3), number, []
        elif line.strip() == fence:
            out.append((start, lang, textwrap.dedent("\n".join(body)) + "\n"))
            fence = None
        else:
            body.append(line[len(indent):] if line.startswith(indent) else line)
    assert fence is None, f"{path.name}: unclosed code block from line {start}"
    return out


def rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


#: ``--8<-- "path"``: a repository file included by pymdownx.snippets (the examples, the changelog)
_SNIPPET = re.compile(r'^\s*-{1,}8<-{1,}\s+"([^"]+)"\s*$', re.M)


def _is_snippet(code: str) -> bool:
    """A block that only includes files: what it runs is tested where the file is (``tests/test_examples.py``)."""
    return all(_SNIPPET.fullmatch(line) for line in code.strip().splitlines())


PYTHON = [(page, line, code) for page in PAGES for line, lang, code in blocks(page)
          if lang == "python" and not _is_snippet(code)]


def her_train_lines() -> list[tuple[str, list[str]]]:
    """``(where, argv)`` of each ``her-train`` command line in the pages' bash blocks (``--resume`` and
    ``--version`` excluded)."""
    out = []
    for page in PAGES:
        for start, lang, code in blocks(page):
            if lang != "bash":
                continue
            for offset, line in enumerate(code.splitlines(), 1):
                words = shlex.split(line, comments=True)
                if words[:1] == ["her-train"]:
                    argv = words[1:]
                elif "her_agents.cli" in words and words[:1] == ["torchrun"]:
                    argv = words[words.index("her_agents.cli") + 1:]
                else:
                    continue
                if "--resume" not in argv and "--version" not in argv:
                    out.append((f"{rel(page)}:{start + offset}", argv))
    return out


HER_TRAIN = her_train_lines()


def test_every_block_names_its_language():
    for page in PAGES:
        for line, lang, _ in blocks(page):
            assert lang in LANGUAGES, (f"{rel(page)}:{line}: a code block needs a language ({sorted(LANGUAGES)}); "
                                       f"got {lang!r}")


def test_the_pages_hold_python_examples():
    assert {rel(page) for page, _, _ in PYTHON} >= {"README.md", "docs/library.md"}


@pytest.mark.parametrize(("page", "line", "code"), PYTHON, ids=[f"{rel(p)}:{n}" for p, n, _ in PYTHON])
def test_python_example_runs(page, line, code, tmp_path):
    imported = set()
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.Import):
            imported |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            imported.add(node.module)
    for name in sorted(imported):
        for prefix, package in OPTIONAL.items():
            if name == prefix or name.startswith(prefix + "."):
                pytest.importorskip(package)
    script = tmp_path / "example.py"
    script.write_text(code)
    env = {**os.environ, "WANDB_MODE": "disabled", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
           "PYTHONWARNINGS": "ignore"}
    proc = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, f"{rel(page)}:{line} failed:\n{code}\n{proc.stdout}\n{proc.stderr}"


def test_the_pages_hold_her_train_commands():
    assert len(HER_TRAIN) >= 5, HER_TRAIN


def test_her_train_commands_are_accepted():
    from her_agents.cli import train_main

    failed = []
    for where, argv in HER_TRAIN:
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = train_main([*argv, "--print-config"])
        if code != 0:
            failed.append(f"{where}: her-train {shlex.join(argv)}: {err.getvalue().strip()}")
    assert not failed, "\n".join(failed)


def test_config_reference_is_fresh():
    spec = importlib.util.spec_from_file_location("gen_config_reference", ROOT / "scripts" / "gen_config_reference.py")
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    page = gen.PAGE.read_text()
    assert gen.render(page, gen.generate()) == page, (
        "docs/config.md is stale (a config dataclass, a field docstring or a configs/*.yaml changed): "
        "run python scripts/gen_config_reference.py")


def test_mkdocs_nav_lists_every_page():
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    assert config["theme"]["name"] == "material"

    def entries(nav):
        for item in nav:
            value = next(iter(item.values())) if isinstance(item, dict) else item
            yield from entries(value) if isinstance(value, list) else [value]

    nav = list(entries(config["nav"]))
    assert sorted(nav) == sorted(p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md")), (
        "mkdocs.yml's nav must list every docs/**/*.md page once (mkdocs build --strict refuses a missing file)")


def test_every_page_is_reachable_from_the_readme():
    """Following the README's links to docs pages, then those pages' links, reaches every page of docs/."""
    seen, todo = set(), [ROOT / "README.md"]
    while todo:
        page = todo.pop()
        for target in _LINK.findall(page.read_text()):
            path = (page.parent / target).resolve()
            if path.suffix == ".md" and path.is_file() and DOCS in path.parents and path not in seen:
                seen.add(path)
                todo.append(path)
    missing = sorted(rel(p) for p in DOCS.rglob("*.md") if p.resolve() not in seen)
    assert not missing, f"not reachable from README.md by links: {missing}"


_ROLE = re.compile(r":(class|meth|func|data|attr|mod|exc|obj):`")


def test_docstrings_use_cross_references_not_sphinx_roles():
    """mkdocstrings renders ``[`Name`][her.Name]`` as a link (and ``mkdocs build --strict`` fails on one whose target
    is not rendered); a Sphinx role such as ``:class:`Name``` would show as raw text on the API pages."""
    found = [f"{rel(f)}:{n}" for folder in ("her", "agents", "envs") for f in sorted((ROOT / folder).rglob("*.py"))
             for n, line in enumerate(f.read_text().splitlines(), 1) if _ROLE.search(line)]
    assert not found, f"Sphinx roles left (write [`Name`][package.Name], or ``Name`` where nothing renders it): {found}"


# `results/push_sac_u05_s0/metrics.csv`, `tests/test_her_*.py`, `docs/semantics.md`: paths in the repository
_PATH = re.compile(r"`((?:results|docs|scripts|tests|examples|configs|her|agents|envs)/[^`\s<>]*)`")
# [text](target) links to local files
_LINK = re.compile(r"\]\((?!https?:|#|mailto:)([^)\s#]+)")


def test_included_files_exist_and_included_examples_are_tested():
    tests = (ROOT / "tests" / "test_examples.py").read_text() + (ROOT / "tests" / "test_custom_env.py").read_text()
    included = [(page, path) for page in PAGES for path in _SNIPPET.findall(page.read_text())]
    assert any(path.startswith("examples/") for _, path in included), "the examples are not shown on any page"
    for page, path in included:
        assert (ROOT / path).is_file(), f"{rel(page)} includes {path}, which does not exist"
        if path.startswith("examples/"):
            assert Path(path).stem in tests, f"{rel(page)} shows {path}, which no test runs"


def test_the_files_the_pages_name_exist():
    missing = []
    for page in PAGES:
        text = page.read_text()
        for path in _PATH.findall(text):
            if not list(ROOT.glob(path.rstrip("/"))):
                missing.append(f"{rel(page)}: `{path}`")
        for target in _LINK.findall(text):
            if not (page.parent / target).exists():
                missing.append(f"{rel(page)}: link to {target}")
        for name in ("ANCHORS.md", "shared/cases"):
            if name in text:
                missing.append(f"{rel(page)}: {name} (not in the repository)")
    assert not missing, "\n".join(missing)
