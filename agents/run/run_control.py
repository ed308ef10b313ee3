"""Owning a run directory and stopping a run cleanly.

- [`prepare_run_dir`][her_agents.run.run_control.prepare_run_dir] picks the run directory (``--resume``,
  ``log.run_dir`` or a fresh default name that
  never collides) and refuses a fresh run into a directory that holds another run;
- [`RunDirLock`][her_agents.run.run_control.RunDirLock] keeps two live runs out of one directory
  (``<run_dir>/.lock``, with the owner's pid);
- [`GracefulStop`][her_agents.run.run_control.GracefulStop] turns SIGINT / SIGTERM / SIGHUP into a request the
  training loop answers at the end of an env step (checkpoint, W&B finished as interrupted,
  [`TrainingStopped`][her_agents.run.run_control.TrainingStopped]);
- [`RunFailed`][her_agents.run.run_control.RunFailed]: a fault the run cannot go on from (a dead env worker,
  diverged networks), said in one line with the last checkpoint.
"""

from __future__ import annotations

import fcntl
import os
import signal
import socket
import tempfile
import threading
import time
from pathlib import Path
from types import FrameType
from typing import Any

__all__ = ["LOCK_FILE", "GracefulStop", "LaunchError", "RunDirInUse", "RunDirLock", "RunFailed", "TrainingStopped",
           "launch_int", "prepare_run_dir"]

LOCK_FILE = ".lock"
SIGNAL_STATUS: dict[int, str] = {signal.SIGINT: "interrupted", signal.SIGTERM: "terminated",
                                 signal.SIGHUP: "terminated"}
"""The signals that stop a run cleanly, and the W&B run status of each (SIGHUP: the terminal was closed)."""


class LaunchError(RuntimeError):
    """The process was launched in a way a run cannot start from: torchrun's variables missing or malformed, a
    ``dist.backend`` this machine lacks, a process group that does not form. The message says what to change."""


def launch_int(name: str, default: int) -> int:
    """The integer environment variable ``name`` (set by torchrun: ``WORLD_SIZE``, ``RANK``, ``LOCAL_RANK``);
    ``default`` when unset or empty.

    Raises:
        LaunchError: the variable is not a whole number.
    """
    value = os.environ.get(name, "").strip()
    if not value:
        return default
    try:
        return int(value)
    except ValueError:
        raise LaunchError(f"the environment variable {name} must be a whole number (torchrun sets it), got "
                          f"{value!r}: unset it for a single process") from None


class RunDirInUse(ValueError):
    """The run directory is locked by a live run."""


class RunDirLock:
    """Exclusive ownership of a run directory while a run uses it.

    ``<run_dir>/.lock`` holds ``pid <pid> on <host> since <time>`` of the owner, under a kernel ``flock``: the
    kernel drops the lock when its owner dies (also on SIGKILL), so a lock file left by a dead run is stale and
    simply taken over. The file is kept on release (removing it would let two runs lock different files).

    Raises (``acquire``):
        RunDirInUse: another live process holds the lock (the message names its pid and host).
    """

    def __init__(self, run_dir: str | os.PathLike) -> None:
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / LOCK_FILE
        self._fd: int | None = None

    def acquire(self) -> RunDirLock:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            owner = os.read(fd, 200).decode(errors="replace").strip() or "unknown pid"
            os.close(fd)
            raise RunDirInUse(f"run directory {self.run_dir} is in use by another run ({owner}; lock file "
                              f"{self.path}): wait for it to end, or choose another log.run_dir") from None
        os.ftruncate(fd, 0)
        os.write(fd, f"pid {os.getpid()} on {socket.gethostname()} since {time.strftime('%Y-%m-%d %H:%M:%S')}\n"
                 .encode())
        os.fsync(fd)
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> RunDirLock:
        return self.acquire()

    def __exit__(self, *exc: Any) -> None:
        self.release()


def _holds_run(run_dir: Path) -> str | None:
    """What in ``run_dir`` belongs to a run (for the refusal message), or None."""
    if (run_dir / "checkpoint.pt").exists():
        return "a run's checkpoint.pt"
    if (run_dir / "metrics.csv").exists():
        return "a run's metrics.csv"
    return None


