"""``her-plot``: learning curves from run directories (their ``metrics.csv``), mean and spread over seeds.

    her-plot runs/push-s0 runs/push-s1 runs/push-s2 --label "DDPG" --out push.png
    her-plot runs/a-s* --label A  runs/b-s* --label B --out compare.png

Runs given before a ``--label`` form one curve (their seeds); each curve is drawn as the mean over its runs
with a band from the min to the max, against env steps and against wall time, into one PNG with two panels.
"""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

import numpy as np

__all__ = ["build_parser", "main", "plot_curves", "read_metrics", "results_table"]


def read_metrics(run_dir: str | Path) -> dict[str, np.ndarray]:
    """Columns of ``<run_dir>/metrics.csv`` (or a CSV path) as float arrays (empty cells are NaN).

    Raises:
        FileNotFoundError: no metrics.csv there.
        ValueError: it has no rows, or a cell is not a number.
    """
    path = Path(run_dir)
    if path.is_dir():
        path = path / "metrics.csv"
    if not path.is_file():
        raise FileNotFoundError(f"no metrics.csv at {path}")
    try:
        with open(path, newline="") as f:
            reader = csv.DictReader(f)
            rows = list(reader)
            columns = reader.fieldnames or []
    except (UnicodeDecodeError, csv.Error) as exc:
        raise ValueError(f"{path} is not a metrics CSV ({exc})") from None
    missing = [c for c in ("env_steps", "wall_time") if c not in columns]
    if missing:
        raise ValueError(f"{path} is not a metrics CSV (expected the columns env_steps and wall_time, got "
                         f"{columns[:4]})")
    if not rows:
        raise ValueError(f"{path} has no rows (no evaluation finished yet?)")
    try:
        return {k: np.array([float(r[k]) if r.get(k) not in (None, "") else np.nan for r in rows]) for k in rows[0]}
    except ValueError as exc:
        raise ValueError(f"{path}: {exc}") from None


def _aggregate(runs: list[dict[str, np.ndarray]], x_key: str, y_key: str) -> tuple[np.ndarray, ...]:
    """Mean, min and max of y over runs on a common x grid (linear interpolation, within every run's range)."""
    xs = [r[x_key] for r in runs]
    hi = min(x.max() for x in xs)
    grid = np.unique(np.concatenate([x[x <= hi] for x in xs]))
    ys = np.stack([np.interp(grid, r[x_key], r[y_key]) for r in runs])
    return grid, ys.mean(0), ys.min(0), ys.max(0)


