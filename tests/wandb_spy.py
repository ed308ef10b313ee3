"""What a run handed to W&B, read through W&B's public API only: a spy around ``wandb.init`` for tests.

``install(path)`` wraps ``wandb.init``: the runs it returns are W&B's own (offline or online, as the run asks),
and each ``log``, ``summary`` assignment and ``finish`` call on them is first appended to ``path``, one JSON line
each, written at once (it survives a SIGKILL of the process). Run as a script, ``python tests/wandb_spy.py
ARGS...`` is ``her-train ARGS...`` with the spy writing to ``$HER_WANDB_SPY`` (no spy when unset).

W&B's service buffers what it is handed, so what W&B holds of a process killed before its ``finish`` returned is
not known: ``history`` gives W&B's history for either extreme, every row of such a process lost (``"lost"``) or
every row kept (``"kept"``); whatever W&B really kept lies in between.
"""

from __future__ import annotations

import json
import math
import numbers
import os
import sys
from pathlib import Path
from typing import Any

__all__ = ["ENV", "differences_from_csv", "events", "finishes", "history", "install", "summary"]

#: the environment variable naming the spy's file for the script
ENV = "HER_WANDB_SPY"


def _jsonable(value: Any) -> Any:
    if isinstance(value, (str, bool, type(None))):
        return value
    if isinstance(value, numbers.Integral):  # numpy's integers too
        return int(value)
    if isinstance(value, numbers.Real):
        return float(value)
    return f"<{type(value).__name__}>"  # media


class _Writer:
    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    def __call__(self, run_id: str, event: str, **data: Any) -> None:
        line = json.dumps({"pid": os.getpid(), "run": run_id, "event": event, **data})
        with open(self.path, "a") as f:
            f.write(line + "\n")


class _Summary:
    def __init__(self, run: Any, write: _Writer) -> None:
        self._run, self._write = run, write

    def __setitem__(self, key: str, value: Any) -> None:
        self._write(self._run.id, "summary", key=key, value=_jsonable(value))
        self._run.summary[key] = value

    def __getitem__(self, key: str) -> Any:
        return self._run.summary[key]


class _SpyRun:
    """A W&B run whose ``log``, ``summary[...] = ...`` and ``finish`` are written down first."""

    def __init__(self, run: Any, write: _Writer) -> None:
        self._run, self._write = run, write
        self.summary = _Summary(run, write)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._run, name)

    def log(self, data: dict[str, Any], *args: Any, **kwargs: Any) -> None:
        self._write(self._run.id, "log", row={k: _jsonable(v) for k, v in data.items()})
        self._run.log(data, *args, **kwargs)

    def finish(self, exit_code: int | None = None) -> None:
        self._write(self._run.id, "finish", exit_code=exit_code)
        self._run.finish(exit_code=exit_code)
        self._write(self._run.id, "finished")  # W&B has saved every row this process handed over


def install(path: str | Path, monkeypatch: Any = None) -> Path:
    """Wrap ``wandb.init`` (through ``monkeypatch.setattr`` when given) so its runs write to ``path``."""
    import wandb

    write, real = _Writer(path), wandb.init

    def init(*args: Any, **kwargs: Any) -> Any:
        run = real(*args, **kwargs)
        write(run.id, "init", mode=kwargs.get("mode"), resume=kwargs.get("resume"))
        return _SpyRun(run, write)

    if monkeypatch is not None:
        monkeypatch.setattr(wandb, "init", init)
    else:
        wandb.init = init
    return Path(path)


def events(path: str | Path, run_id: str | None = None) -> list[dict[str, Any]]:
    """Every event written to ``path`` (of W&B run ``run_id`` if given), in order."""
    p = Path(path)
    lines = p.read_text().splitlines() if p.exists() else []
    return [e for e in map(json.loads, lines) if run_id is None or e["run"] == run_id]


def history(path: str | Path, run_id: str, model: str = "lost") -> list[dict[str, Any]]:
    """The evaluation rows (those with ``eval/success_rate``) W&B run ``run_id`` holds, in the order handed over.

    Args:
        model: what W&B kept of a process that did not finish: ``"lost"`` (nothing: only the rows of the processes
            whose ``finish`` returned) or ``"kept"`` (every row handed over).
    """
    if model not in ("lost", "kept"):
        raise ValueError(f"model must be 'lost' or 'kept', got {model!r}")
    evs = events(path, run_id)
    finished = {e["pid"] for e in evs if e["event"] == "finished"}
    return [e["row"] for e in evs if e["event"] == "log" and "eval/success_rate" in e["row"]
            and (model == "kept" or e["pid"] in finished)]


def finishes(path: str | Path, run_id: str) -> list[tuple[int | None, bool]]:
    """``(exit_code, returned)`` of each ``finish`` of W&B run ``run_id``, in order."""
    evs = events(path, run_id)
    finished = {e["pid"] for e in evs if e["event"] == "finished"}
    return [(e["exit_code"], e["pid"] in finished) for e in evs if e["event"] == "finish"]


def summary(path: str | Path, run_id: str) -> dict[str, Any]:
    """The summary keys the run set explicitly (``run_status``, ``error``), the last value of each."""
    return {e["key"]: e["value"] for e in events(path, run_id) if e["event"] == "summary"}


def differences_from_csv(path: str | Path, run_id: str, csv_rows: list[dict[str, str]]) -> list[str]:
    """What keeps W&B run ``run_id``'s history from holding each ``metrics.csv`` row (``csv.DictReader`` rows) at
    least once and nothing else, under both models of ``history``: a row missing, a row of an ``env_steps``
    not in the CSV, a row whose values differ from the CSV row of its ``env_steps``. Empty: none."""
    by_step = {int(r["env_steps"]): r for r in csv_rows}
    problems = []
    for model in ("lost", "kept"):
        rows = history(path, run_id, model)
        missing = sorted(set(by_step) - {int(r["env_steps"]) for r in rows})
        if missing:
            problems.append(f"{model}: no row at env_steps {missing}")
        for row in rows:
            steps = int(row["env_steps"])
            if steps not in by_step:
                problems.append(f"{model}: a row at env_steps {steps}, which metrics.csv does not have")
                continue
            cells = by_step[steps]
            for key in set(row) | {k for k, v in cells.items() if v != ""}:
                value, cell = row.get(key), cells.get(key, "")
                empty = value is None or (isinstance(value, float) and math.isnan(value))
                if empty != (cell == "") or (not empty and not math.isclose(float(cell), value, rel_tol=1e-12)):
                    problems.append(f"{model}: env_steps {steps}: {key} is {value!r} in W&B, {cell!r} in metrics.csv")
    return problems


if __name__ == "__main__":
    if os.environ.get(ENV):
        install(os.environ[ENV])
    from her_agents.cli import train_main

    sys.exit(train_main(sys.argv[1:]))
