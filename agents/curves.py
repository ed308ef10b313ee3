"""Learning curves as numbers, read from run directories (their ``metrics.csv``): each run's columns
(``read_metrics``), a group of runs (its seeds) as the mean, min and max at the env steps where every one of
them evaluated (``mean_curve``: no value is carried forward or interpolated), notes on what such a mean leaves
out (``group_notes``) and the markdown results table (``results_table``). ``her-plot`` (``her_agents.plot``)
draws and prints them; no matplotlib here.
"""

from __future__ import annotations

import csv
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

__all__ = ["group_notes", "mean_curve", "read_metrics", "read_runs", "results_table"]


def read_metrics(run_dir: str | Path) -> dict[str, np.ndarray]:
    """Columns of ``<run_dir>/metrics.csv`` (or a CSV path) as float arrays (empty cells are NaN).

    Raises:
        FileNotFoundError: no metrics.csv there.
        ValueError: it has no rows; a row with another number of fields than the header; a cell that is not a
            number; a success rate outside [0, 1]; env_steps empty or not increasing (file, line and column named).
    """
    path = Path(run_dir)
    if path.is_dir():
        path = path / "metrics.csv"
    if not path.is_file():
        raise FileNotFoundError(f"no metrics.csv at {path}")
    try:  # utf-8-sig: a CSV saved by a spreadsheet starts with a byte-order mark
        with open(path, newline="", encoding="utf-8-sig") as f:
            reader = csv.DictReader(f)
            columns = reader.fieldnames or []
            rows = [(reader.line_num, r) for r in reader]
    except (UnicodeDecodeError, csv.Error) as exc:
        raise ValueError(f"{path} is not a metrics CSV ({exc})") from None
    except OSError as exc:
        raise ValueError(f"{path} cannot be read ({exc.strerror or type(exc).__name__})") from None
    missing = [c for c in ("env_steps", "wall_time") if c not in columns]
    if missing:
        raise ValueError(f"{path} is not a metrics CSV (expected the columns env_steps and wall_time, got "
                         f"{columns[:4]})")
    if not rows:
        raise ValueError(f"{path} has no rows (no evaluation finished yet?)")
    out = {k: np.full(len(rows), np.nan) for k in columns}
    for i, (line, r) in enumerate(rows):
        if None in r or None in r.values():
            raise ValueError(f"{path}, line {line}: expected {len(columns)} fields (the header's), got "
                             f"{len(columns) + len(r.get(None, [])) - sum(v is None for v in r.values())}")
        for k in columns:
            if r[k] == "":
                continue
            try:
                out[k][i] = float(r[k])
            except ValueError:
                raise ValueError(f"{path}, line {line}, column {k}: expected a number, got {r[k]!r}") from None
            if k.endswith("success_rate") and not 0 <= out[k][i] <= 1:
                raise ValueError(f"{path}, line {line}, column {k}: expected a rate in [0, 1], got {r[k]}")
    steps = out["env_steps"]
    bad = np.flatnonzero(~np.isfinite(steps) | (np.diff(steps, prepend=-np.inf) <= 0))
    if bad.size:
        line = rows[bad[0]][0]
        raise ValueError(f"{path}, line {line}, column env_steps: expected a number larger than the row before's, "
                         f"got {rows[bad[0]][1]['env_steps'] or 'an empty cell'}")
    return out


def read_runs(dirs: Sequence[str | Path], metric: str) -> list[dict[str, np.ndarray]]:
    """``read_metrics`` of each run, which must have the column ``metric``.

    Raises:
        FileNotFoundError, ValueError: as ``read_metrics``; a run without ``metric``.
    """
    runs = [read_metrics(d) for d in dirs]
    for d, r in zip(dirs, runs):
        if metric not in r:
            raise ValueError(f"{d}: metrics.csv has no column {metric!r}; it has {', '.join(r)}")
    return runs


def _common_steps(runs: list[dict[str, np.ndarray]]) -> np.ndarray:
    """The env steps at which every run evaluated, ascending."""
    steps = np.unique(runs[0]["env_steps"])
    for r in runs[1:]:
        steps = np.intersect1d(steps, r["env_steps"])
    return steps


def _at_steps(r: dict[str, np.ndarray], steps: np.ndarray, key: str) -> np.ndarray:
    """Column ``key`` of run ``r`` at the env steps ``steps`` (each one of its evaluations; the last row of a
    step counts)."""
    row = {s: i for i, s in enumerate(r["env_steps"])}
    return np.array([r[key][row[s]] for s in steps])


def mean_curve(runs: list[dict[str, np.ndarray]], y_key: str, label: str = "runs") -> tuple[np.ndarray, ...]:
    """The env steps at which every run evaluated, and there the runs' mean wall time and the mean, min and max
    of ``y_key``: ``(steps, wall_time, mean, min, max)``, float arrays of shape ``[S]`` for the ``S`` common
    env steps (ascending; wall time in seconds). ``label`` names the group in the error.

    Raises:
        ValueError: the runs have no env step in common.
    """
    steps = _common_steps(runs)
    if not steps.size:
        firsts = ", ".join(_steps_label(r["env_steps"][0]) for r in runs)
        raise ValueError(f"label {label!r}: its runs have no env step at which all of them evaluated (first "
                         f"evaluations at {firsts}); give them separate --label names")
    ys = np.stack([_at_steps(r, steps, y_key) for r in runs])
    wall = np.stack([_at_steps(r, steps, "wall_time") for r in runs]).mean(0)
    return steps, wall, ys.mean(0), ys.min(0), ys.max(0)


