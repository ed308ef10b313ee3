"""``her-plot``: learning curves from run directories (their ``metrics.csv``), mean and spread over seeds.

    her-plot runs/push-s0 runs/push-s1 runs/push-s2 --label "DDPG" --out push.png
    her-plot runs/a-s* --label A  runs/b-s* --label B --out compare.png

Runs given before a ``--label`` form one curve (their seeds); each curve is drawn as the mean over its runs
with a band from the min to the max, against env steps and against wall time, into one PNG with two panels.
The mean of a label is taken only at the env steps where every one of its runs evaluated (no value is carried
forward or interpolated; the wall-time panel places each such step at the runs' mean wall time), and the table's
mean rows are read from the same points; a line on stderr says when that leaves evaluations out, and warns when
a label's runs are of different env ids (their ``config.yaml``).

The numbers behind the plot and the table (reading ``metrics.csv``, the means over seeds) are
``her_agents.curves``'s; this module draws them and is the command line.
"""

from __future__ import annotations

import argparse
import errno
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .curves import group_notes, mean_curve, read_metrics, read_runs, results_table
from .tools import OneLineErrorParser, add_version_option, cli_entry, print_to_pipe

__all__ = ["build_parser", "check_math_text", "group_notes", "main", "plot_curves", "read_metrics", "results_table"]

DEFAULT_OUT = "learning_curves.png"


def plot_curves(groups: Mapping[str, Sequence[str | Path]], out: str | Path, metric: str = "eval/success_rate",
                title: str | None = None) -> Path:
    """Draw ``metric`` against env steps and wall time (minutes) for each labelled group of runs: the mean at
    the env steps where every run of the group evaluated, with a min-max band.

    Raises:
        FileNotFoundError, ValueError: as ``read_metrics``; a run without ``metric``, a group whose runs
            have no env step in common.
        OSError: ``out`` cannot be written.
    """
    return _save(_figure(groups, metric, title), out)


def _figure(groups: Mapping[str, Sequence[str | Path]], metric: str, title: str | None) -> Any:
    """The figure of ``plot_curves`` (raises as it does, but for the write)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    try:
        for label, dirs in groups.items():
            runs = read_runs(dirs, metric)
            steps, wall, mean, lo, hi = mean_curve(runs, metric, label)
            for ax, x in ((axes[0], steps * 1e-3), (axes[1], wall / 60)):
                line, = ax.plot(x, mean, label=f"{label} (n={len(runs)})",
                                marker="o" if len(x) == 1 else None)  # one evaluation: a point, not an empty line
                if len(runs) > 1:
                    ax.fill_between(x, lo, hi, alpha=0.2, color=line.get_color())
    except BaseException:
        plt.close(fig)
        raise
    axes[0].set_xlabel("env steps (thousands)")
    axes[1].set_xlabel("wall time (minutes)")
    axes[0].set_ylabel(metric)
    if "success" in metric:  # rates: the whole [0, 1] range, so small numbers look small
        axes[0].set_ylim(-0.02, 1.02)
    for ax in axes:
        ax.grid(alpha=0.3)
    axes[0].legend(loc="best", fontsize=8)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return fig


def _save(fig: Any, out: str | Path) -> Path:
    """Write ``fig`` to the PNG ``out`` (its directory created) and close it."""
    import matplotlib.pyplot as plt

    out = Path(out)
    try:
        if out.parent.exists() and not out.parent.is_dir():  # mkdir would say "File exists"
            raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), str(out.parent))
        out.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(out, dpi=110)
    finally:
        plt.close(fig)
    return out


def _write_text(text: str, out: str | Path) -> Path:
    """Write ``text`` (and a final newline) to ``out``, its directory created, through a temporary file; into
    ``out`` itself where it exists and is not a regular file (``/dev/stdout``, a FIFO, ``/dev/full``).

    Raises:
        OSError: ``out`` cannot be written (a full disk, ``/dev/full``: ENOSPC)."""
    out = Path(out)
    if out.parent.exists() and not out.parent.is_dir():  # mkdir would say "File exists"
        raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), str(out.parent))
    out.parent.mkdir(parents=True, exist_ok=True)
    if out.exists() and not out.is_file():  # /dev/stdout, a FIFO: write into it; a rename would replace it
        with open(out, "w") as f:
            f.write(text.rstrip("\n") + "\n")
        return out
    tmp = out.with_name(f".{out.name}.tmp")
    try:
        tmp.write_text(text.rstrip("\n") + "\n")
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
    return out


def _is_number(token: str) -> bool:
    try:
        float(token)
    except ValueError:
        return False
    return True


def _env_steps_arg(token: str) -> float:
    """A ``--table`` step count: a number, or one with the table's own ``k`` / ``M`` suffix (``200k``, ``1.5M``)."""
    scale = {"k": 1e3, "K": 1e3, "M": 1e6}.get(token[-1:], 1.0)
    try:
        return float(token[:-1] if scale != 1.0 else token) * scale
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected env steps such as 200000 or 200k, got {token!r}") from None


