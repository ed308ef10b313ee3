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


def _run_config(run: str | Path) -> dict | None:
    """A run's ``config.yaml`` (beside its metrics.csv) as a dict, None where there is none to read."""
    import yaml

    path = Path(run)
    cfg = (path if path.is_dir() else path.parent) / "config.yaml"
    try:
        loaded = yaml.safe_load(cfg.read_text())
    except (OSError, yaml.YAMLError, UnicodeDecodeError):
        return None
    return loaded if isinstance(loaded, dict) else None


def _run_env_id(run: str | Path) -> str | None:
    """The ``env.id`` of a run's ``config.yaml`` (beside its metrics.csv), None where there is none to read."""
    env = (_run_config(run) or {}).get("env")
    env_id = env.get("id") if isinstance(env, dict) else None
    return env_id if isinstance(env_id, str) else None


def _run_updates_per_step(run: str | Path) -> float | None:
    """The ``train.updates_per_step`` of a run's ``config.yaml`` as stored (updates per env step on average;
    ``train.update_every`` only groups them into blocks), None where there is no finite number to read."""
    train = (_run_config(run) or {}).get("train")
    value = train.get("updates_per_step") if isinstance(train, dict) else None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not np.isfinite(value):
        return None
    return float(value)


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
    """The env steps of the first evaluation with ``metric`` at or above ``level`` (NaN if none)."""
    hit = np.flatnonzero(r[metric] >= level)
    return float(r["env_steps"][hit[0]]) if hit.size else np.nan


def _slowest_wall_at(runs: list[dict[str, np.ndarray]], step: float) -> float:
    """The largest ``wall_time`` (seconds) of ``runs`` at env step ``step``, where every one of them evaluated:
    when the slowest seed got there. NaN if ``step`` is NaN or a run's wall time there is an empty cell."""
    if np.isnan(step):
        return np.nan
    return float(np.max([_at_steps(r, np.array([step]), "wall_time")[0] for r in runs]))


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
    """A markdown table, one row per run and one mean row per group of several. Its columns:

    - ``to L`` for each of ``levels``: the env steps of the first evaluation with ``metric`` at or above ``L``
      ("-" if never);
    - ``min to L`` for each of ``levels``: the wall time in minutes (``metrics.csv``'s ``wall_time`` / 60, one
      decimal) at that same evaluation ("-" if never, or where its ``wall_time`` cell is empty);
    - ``at S`` for each of ``at``: ``metric`` at the last evaluation at or before ``S`` env steps ("-" before the
      first or after the last);
    - ``env steps``: the run's last env steps; ``wall min``: its last wall time in minutes (rounded);
    - ``updates/step``: ``train.updates_per_step`` of the run's ``config.yaml`` as stored ("-" where there is
      none to read).

    A mean row is read from the group's mean curve, which exists only at the env steps where every run of the
    group evaluated (the plot's curve): ``to L`` is the first such step where the mean reaches ``L``, and
    ``min to L`` the wall time there of the slowest run (the largest of the runs' ``wall_time`` at that step:
    when the last seed got there). At each of ``at`` it gives the mean of the run cells above it where they all
    come from one such step ("-" where they come from different steps); ``wall min`` is the mean of the runs';
    ``updates/step`` is shown where all its runs have the same, else left blank.

    Raises:
        FileNotFoundError, ValueError: as ``read_metrics``; a group whose runs have no env step in common.
    """
    def fmt_steps(v: float) -> str:
        return "-" if np.isnan(v) else _steps_label(v)

    def fmt_minutes(seconds: float) -> str:
        return "-" if np.isnan(seconds) else f"{seconds / 60:.1f}"

    def fmt(v: float) -> str:
        return "-" if np.isnan(v) else f"{v:.2f}"

    def fmt_updates(v: float | None) -> str:
        return "-" if v is None else f"{v:g}"

    def line(cells: list[str]) -> str:
        return "| " + " | ".join(cells) + " |"

    head = (["run"] + [f"to {lv:g}" for lv in levels] + [f"min to {lv:g}" for lv in levels]
            + [f"at {_steps_label(a)}" for a in at] + ["env steps", "wall min", "updates/step"])
    lines = [line(head), "|" + "---|" * len(head)]
    for label, dirs in groups.items():
        runs = read_runs(dirs, metric)
        updates = [_run_updates_per_step(d) for d in dirs]
        for d, r, u in zip(dirs, runs, updates):
            crossings = [_steps_to(r, lv, metric) for lv in levels]
            cells = [Path(d).name] + [fmt_steps(v) for v in crossings]
            cells += [fmt_minutes(_slowest_wall_at([r], v)) for v in crossings]  # a group of one: its own time
            cells += [fmt(_at(r, a, metric)) for a in at]
            cells += [fmt_steps(r["env_steps"].max()), f"{r['wall_time'].max() / 60:.0f}", fmt_updates(u)]
            lines.append(line(cells))
        if len(runs) > 1:  # the mean curve's crossings and values, as for one run
            steps, _, mean, _, _ = mean_curve(runs, metric, label)
            mean_run = {"env_steps": steps, metric: mean}
            crossings = [_steps_to(mean_run, lv, metric) for lv in levels]
            cells = [f"**{label}: mean of {len(runs)}**"] + [fmt_steps(v) for v in crossings]
            cells += [fmt_minutes(_slowest_wall_at(runs, v)) for v in crossings]
            for a in at:  # the mean of the cells above, where they all come from one evaluation step
                used = {_step_at(r, a) for r in runs}
                cells.append(fmt(_at(mean_run, a, metric) if len(used) == 1 and not np.isnan(min(used)) else np.nan))
            same_updates = updates[0] is not None and len(set(updates)) == 1
            cells += ["", f"{np.mean([r['wall_time'].max() for r in runs]) / 60:.0f}",
                      fmt_updates(updates[0]) if same_updates else ""]
            lines.append(line(cells))
    return "\n".join(lines)