def _check_writable(run_dir: Path) -> None:
    try:
        fd, tmp = tempfile.mkstemp(dir=run_dir, prefix=".write-test.")
        os.close(fd)
        os.unlink(tmp)
    except OSError as exc:
        raise ValueError(f"log.run_dir: cannot write to {run_dir} ({exc.strerror or exc})") from None


def _make_dir(run_dir: Path, exist_ok: bool = True) -> None:
    try:
        run_dir.mkdir(parents=True, exist_ok=exist_ok)
    except FileExistsError:
        if not exist_ok:  # a timestamped name taken: the caller tries the next one
            raise
        raise ValueError(f"log.run_dir: {run_dir} exists and is not a directory") from None
    except OSError as exc:
        raise ValueError(f"log.run_dir: cannot create {run_dir} ({exc.strerror or exc})") from None


def prepare_run_dir(env_id: str, algo: str, seed: int, run_dir: str | None, resume: str | None,
                    overwrite: bool = False) -> RunDirLock:
    """Choose, create and lock the run directory; returns the held lock (``.run_dir`` is the directory).

    - ``resume``: that directory (it holds the checkpoint to continue).
    - ``run_dir`` (``log.run_dir``): created if needed; if it holds a run (``checkpoint.pt`` or ``metrics.csv``)
      a fresh run is refused unless ``overwrite``. Nothing is deleted here: an overwriting run replaces the old
      files as it writes its own (``metrics.csv`` at its first evaluation, ``checkpoint.pt`` at its first
      checkpoint).
    - neither: ``runs/<env>-<algo>-s<seed>-<time>``, with ``-1``, ``-2``, ... appended when that name is taken
      (``mkdir`` is atomic, so two runs started in the same second get different directories).

    Raises:
        ValueError: the directory holds a run and ``overwrite`` is false (names ``--resume`` and
            ``--overwrite``); it cannot be created or written.
        RunDirInUse: a live run holds its lock.
    """
    if resume:
        path = Path(resume)
    elif run_dir:
        path = Path(run_dir)
        _make_dir(path)
    else:
        env_name = env_id.rpartition(":")[2]  # "module.path:EnvId-v0" -> "EnvId-v0"
        base = Path("runs") / f"{env_name}-{algo}-s{seed}-{time.strftime('%Y%m%d-%H%M%S')}"
        for i in range(10_000):
            path = base if i == 0 else base.with_name(f"{base.name}-{i}")
            try:
                _make_dir(path, exist_ok=False)
                break
            except FileExistsError:
                continue
    _check_writable(path)
    lock = RunDirLock(path).acquire()
    held = None if resume or overwrite else _holds_run(path)
    if held:
        lock.release()
        raise ValueError(f"log.run_dir {path} holds {held}: continue that run with `her-train --resume {path}`, "
                         "or start a new one there with `--overwrite` (its files are replaced as the new run "
                         "writes its own)")
    return lock


class TrainingStopped(Exception):
    """Training stopped on SIGINT, SIGTERM or SIGHUP after writing a checkpoint of the current state.

    Attributes: ``signum``, ``run_dir`` (Path), ``env_steps`` (int), ``checkpoint`` (Path or None when
    ``log.checkpoint=false``), ``exit_code`` (128 + signum: 130 for SIGINT, 143 for SIGTERM, 129 for SIGHUP).
    """

    def __init__(self, signum: int, run_dir: Path, env_steps: int, checkpoint: Path | None) -> None:
        self.signum, self.run_dir, self.env_steps, self.checkpoint = signum, run_dir, env_steps, checkpoint
        self.exit_code = 128 + signum
        where = (f"checkpoint {checkpoint}; continue with `her-train --resume {run_dir}`" if checkpoint
                 else "no checkpoint (log.checkpoint=false)")
        super().__init__(f"stopped by {signal.Signals(signum).name} at {env_steps} env steps; {where}")


