"""Helpers of the command-line tools (``her-train``, ``her-eval``, ``her-plot`` and the analysis scripts in
``scripts/``): an argument parser whose errors are one line, printing into a pipe that may close early, and the
command line of a checkpoint analysis, and the ``--version`` option they share. The tools import these from here, not from a CLI module."""

from __future__ import annotations

import argparse
import functools
import os
import re
import sys
from collections.abc import Callable
from typing import Any, NoReturn

__all__ = ["OneLineErrorParser", "add_version_option", "allocation_failure", "checkpoint_analysis", "cli_entry",
           "package_version", "print_to_pipe"]


def allocation_failure(exc: BaseException) -> str | None:
    """If ``exc`` is torch's allocator refusing memory (CPU: ``RuntimeError ... can't allocate memory: you
    tried to allocate N bytes``; CUDA: ``torch.OutOfMemoryError ... Tried to allocate 1.5 GiB``) or a
    ``MemoryError``: what was asked for, e.g. ``"149.0 GiB on the CPU"`` (``"memory"`` when the message does not
    say); else None."""
    text = str(exc)
    if not (isinstance(exc, MemoryError) or type(exc).__name__ == "OutOfMemoryError"
            or (isinstance(exc, RuntimeError) and ("can't allocate memory" in text or "out of memory" in text))):
        return None
    where = " on the GPU" if ("CUDA" in text or "GPU" in text) else " on the CPU"
    if m := re.search(r"allocate (\d+) bytes", text):
        return f"{int(m.group(1)) / 2**30:.1f} GiB{where}"
    if m := re.search(r"[Tt]ried to allocate ([\d.]+ [KMGT]?i?B)", text):
        return m.group(1) + where
    return "memory" + where


def cli_entry(prog: str) -> Callable[[Callable[..., int]], Callable[..., int]]:
    """Decorate a command's ``main(argv=None) -> int``: a Ctrl-C anywhere in it that nothing inside handles
    (importing torch, loading a checkpoint, evaluating) ends it with the one line ``<prog>: interrupted`` on
    stderr and exit status 130, not a ``KeyboardInterrupt`` traceback."""
    def decorate(main: Callable[..., int]) -> Callable[..., int]:
        @functools.wraps(main)
        def wrapper(*args: Any, **kwargs: Any) -> int:
            try:
                return main(*args, **kwargs)
            except KeyboardInterrupt:
                try:
                    print(f"{prog}: interrupted", file=sys.stderr)
                except OSError:
                    pass
                return 130
        return wrapper
    return decorate


def package_version() -> str:
    """The installed her-robotics version (``importlib.metadata``; the top entry of ``CHANGELOG.md``), or
    ``"unknown"`` where the package is not installed (run from a bare checkout)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("her-robotics")
    except PackageNotFoundError:
        return "unknown"


def add_version_option(parser: argparse.ArgumentParser) -> None:
    """``--version``: print ``<prog> <version>`` and exit 0."""
    parser.add_argument("--version", action="version", version=f"%(prog)s {package_version()}",
                        help="print the installed her-robotics version and exit")


class OneLineErrorParser(argparse.ArgumentParser):
    """An argument parser whose errors are one line (``<prog>: error: ...``, exit status 2), without the usage
    text: the message says what to fix, and ``--help`` shows the usage."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


def print_to_pipe(text: str) -> int:
    """Print ``text`` to stdout and return 0; a reader that closed the pipe early (``| head``) ends it quietly."""
    try:
        print(text)
        sys.stdout.flush()
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error when Python flushes at exit
    return 0


def checkpoint_analysis(description: str, env_prefix: str, episodes: int,
                        argv: list[str] | None = None) -> tuple[argparse.Namespace, dict[str, Any], Any]:
    """The command line of an analysis script of one task: ``CHECKPOINT [--episodes N] [--seed S]``, parsed and
    checked, and the checkpoint loaded.

    Args:
        description: the script's help text (its docstring).
        env_prefix: the env ids the script accepts start with it (``"FetchSlide"``).
        episodes: the default of ``--episodes``.

    Returns:
        the parsed arguments, the checkpoint ([`her_agents.run.checkpoint.load_checkpoint`][]) and its agent
        (built uncompiled on the CPU, one torch thread).

    Exits (status 2, one error line) on a bad flag, a missing or unreadable checkpoint, or another task's run.
    """
    import torch

    from .algos.registry import agent_from_checkpoint
    from .run.checkpoint import load_checkpoint

    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoint", help="checkpoint.pt or a run directory")
    parser.add_argument("--episodes", type=int, default=episodes, help="episodes (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=1000, help="episode i is reset with seed + i (default: "
                        "%(default)s)")
    args = parser.parse_args(argv)
    if args.episodes < 1:
        parser.error(f"--episodes must be >= 1, got {args.episodes}")
    if args.seed < 0:
        parser.error(f"--seed must be >= 0, got {args.seed}")
    try:
        state = load_checkpoint(args.checkpoint)
    except (FileNotFoundError, ValueError) as exc:
        parser.error(str(exc))
    env_id = state["config"]["env"]["id"]
    if not env_id.startswith(env_prefix):
        parser.error(f"{args.checkpoint} is a {env_id} run, not {env_prefix}")
    torch.set_num_threads(1)
    return args, state, agent_from_checkpoint(state, compile=False)