def _run_env_id(run: str | Path) -> str | None:
    """The ``env.id`` of a run's ``config.yaml`` (beside its metrics.csv), None where there is none to read."""
    import yaml

    path = Path(run)
    cfg = (path if path.is_dir() else path.parent) / "config.yaml"
    try:
        env_id = yaml.safe_load(cfg.read_text())["env"]["id"]
    except (OSError, yaml.YAMLError, TypeError, KeyError, UnicodeDecodeError):
        return None
    return env_id if isinstance(env_id, str) else None


def group_notes(groups: Mapping[str, Sequence[str | Path]]) -> list[str]:
    """Lines for the user about the labels' means: a label whose runs are of different env ids (read from each
    run's ``config.yaml``; the mean would average different tasks), and one whose runs evaluated at different
    env steps (its mean leaves out the evaluations not every run has).

    Raises:
        FileNotFoundError, ValueError: as ``read_metrics``.
    """
    notes = []
    for label, dirs in groups.items():
        env_ids: dict[str, list[str]] = {}
        for d in dirs:
            env_id = _run_env_id(d)
            if env_id is not None:
                env_ids.setdefault(env_id, []).append(Path(d).name)
        if len(env_ids) > 1:
            mixed = "; ".join(f"{e}: {', '.join(names)}" for e, names in env_ids.items())
            notes.append(f"her-plot: warning: label {label!r} mixes env ids ({mixed}); its mean averages different "
                         "tasks (give each env its own --label)")
        if len(dirs) < 2:
            continue
        runs = [read_metrics(d) for d in dirs]
        steps = _common_steps(runs)
        left_out = sum(len(r["env_steps"]) for r in runs) - len(runs) * len(steps)
        if steps.size and left_out:
            notes.append(f"her-plot: label {label!r}: the mean of its {len(runs)} runs is taken at the {steps.size} "
                         f"env steps where all of them evaluated ({_steps_label(steps[0])} to "
                         f"{_steps_label(steps[-1])}); {left_out} evaluation(s) of single runs are left out")
    return notes


def _steps_to(r: dict[str, np.ndarray], level: float, metric: str) -> float:
    hit = np.flatnonzero(r[metric] >= level)
    return float(r["env_steps"][hit[0]]) if hit.size else np.nan


def _step_at(r: dict[str, np.ndarray], step: float) -> float:
    """The env steps of the last evaluation at or before ``step`` (NaN if the run ended earlier or had no
    evaluation by then)."""
    before = r["env_steps"][r["env_steps"] <= step]
    if r["env_steps"].max() < step or not before.size:
        return np.nan
    return float(before.max())


def _at(r: dict[str, np.ndarray], step: float, metric: str) -> float:
    """The value of the last evaluation at or before ``step`` (NaN if the run ended earlier or had no evaluation
    by then)."""
    at = _step_at(r, step)
    return np.nan if np.isnan(at) else float(_at_steps(r, np.array([at]), metric)[0])


def _steps_label(v: float) -> str:
    """Env steps as ``1M``, ``200k``, ``1.5k`` or ``500`` (never rounded to another step count)."""
    return f"{v / 1e6:g}M" if v >= 1e6 else f"{v / 1e3:g}k" if v >= 1000 else f"{v:g}"


def results_table(groups: Mapping[str, Sequence[str | Path]], at: list[float], levels: tuple[float, ...] = (0.5, 0.9),
                  metric: str = "eval/success_rate") -> str:
    """A markdown table, one row per run and one mean row per group of several: env steps to reach each of
    ``levels`` (first evaluation at or above it; "-" if never), ``metric`` at the env steps ``at`` (the last
    evaluation at or before it; "-" before the first or after the last), the run's last env steps and its wall
    time (minutes). A mean row gives the crossings of the group's mean, which exists only at the env steps where
    every run of the group evaluated (the plot's curve), and at each of ``at`` the mean of the run cells above
    it where they all come from one such step ("-" where they come from different steps).

    Raises:
        FileNotFoundError, ValueError: as ``read_metrics``; a group whose runs have no env step in common.
    """
    def fmt_steps(v: float) -> str:
        return "-" if np.isnan(v) else _steps_label(v)

    def fmt(v: float) -> str:
        return "-" if np.isnan(v) else f"{v:.2f}"

    head = (["run"] + [f"to {lv:g}" for lv in levels] + [f"at {_steps_label(a)}" for a in at]
            + ["env steps", "wall min"])
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for label, dirs in groups.items():
        runs = read_runs(dirs, metric)
        rows = []
        for d, r in zip(dirs, runs):
            vals = [_steps_to(r, lv, metric) for lv in levels] + [_at(r, a, metric) for a in at]
            rows.append(vals + [r["env_steps"].max(), r["wall_time"].max() / 60])
            cells = [Path(d).name] + [fmt_steps(v) for v in vals[: len(levels)]] + [fmt(v) for v in vals[len(levels):]]
            lines.append("| " + " | ".join(cells + [fmt_steps(rows[-1][-2]), f"{rows[-1][-1]:.0f}"]) + " |")
        if len(runs) > 1:  # the mean curve's crossings and values, as for one run
            steps, _, mean, _, _ = mean_curve(runs, metric, label)
            mean_run = {"env_steps": steps, metric: mean}
            vals = [_steps_to(mean_run, lv, metric) for lv in levels]
            for a in at:  # the mean of the cells above, where they all come from one evaluation step
                used = {_step_at(r, a) for r in runs}
                vals.append(_at(mean_run, a, metric) if len(used) == 1 and not np.isnan(min(used)) else np.nan)
            cells = [f"**{label}: mean of {len(runs)}**"] + [fmt_steps(v) for v in vals[: len(levels)]]
            cells += [fmt(v) for v in vals[len(levels):]] + ["", f"{np.mean([row[-1] for row in rows]):.0f}"]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