def _is_steps(token: str) -> bool:
    try:
        _env_steps_arg(token)
    except argparse.ArgumentTypeError:
        return False
    return True


def build_parser() -> argparse.ArgumentParser:
    """The ``her-plot`` argument parser (every option's help gives its default).

    ``--label`` is listed for ``--help``; ``main`` splits the run directories into groups at each ``--label``
    itself, since argparse cannot tie an option to the positionals before it.
    """
    parser = OneLineErrorParser(
        prog="her-plot", description=__doc__.split("\n\n")[0].replace("``", ""),
        usage="her-plot RUN_DIR [RUN_DIR ...] [--label NAME] [RUN_DIR ... --label NAME] [--out PNG] [--metric M] "
              "[--title T] [--table [STEPS ...]] [--levels L [L ...]]")
    parser.add_argument("items", nargs="*", metavar="RUN_DIR",
                        help="run directories (or metrics.csv paths), each group followed by --label NAME")
    parser.add_argument("--label", metavar="NAME", action="append",
                        help="name of the curve of the run directories before it, repeatable (default: the run "
                             "directory's name for a single run, 'runs' for several)")
    parser.add_argument("--out", metavar="FILE",
                        help="the image to write (default: learning_curves.png); with --table, the file the "
                             "markdown table goes to (default: stdout)")
    parser.add_argument("--metric", default="eval/success_rate", metavar="M",
                        help="metrics.csv column to plot (default: %(default)s)")
    parser.add_argument("--title", metavar="T", help="figure title (default: none)")
    parser.add_argument("--table", nargs="*", type=_env_steps_arg, metavar="STEPS",
                        help="print a markdown table instead of plotting: per run and per label's mean, the env "
                             "steps and wall minutes to each level (to 0.5 / 0.9, min to 0.5 / 0.9; a mean row's "
                             "minutes are its slowest run's at the mean's first crossing), the metric at STEPS "
                             "(e.g. 150000 or 150k), the last env steps, wall minutes and the config's "
                             "train.updates_per_step (default: plot)")
    parser.add_argument("--levels", nargs="+", type=float, metavar="L",
                        help="with --table: the metric levels whose first crossing the table gives, in env steps "
                             "and wall minutes (default: 0.5 0.9)")
    add_version_option(parser)
    return parser


def _split_labels(parser: argparse.ArgumentParser, argv: list[str]) -> tuple[dict[str, list[str]], list[str]]:
    """Split the raw argv into labelled groups of run directories and the options argparse reads.

    ``--label`` may appear several times between run directories: the directories before a ``--label`` form its
    group; those after the last ``--label`` form one more group (named after the directory when there is one)."""
    groups: dict[str, list[str]] = {}
    pending: list[str] = []
    rest: list[str] = []
    i = 0
    while i < len(argv):
        a = argv[i]
        if a == "--":  # the rest are run directories, even those that start with "-"
            pending += argv[i + 1:]
            break
        if a == "--label":
            if i + 1 >= len(argv):
                parser.error("--label needs a NAME")
            if not pending:
                parser.error(f"--label {argv[i + 1]}: no run directories before it")
            groups.setdefault(argv[i + 1], []).extend(pending)
            pending = []
            i += 2
        elif a in ("--out", "--metric", "--title") and i + 1 < len(argv):
            rest += [a, argv[i + 1]]
            i += 2
        elif a in ("--table", "--levels"):  # --table [STEPS ...], --levels L ...: the numbers after it are its own
            rest.append(a)
            i += 1
            if a == "--levels" and i < len(argv) and not _is_number(argv[i]) and not argv[i].startswith("-"):
                parser.error(f"--levels: expected numbers, got {argv[i]!r}")
            while i < len(argv) and (_is_steps(argv[i]) if a == "--table" else _is_number(argv[i])):
                rest.append(argv[i])
                i += 1
        else:
            (rest if a.startswith("-") else pending).append(a)
            i += 1
    if pending:
        groups.setdefault(Path(pending[0]).name if len(pending) == 1 else "runs", []).extend(pending)
    return groups, rest


