"""Read back a W&B run file (``run-<id>.wandb``), for tests: see ``agents/run/wandb_history.py``."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from her_agents.run.wandb_history import final_state, history_rows, read_records, run_files

__all__ = ["final_state", "final_state_once_written", "history_rows", "read_records", "read_until", "run_files"]

T = TypeVar("T")


def read_until(read: Callable[[], T], done: Callable[[T], bool], timeout: float = 60.0) -> T:
    """``read()`` again until ``done(result)`` or ``timeout`` seconds have passed; the last result. For runs
    finished in this process: W&B's service process writes the transaction log after ``run.finish`` returns (it
    flushes at the latest when the process exits)."""
    deadline = time.monotonic() + timeout
    while True:
        result = read()
        if done(result) or time.monotonic() > deadline:
            return result
        time.sleep(0.2)


def final_state_once_written(path: str | Path, timeout: float = 60.0) -> tuple[int | None, dict[str, Any]]:
    """:func:`final_state` of a run finished in this process, once its exit record is written."""
    return read_until(lambda: final_state(path), lambda state: state[0] is not None, timeout)
