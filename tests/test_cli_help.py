"""Every option of ``her-train``, ``her-eval``, ``her-plot``, ``her-export`` and ``her-tune`` shows in ``--help`` with a help text, and so
does its default where it has one (flags excepted: their default is to be off)."""

from __future__ import annotations

import argparse
import subprocess
import sys

import pytest

from her_agents.cli import eval_parser, train_parser
from her_agents.plot import build_parser as plot_parser
from her_agents.run.export import export_parser
from her_agents.tune import parser as tune_parser

# How each command is run: the console scripts call these functions.
COMMANDS = {
    "her-train": (train_parser, [sys.executable, "-m", "her_agents.cli", "--help"]),
    "her-eval": (eval_parser, [sys.executable, "-c",
                               "import sys; from her_agents.cli import eval_main; sys.exit(eval_main(['--help']))"]),
    "her-plot": (plot_parser, [sys.executable, "-m", "her_agents.plot", "--help"]),
    "her-export": (export_parser, [sys.executable, "-c",
                                   "import sys; from her_agents.run.export import main; sys.exit(main(['--help']))"]),
    "her-tune": (tune_parser, [sys.executable, "-c",
                               "import sys; from her_agents.tune import main; sys.exit(main(['--help']))"]),
}


def _expanded_help(parser: argparse.ArgumentParser, action: argparse.Action) -> str:
    """``action.help`` with its ``%(...)s`` placeholders filled in, as argparse does."""
    params = {k: v for k, v in vars(action).items() if v is not argparse.SUPPRESS}
    params["prog"] = parser.prog
    return action.help % params


def _words(text: str) -> str:
    return " ".join(text.split())  # --help wraps lines: compare with whitespace collapsed


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_option_and_its_default_shows_in_help(command):
    make_parser, argv = COMMANDS[command]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    shown = _words(proc.stdout)
    assert shown.startswith(f"usage: {command}"), proc.stdout[:200]
    parser = make_parser()
    actions = [a for a in parser._actions if not isinstance(a, argparse._HelpAction)]
    assert actions
    for action in actions:
        name = "/".join(action.option_strings) or action.dest
        assert action.help and action.help is not argparse.SUPPRESS, f"{command} {name}: no help text"
        text = _expanded_help(parser, action)
        assert _words(text) in shown, f"{command} {name}: help text missing from --help:\n{proc.stdout}"
        for opt in action.option_strings:
            assert opt in shown, f"{command}: {opt} not in --help"
        is_flag = isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction))
        if action.default is not None and action.default is not argparse.SUPPRESS and not is_flag:
            assert str(action.default) in text, f"{command} {name}: default {action.default!r} not in {text!r}"


def test_her_plot_help_lists_label_and_output_file():
    parser = plot_parser()
    options = {opt for a in parser._actions for opt in a.option_strings}
    assert {"--label", "--out", "--metric", "--title", "--table"} <= options
    assert "learning_curves.png" in parser.format_help()


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_version_is_the_changelogs_top_release_and_pyprojects(command):
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    top = re.search(r"^## \[(\d+\.\d+\.\d+)\]", (root / "CHANGELOG.md").read_text(), re.M).group(1)
    assert re.search(r'^version = "(.*)"$', (root / "pyproject.toml").read_text(), re.M).group(1) == top
    argv = [part.replace("--help", "--version") for part in COMMANDS[command][1]]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"{command} {top}", proc.stdout