def _check_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Refuse option values that would print an empty column or write no image; set the default levels."""
    if args.levels is not None and args.table is None:
        parser.error("--levels goes with --table (the plot has no levels)")
    rate = args.metric.endswith("success_rate")
    if args.levels is not None and not rate:  # first crossings upward only mean something for a rate
        parser.error(f"--levels: first crossings are given for success rates, got --metric {args.metric}")
    args.levels = args.levels or ([0.5, 0.9] if rate else [])
    bad = [lv for lv in args.levels if not np.isfinite(lv)]
    if bad:
        parser.error(f"--levels: expected finite numbers, got {bad[0]}")
    bad = [lv for lv in args.levels if "success" in args.metric and not 0 <= lv <= 1]
    if bad:  # a rate never reaches such a level: the column would be all "-"
        parser.error(f"--levels: {args.metric} is a rate in [0, 1], got {bad[0]:g}")
    bad = [st for st in args.table or [] if not (np.isfinite(st) and st >= 0)]
    if bad:
        parser.error(f"--table: expected env steps >= 0, got {bad[0]:g}")
    if args.table is None:
        from matplotlib.backend_bases import FigureCanvasBase

        args.out = args.out or DEFAULT_OUT
        kinds = FigureCanvasBase.get_supported_filetypes()
        suffix = Path(args.out).suffix.lstrip(".").lower()
        if suffix not in kinds:
            parser.error(f"--out {args.out}: expected a file name ending in an image format "
                         f"({', '.join(sorted(kinds))}), got {'.' + suffix if suffix else 'no suffix'}")


def check_math_text(text: str, option: str) -> None:
    """Refuse a text matplotlib would fail to draw: between two unescaped ``$`` it is parsed as math (mathtext),
    and a parse error there otherwise comes out of ``savefig`` as a traceback.

    Raises:
        ValueError: one line naming ``option``, the text and matplotlib's complaint.
    """
    from matplotlib import cbook
    from matplotlib.font_manager import FontProperties
    from matplotlib.mathtext import MathTextParser

    if not cbook.is_math_text(text):
        return
    try:
        MathTextParser("path").parse(text, dpi=72, prop=FontProperties())
    except ValueError as exc:
        why = " ".join(str(exc).split())[:160]
        raise ValueError(f"{option} {text!r}: matplotlib cannot draw the math text between its $ signs ({why}); "
                         f"write \\$ for a literal dollar sign") from None


@cli_entry("her-plot")
def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    groups, rest = _split_labels(parser, list(sys.argv[1:] if argv is None else argv))
    args = parser.parse_args(rest)
    _check_args(parser, args)
    if not groups:
        parser.error("no run directories given (her-plot --help shows the usage)")
    if args.table is None:  # a table prints the labels as they are
        try:
            for label in groups:
                check_math_text(label, "--label")
            check_math_text(args.title or "", "--title")
            check_math_text(args.metric, "--metric")
        except ValueError as exc:
            parser.error(str(exc))
    for label, runs in groups.items():  # the same run twice under one label would count twice in its mean
        seen: dict[Path, str] = {}
        for run in runs:
            key = Path(os.path.realpath(run))  # not resolve(): a symlink loop raises RuntimeError there
            key = key.parent if key.name == "metrics.csv" else key
            if key in seen:
                parser.error(f"--label {label}: run {run} is given twice (also as {seen[key]}); its mean would "
                             "count it twice")
            seen[key] = run
    try:
        for note in group_notes(groups):
            print(note, file=sys.stderr)
        if args.table is not None:
            table = results_table(groups, args.table, levels=tuple(args.levels), metric=args.metric)
            if not args.out:
                return print_to_pipe(table)
        else:
            fig = _figure(groups, args.metric, args.title)
    except (FileNotFoundError, ValueError) as exc:
        parser.error(str(exc))
    try:
        out = _save(fig, args.out) if args.table is None else _write_text(table, args.out)
    except OSError as exc:  # a directory that cannot be written, a full disk
        print(f"her-plot: error: --out {args.out}: cannot write {exc.filename or args.out} "
              f"({exc.strerror or exc})", file=sys.stderr)
        return 1
    return print_to_pipe(f"wrote {out}")  # `--out /dev/stdout | head` closes the pipe first

if __name__ == "__main__":
    sys.exit(main())