def plot_curves(groups: dict[str, list[str | Path]], out: str | Path, metric: str = "eval/success_rate",
                title: str | None = None) -> Path:
    """Draw ``metric`` against env steps and wall time (minutes) for each labelled group of runs."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    for label, dirs in groups.items():
        runs = [read_metrics(d) for d in dirs]
        for d, r in zip(dirs, runs):
            missing = [k for k in ("env_steps", "wall_time", metric) if k not in r]
            if missing:
                raise ValueError(f"{d}: metrics.csv has no column {missing[0]!r}; it has {', '.join(r)}")
        for ax, x_key, scale in ((axes[0], "env_steps", 1e-3), (axes[1], "wall_time", 1 / 60)):
            grid, mean, lo, hi = _aggregate(runs, x_key, metric)
            line, = ax.plot(grid * scale, mean, label=f"{label} (n={len(runs)})")
            if len(runs) > 1:
                ax.fill_between(grid * scale, lo, hi, alpha=0.2, color=line.get_color())
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
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def _steps_to(r: dict[str, np.ndarray], level: float, metric: str) -> float:
    hit = np.flatnonzero(r[metric] >= level)
    return float(r["env_steps"][hit[0]]) if hit.size else np.nan


def _at(r: dict[str, np.ndarray], step: float, metric: str) -> float:
    """The value of the last evaluation at or before ``step`` (NaN if the run ended earlier or had no evaluation
    by then)."""
    before = np.flatnonzero(r["env_steps"] <= step)
    if r["env_steps"].max() < step or not before.size:
        return np.nan
    return float(r[metric][before[-1]])


def _steps_label(v: float) -> str:
    """Env steps as ``1M``, ``200k``, ``1.5k`` or ``500`` (never rounded to another step count)."""
    return f"{v / 1e6:g}M" if v >= 1e6 else f"{v / 1e3:g}k" if v >= 1000 else f"{v:g}"


def results_table(groups: dict[str, list[str | Path]], at: list[float], levels: tuple[float, ...] = (0.5, 0.9),
                  metric: str = "eval/success_rate") -> str:
    """A markdown table, one row per run and one mean row per group of several: env steps to reach each of
    ``levels`` (first evaluation at or above it; "-" if never), ``metric`` at the env steps ``at``, the run's
    last env steps and its wall time (minutes)."""
    def fmt_steps(v: float) -> str:
        return "-" if np.isnan(v) else _steps_label(v)

    def fmt(v: float) -> str:
        return "-" if np.isnan(v) else f"{v:.2f}"

    head = (["run"] + [f"to {lv:g}" for lv in levels] + [f"at {_steps_label(a)}" for a in at]
            + ["env steps", "wall min"])
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for label, dirs in groups.items():
        runs = [read_metrics(d) for d in dirs]
        rows = []
        for d, r in zip(dirs, runs):
            vals = [_steps_to(r, lv, metric) for lv in levels] + [_at(r, a, metric) for a in at]
            rows.append(vals + [r["env_steps"].max(), r["wall_time"].max() / 60])
            cells = [Path(d).name] + [fmt_steps(v) for v in vals[: len(levels)]] + [fmt(v) for v in vals[len(levels):]]
            lines.append("| " + " | ".join(cells + [fmt_steps(rows[-1][-2]), f"{rows[-1][-1]:.0f}"]) + " |")
        if len(runs) > 1:  # the mean curve's crossings, and the mean at each step
            grid, mean, _, _ = _aggregate(runs, "env_steps", metric)
            mean_run = {"env_steps": grid, metric: mean}
            vals = [_steps_to(mean_run, lv, metric) for lv in levels]
            vals += [float(np.mean([row[len(levels) + i] for row in rows])) for i in range(len(at))]
            cells = [f"**{label}: mean of {len(runs)}**"] + [fmt_steps(v) for v in vals[: len(levels)]]
            cells += [fmt(v) for v in vals[len(levels):]] + ["", f"{np.mean([row[-1] for row in rows]):.0f}"]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _is_number(token: str) -> bool:
    try:
        float(token)
    except ValueError:
        return False
    return True


def build_parser() -> argparse.ArgumentParser:
    """The ``her-plot`` argument parser (every option's help gives its default).

    ``--label`` is listed for ``--help``; ``main`` splits the run directories into groups at each ``--label``
    itself, since argparse cannot tie an option to the positionals before it.
    """
    parser = argparse.ArgumentParser(
        prog="her-plot", description=__doc__.split("\n\n")[0].replace("``", ""),
        usage="her-plot RUN_DIR [RUN_DIR ...] [--label NAME] [RUN_DIR ... --label NAME] [--out PNG] [--metric M] "
              "[--title T] [--table [STEPS ...]] [--levels L [L ...]]")
    parser.add_argument("items", nargs="*", metavar="RUN_DIR",
                        help="run directories (or metrics.csv paths), each group followed by --label NAME")
    parser.add_argument("--label", metavar="NAME", action="append",
                        help="name of the curve of the run directories before it, repeatable (default: the run "
                             "directory's name for a single run, 'runs' for several)")
    parser.add_argument("--out", default="learning_curves.png", metavar="PNG",
                        help="PNG to write (default: %(default)s)")
    parser.add_argument("--metric", default="eval/success_rate", metavar="M",
                        help="metrics.csv column to plot (default: %(default)s)")
    parser.add_argument("--title", metavar="T", help="figure title (default: none)")
    parser.add_argument("--table", nargs="*", type=float, metavar="STEPS",
                        help="print a markdown table instead of plotting (env steps to 0.5 / 0.9, the metric at "
                             "STEPS; default: plot)")
    parser.add_argument("--levels", nargs="+", type=float, metavar="L",
                        help="with --table: the metric levels whose first crossing the table gives, in env steps "
                             "(default: 0.5 0.9)")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    # --label may appear several times between run directories: split the raw argv ourselves. Run directories
    # before a --label form its group; run directories after the last --label form one more group.
    argv = list(sys.argv[1:] if argv is None else argv)
    groups: dict[str, list[str]] = {}
    pending: list[str] = []
    rest: list[str] = []
    i = 0
    while i < len(argv):
        a = argv[i]
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
            while i < len(argv) and _is_number(argv[i]):
                rest.append(argv[i])
                i += 1
        elif a.startswith("-"):
            rest.append(a)
            i += 1
        else:
            pending.append(a)
            i += 1
    args = parser.parse_args(rest)
    if args.levels is not None and args.table is None:
        parser.error("--levels goes with --table (the plot has no levels)")
    args.levels = args.levels or [0.5, 0.9]
    bad = [lv for lv in args.levels if not np.isfinite(lv)]
    if bad:
        parser.error(f"--levels: expected finite numbers, got {bad[0]}")
    bad = [st for st in args.table or [] if not (np.isfinite(st) and st >= 0)]
    if bad:
        parser.error(f"--table: expected env steps >= 0, got {bad[0]:g}")
    if pending:
        groups.setdefault(Path(pending[0]).name if len(pending) == 1 else "runs", []).extend(pending)
    if not groups:
        parser.error("no run directories given")
    try:
        if args.table is not None:
            from her_agents.cli import print_to_pipe

            return print_to_pipe(results_table(groups, args.table, levels=tuple(args.levels), metric=args.metric))
        out = plot_curves(groups, args.out, args.metric, args.title)
    except (FileNotFoundError, ValueError) as exc:
        parser.error(str(exc))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