class RunFailed(RuntimeError):
    """The run stopped on a fault it cannot go on from (an env worker died, the networks diverged), without a
    checkpoint of its own: the last checkpoint written is kept as it was.

    Attributes: ``reason`` (what happened and what to change), ``run_dir`` (Path), ``env_steps`` (int),
    ``checkpoint_steps`` (the env steps of the last checkpoint, None without one), ``resumable`` (whether
    continuing from that checkpoint makes sense), ``exit_code`` (1).
    """

    exit_code = 1

    def __init__(self, reason: str, run_dir: Path, env_steps: int, checkpoint_steps: int | None,
                 resumable: bool = True) -> None:
        self.reason, self.run_dir, self.env_steps = reason, run_dir, env_steps
        self.checkpoint_steps, self.resumable = checkpoint_steps, resumable
        if checkpoint_steps is None:
            where = f"no checkpoint was written yet ({run_dir})"
        elif resumable:
            where = (f"the last checkpoint ({checkpoint_steps} env steps) is intact: continue with "
                     f"`her-train --resume {run_dir}`")
        else:
            where = f"the last checkpoint ({checkpoint_steps} env steps) is kept in {run_dir}"
        super().__init__(f"{reason}; the run stopped at {env_steps} env steps, {where}")


def _terminal_fds() -> list[int]:
    """Which of stdout and stderr are a terminal (asked up front: a hung-up terminal no longer says so)."""
    out = []
    for fd in (1, 2):
        try:
            if os.isatty(fd):
                out.append(fd)
        except OSError:
            pass
    return out


def _detach_terminal(fds: list[int]) -> None:
    """Point ``fds`` (a terminal's) at ``/dev/null``, as ``nohup`` would."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
    except OSError:
        return
    for fd in fds:
        try:
            os.dup2(devnull, fd)
        except OSError:
            pass
    os.close(devnull)


class GracefulStop:
    """While active (a context manager), SIGINT, SIGTERM and SIGHUP set ``signum`` instead of stopping the
    process; the loop checks it after each env step. The first signal is acknowledged at once with a line on
    stderr (with ``announce``), saying what the stop waits for
    ([`busy`][her_agents.run.run_control.GracefulStop.busy]); a second signal raises ``KeyboardInterrupt`` at
    once. SIGHUP (the terminal was closed) first points stdout and stderr that are a terminal at ``/dev/null``:
    writing to a hung-up terminal fails, and the stop must still write its checkpoint. Outside the main thread
    (where Python cannot install handlers) it does nothing."""

    def __init__(self, announce: bool = True) -> None:
        self.signum: int | None = None
        self.announce = announce
        self.busy: str | None = None
        """What the loop is doing that the stop must wait for, e.g. the first update's compile (None: an env
        step)."""
        self._old: dict[int, Any] = {}
        self._terminal: list[int] = []

    @property
    def status(self) -> str:
        """``interrupted`` (SIGINT) or ``terminated`` (SIGTERM, SIGHUP); the W&B run status."""
        return "interrupted" if self.signum is None else SIGNAL_STATUS.get(self.signum, "interrupted")

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.signum is not None:
            raise KeyboardInterrupt
        self.signum = signum
        if signum == signal.SIGHUP:
            _detach_terminal(self._terminal)
        if self.announce:  # os.write: print() could be interrupted mid-write to the same stream
            until = f"once {self.busy} is done" if self.busy else "after the current env step"
            again = "Ctrl-C again" if signum == signal.SIGINT else f"a second {signal.Signals(signum).name}"
            try:
                os.write(2, f"\nher-train: {signal.Signals(signum).name} received: stopping {until} ({again} "
                            "stops at once)\n".encode())
            except OSError:  # a closed stderr must not turn the stop into a crash
                pass

    def __enter__(self) -> GracefulStop:
        if threading.current_thread() is threading.main_thread():
            self._terminal = _terminal_fds()
            for s in SIGNAL_STATUS:
                self._old[s] = signal.signal(s, self._handle)
        return self

    def __exit__(self, *exc: Any) -> None:
        for s, old in self._old.items():
            signal.signal(s, old)
        self._old.clear()
