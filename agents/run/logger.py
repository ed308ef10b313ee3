"""Run logging: one short stdout line per evaluation, ``metrics.csv`` in the run directory, and W&B.

W&B never blocks training: mode ``auto`` picks ``online`` only when an API key is configured (``WANDB_API_KEY``
or a netrc entry), else ``offline`` (files under ``<run_dir>/wandb``; upload later with ``wandb sync``); an
online init that fails (bad key, no network, no answer within ``log.wandb.init_timeout_s``) falls back to
offline with one warning line, and the final upload waits at most ``log.wandb.finish_timeout_s``.
``WANDB_MODE`` in the environment wins over the config.

What W&B holds is known from the run's own files only, never from W&B's private local formats: ``metrics.csv``
has every row, and ``<run_dir>/wandb_saved.json`` (``SAVED_FILE``) the W&B run id and the ``env_steps`` of the
last row W&B has certainly saved. ``run.log`` only hands a row over; W&B's service buffers it (wandb 0.31 writes
its local file every 15 s or by the 32 KiB block, and uploads in batches), so a process killed without
``run.finish()`` (SIGKILL, the out-of-memory killer, a lost machine) can lose any row it handed over, and no
public W&B call says which. A ``run.finish()`` that returns does: every row handed over is then saved (offline on
disk for ``wandb sync``, online uploaded), and the record is written, atomically. A resumed run sends the
``metrics.csv`` rows after the recorded one again, so no row is lost. A row W&B had kept anyway is then there
twice, harmlessly: a row goes to W&B only once its checkpoint is written, so a resume never redoes it and the row
sent again is the same (same ``env_steps``, same values), and every metric is plotted against ``env_steps``
(``define_metric("*", step_metric="env_steps")``), so it is the same point again. A run that ends through
``finish`` (done, SIGINT, SIGTERM, an exception) sends nothing twice.

An evaluation's video (``log.video_every``) follows its row: the file ``<run_dir>/videos/eval_<env_steps>.mp4`` is
written before the checkpoint, W&B gets it after, with the row, and the checkpoint records which evaluations have
one (``video_steps``), so a resume that sends a row again sends its video again, and a resume that redoes an
evaluation never finds its video already sent.
"""

from __future__ import annotations

import contextlib
import codecs
import csv
import io
import json
import math
import os
import shutil
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, cast

from tqdm import tqdm

from ..config import Config, config_dict
from .wandb_mode import check_wandb_env, remove_old_wandb_runs, wandb_mode

__all__ = ["EXIT_CODES", "SAVED_FILE", "NullLogger", "RunLogger", "check_wandb_env", "saved_step", "wandb_mode"]

#: the run's record of what W&B has saved: ``{"run_id": ..., "env_steps": <the last row saved>}``, written when
#: ``run.finish()`` returns (the file ``wandb_sent.json`` of earlier versions recorded rows handed over: ignored)
SAVED_FILE = "wandb_saved.json"


#: how a run ended -> the W&B exit code (a non-zero code marks the W&B run failed)
OFFLINE_INIT_TIMEOUT_S = 120.0  # the least an offline wandb.init may take (seconds)
EXIT_CODES = {"finished": 0, "crashed": 1, "interrupted": 130, "terminated": 143}


def _first_line(exc: BaseException) -> str:
    """``Type: first line of the message`` of an exception, for a one-line warning."""
    return f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [type(exc).__name__])[0]}"


class _InheritedService:
    """The W&B service token (``WANDB_SERVICE``) this process inherited from a parent process (a test runner, a
    notebook that used W&B). While that service is gone every ``wandb.init`` fails until its deadline;
    ``drop`` forgets the token once, so that the next init starts this process's own service."""

    def __init__(self) -> None:
        self.token = os.environ.get("WANDB_SERVICE")

    def drop(self) -> bool:
        """Forget the inherited token if it is still in the environment; whether it was (True at most once)."""
        if self.token is None or os.environ.get("WANDB_SERVICE") != self.token:
            return False
        self.token = None
        os.environ.pop("WANDB_SERVICE")
        import wandb

        with contextlib.suppress(Exception):
            wandb.teardown()  # a connection to the gone service
        return True


class RunLogger:
    """Writes each evaluation row to stdout, ``metrics.csv`` and W&B (``eval/success_rate`` etc.).

    W&B gets a row only once it is safe: after the checkpoint that covers it
    ([`checkpointed`][her_agents.run.logger.RunLogger.checkpointed]), so a run resumed from that checkpoint never
    redoes an evaluation W&B was sent. A resumed run first sends the ``metrics.csv`` rows after the last one its W&B
    run has certainly saved (``SAVED_FILE``, written when ``run.finish()`` returns), so after any stop and
    ``--resume`` W&B holds every row at least once, and twice only the same row at the same ``env_steps`` (after a
    kill that left no time to finish; see the module's docstring). An evaluation's video goes with its row, the same
    way ([`log_video`][her_agents.run.logger.RunLogger.log_video]).
    """

    def __init__(self, cfg: Config, run_dir: Path, resume_id: str | None = None,
                 resume_step: int | None = None, video_steps: Sequence[int] = ()) -> None:
        """``resume_step``: the env steps of the checkpoint a resumed run continues from. ``metrics.csv`` keeps
        its rows up to that step and drops the later ones (logged by the stopped run after its last checkpoint;
        the resumed run logs those evaluations again), so the file has one row per evaluation, in order.
        ``None`` (a fresh run): the first row replaces ``metrics.csv`` (atomically; an old file stays until
        then). ``resume_id``: the W&B run id to continue. ``video_steps``: that checkpoint's record of the
        evaluations (their ``env_steps``) whose video is in ``<run_dir>/videos``."""
        self.cfg, self.run_dir = cfg, Path(run_dir)
        self.csv_path = self.run_dir / "metrics.csv"
        self._fields: list[str] | None = None
        self._fresh_csv = resume_step is None
        self._video_error: str | None = None
        #: the ``env_steps`` of the evaluations whose video this run (and those it resumes) wrote; a checkpoint
        #: records it, so that a row sent again after a resume takes its video along
        self.video_steps: list[int] = [int(s) for s in video_steps]
        self._pending_videos: list[int] = []  # videos not yet covered by a checkpoint
        self._pending: list[dict[str, Any]] = []  # rows not yet covered by a checkpoint
        self._defer = cfg.log.checkpoint
        self._covered_size: int | None = None  # bytes of metrics.csv up to the last covered row (None: no row)
        self._last_sent: int | None = None  # env_steps of the last row this process handed to W&B
        self.mode = wandb_mode(cfg.log.wandb.mode)  # before any file is touched: it may refuse WANDB_MODE
        kept: list[dict[str, Any]] = []
        if resume_step is not None and self.csv_path.exists():
            kept = self._truncate_csv(resume_step)
            if kept:
                self._covered_size = self.csv_path.stat().st_size
        self.run: Any = None  # the W&B run while W&B logs (None: off)
        start = f"resumed at {resume_step} env steps" if resume_step is not None else "new run"
        wandb_where = {"offline": f"W&B offline in {self.run_dir / 'wandb'}", "disabled": "W&B off"}.get(
            self.mode, f"W&B online: starting, up to {cfg.log.wandb.init_timeout_s:g} s, else offline")
        # before wandb.init, which can take its whole init timeout (no network): the user sees where the run goes
        tqdm.write(f"her-train: {start} to {cfg.train.total_env_steps} env steps in {self.run_dir} ({wandb_where})")
        if resume_step is None:  # a fresh run (--overwrite): `wandb sync <run_dir>/wandb/offline-run-*` is its own
            remove_old_wandb_runs(self.run_dir / "wandb")
        if self.mode != "disabled":
            self.run = self._init_wandb(resume_id)
        if self.run is not None:
            self.run.define_metric("env_steps")
            self.run.define_metric("*", step_metric="env_steps")
            if resume_id and kept:
                self._send_unsaved(kept)

    def _init_wandb(self, resume_id: str | None) -> Any:
        """``wandb.init`` in ``self.mode``; an online init that fails (no API key, no network, a server that does
        not answer within ``log.wandb.init_timeout_s``) falls back to offline with one warning line."""
        # W&B answers an imported module it takes for an LLM library (e.g. a user's own `agents`) with a Weave
        # advert; nothing here uses Weave.
        os.environ.setdefault("WANDB_DISABLE_WEAVE", "true")
        os.environ.setdefault("WANDB_SILENT", "true")  # also quiets the login notice printed before init
        import wandb

        w = self.cfg.log.wandb
        kwargs: dict[str, Any] = dict(
            project=w.project, entity=w.entity, tags=list(w.tags), group=w.group, name=w.name or self.run_dir.name,
            dir=str(self.run_dir), config=config_dict(self.cfg), id=resume_id,
            resume="allow" if resume_id else None,
        )
        inherited = _InheritedService()

        def init(mode: str, timeout: float) -> Any:
            # finish_timeout_raises: a finish that gave up uploading must not be recorded as saved
            settings = wandb.Settings(init_timeout=timeout, finish_timeout=float(w.finish_timeout_s),
                                      finish_timeout_raises=True, silent=True, console="off")
            wandb_dir = self.run_dir / "wandb"
            before = set(wandb_dir.glob("*run-*")) if wandb_dir.is_dir() else set()
            try:
                # `mode`: a mode W&B takes (check_wandb_env, wandb_mode)
                return wandb.init(mode=cast(Any, mode), settings=settings, **kwargs)
            except BaseException:
                # A failed init leaves an empty W&B run directory with its own id: the retry's run is the run's
                # only one (`wandb sync` would otherwise upload an empty second run).
                if wandb_dir.is_dir():
                    for p in set(wandb_dir.glob("*run-*")) - before:
                        if p.is_dir() and not p.is_symlink():
                            shutil.rmtree(p, ignore_errors=True)
                raise

        if self.mode == "online":
            run = self._init_online(init, inherited, float(w.init_timeout_s))
            if run is not None:
                return run
        return self._init_offline(init, inherited, max(float(w.init_timeout_s), OFFLINE_INIT_TIMEOUT_S))

    def _init_online(self, init: Callable[[str, float], Any], inherited: _InheritedService, timeout: float) -> Any:
        """The online run, or None after one warning line, having switched ``self.mode`` to offline."""
        import wandb

        for attempt in range(2):
            try:
                return init("online", timeout)
            except Exception as exc:  # wandb.errors.Error and anything else: W&B must never stop training
                if attempt == 0 and inherited.drop():
                    continue  # again, with this process's own service
                tqdm.write(f"W&B: cannot log online ({_first_line(exc)}); logging offline to "
                           f"{self.run_dir / 'wandb'} instead (upload later with `wandb sync "
                           f"{self.run_dir / 'wandb'}/offline-run-*`)")
                break
        self.mode = "offline"
        # The failed online stream keeps holding the run id in this process's W&B service (a resumed run's
        # offline init would then fail with "run ID is in use"): shut that service down first.
        with contextlib.suppress(Exception):
            wandb.teardown()
        return None

    def _init_offline(self, init: Callable[[str, float], Any], inherited: _InheritedService, limit: float) -> Any:
        """The run in ``self.mode`` (offline or disabled), retried until ``limit`` s have passed; None (and
        ``self.mode`` disabled, one warning line) when it never starts.

        An offline init can fail too, e.g. "run ID is in use" while the W&B service of a killed process that
        logged to this run has not yet noticed. No network is involved offline: a slow start means a busy machine
        (a CI runner), not a dead server, so ``limit`` is longer than the online timeout."""
        deadline = time.monotonic() + limit
        while True:
            try:
                return init(self.mode, limit)
            except Exception as exc:
                if inherited.drop():
                    continue
                if time.monotonic() >= deadline:
                    tqdm.write(f"W&B: cannot start the run ({_first_line(exc)}); training goes on without W&B "
                               "(metrics.csv has every row; a --resume logs the rows W&B lacks)")
                    self.mode = "disabled"
                    return None
                time.sleep(1.0)

    def _send_unsaved(self, rows: list[dict[str, Any]]) -> None:
        """Send the kept ``metrics.csv`` rows after the last one this W&B run has certainly saved (all of them
        without a record of this run), in step order, before any new row: those a stop before their checkpoint
        kept from W&B, and those a kill may have lost from W&B's buffers."""
        saved = saved_step(self.run_dir, self.run.id)
        videos = set(self.video_steps)
        for r in rows:
            steps = int(float(r["env_steps"]))
            if saved is None or steps > saved:
                self._send(_typed_row(r))
                if steps in videos:
                    self._send_video(steps)

    def _send(self, row: dict[str, Any]) -> None:
        """Hand one row to W&B."""
        self.run.log(row)
        self._last_sent = int(row["env_steps"])

    def _video_path(self, step: int) -> Path:
        return self.run_dir / "videos" / f"eval_{step:09d}.mp4"

    def _send_video(self, step: int) -> None:
        """Hand the video of the evaluation at ``step`` env steps to W&B; one line if it cannot be (a video must
        never stop training)."""
        try:
            import wandb

            # a file path: wandb.Video on raw arrays would need moviepy
            self.run.log({"eval/video": wandb.Video(str(self._video_path(step)), format="mp4"), "env_steps": step})
        except Exception as exc:
            tqdm.write(f"W&B: the video at {step} env steps is not logged ({_first_line(exc)})")

    def _record_saved(self, env_steps: int) -> None:
        """Record (atomically) that W&B has saved the rows up to ``env_steps``."""
        from .checkpoint import write_atomic

        text = json.dumps({"run_id": self.run_id, "env_steps": int(env_steps)}).encode()
        try:
            write_atomic(self.run_dir / SAVED_FILE, lambda f: f.write(text))
        except OSError as exc:  # W&B's bookkeeping never stops a run; a resume then sends these rows again
            tqdm.write(f"W&B: cannot record the rows saved in {self.run_dir / SAVED_FILE} ({exc.strerror or exc})")

    def _truncate_csv(self, resume_step: int) -> list[dict[str, Any]]:
        """Drop the rows after ``resume_step`` (and a row cut short by a kill); return the rows kept. A byte-order
        mark (a CSV saved by a spreadsheet) is read and not written back.

        Raises:
            ValueError: the file cannot be read or is not a metrics CSV (one line naming it)."""
        def refuse(why: str) -> ValueError:
            return ValueError(f"--resume: {self.csv_path} cannot be read ({why}): expected the run's metrics CSV; "
                              "move it away to resume without its rows")

        try:
            with open(self.csv_path, newline="", encoding="utf-8-sig") as f:
                reader = csv.DictReader(f)
                fields, rows = reader.fieldnames, list(reader)
        except OSError as exc:
            raise refuse(exc.strerror or type(exc).__name__) from None
        except (UnicodeDecodeError, csv.Error) as exc:
            raise refuse(f"{type(exc).__name__}: {str(exc).splitlines()[0][:120]}") from None
        if not fields:
            self.csv_path.unlink()
            return []
        if "env_steps" not in fields:
            raise refuse(f"no env_steps column; its header is {','.join(fields)[:120]!r}")
        self._fields = list(fields)
        # A row cut short by the kill has missing cells (None): drop it too.
        keep = []
        for r in rows:
            if None in r.values() or not r.get("env_steps"):
                continue
            try:
                steps = float(r["env_steps"])
            except ValueError:
                raise refuse(f"line {rows.index(r) + 2}: env_steps {r['env_steps']!r} is not a number") from None
            if steps <= resume_step:
                keep.append(r)
        with open(self.csv_path, "rb") as fb:
            bom = fb.read(3) == codecs.BOM_UTF8
        if len(keep) < len(rows) or bom:  # rows after the checkpoint, or a byte-order mark to drop
            self._write_csv(keep)
        return keep

    def _write_csv(self, rows: list[dict[str, Any]]) -> None:
        """Rewrite ``metrics.csv`` (header ``self._fields``) atomically: a kill never loses the old rows."""
        from .checkpoint import write_atomic

        assert self._fields is not None, "the header is set before any rewrite"
        text = io.StringIO(newline="")
        w = csv.DictWriter(text, self._fields, extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)
        write_atomic(self.csv_path, lambda f: f.write(text.getvalue().encode()))

    @property
    def run_id(self) -> str | None:
        return None if self.run is None else self.run.id

    def progress(self, total: int, initial: int = 0) -> tqdm:
        return tqdm(total=total, initial=initial, unit="step", dynamic_ncols=True, smoothing=0.05,
                    disable=not self.cfg.log.progress, mininterval=1.0)

    def log(self, row: dict[str, Any], step: int) -> None:
        line = (f"steps {row['env_steps']:>8d} | eval success {row['eval/success_rate']:.3f} | "
                f"train success {row['train/success_rate']:.3f} | updates {row['updates']} | "
                f"{row['env_steps_per_s']:.0f} steps/s | {row['wall_time']:.0f} s")
        tqdm.write(line)
        clean = {k: ("" if isinstance(v, float) and math.isnan(v) else v) for k, v in row.items()}
        if self._fields is None or not set(row) <= set(self._fields):
            # New columns (losses appear after the first updates): rewrite the file with the wider header.
            old_rows = []
            if self.csv_path.exists() and not self._fresh_csv:  # a fresh run replaces an old file here
                with open(self.csv_path, newline="", encoding="utf-8-sig") as f:
                    old_rows = list(csv.DictReader(f))
            self._fresh_csv = False
            self._fields = list(self._fields or []) + [k for k in row if k not in (self._fields or [])]
            self._write_csv(old_rows)
            if self._covered_size is not None and not self._pending:  # the same covered rows, a wider header
                self._covered_size = self.csv_path.stat().st_size
        size = self.csv_path.stat().st_size
        try:
            with open(self.csv_path, "a", newline="") as f:
                csv.DictWriter(f, self._fields, extrasaction="ignore").writerow(clean)
                f.flush()
                os.fsync(f.fileno())
        except OSError as exc:  # e.g. a full disk: no row cut short stays behind
            if self._covered_size is None and not self._pending:
                self.csv_path.unlink()  # no row of this run yet: as if it had not started logging
            else:
                os.truncate(self.csv_path, size)
            raise OSError(exc.errno, exc.strerror, str(self.csv_path)) from None
        self._pending.append(row)
        if not self._defer:  # no checkpoints: nothing is redone, so nothing to wait for
            self.checkpointed()

    def checkpointed(self) -> None:
        """The checkpoint covering every row and video logged so far is on disk: send them to W&B."""
        if self._pending and self.csv_path.exists():
            self._covered_size = self.csv_path.stat().st_size
        if self.run is not None:
            for row in self._pending:
                self._send(row)
            for step in self._pending_videos:
                self._send_video(step)
        self._pending.clear()
        self._pending_videos.clear()

    def log_video(self, agent: Any, env_id: str, step: int) -> None:
        """Render one deterministic evaluation episode to ``<run_dir>/videos/eval_<step>.mp4`` (``step``: the
        evaluation's env steps) and add it to ``video_steps``; W&B gets it with the evaluation's row, once the
        checkpoint that covers both is written (``checkpointed``), so a resume that redoes the evaluation never
        sends it twice.

        A video must never stop training: when rendering fails (no usable ``MUJOCO_GL`` backend), one line
        says why and later evaluations skip the video.
        """
        if self._video_error is not None:
            return
        try:
            from .video import record_episodes, write_video

            frames, _ = record_episodes(agent, env_id, n_episodes=1)
            write_video(self._video_path(step), frames)
        except Exception as exc:
            self._video_error = str(exc)
            tqdm.write(f"video skipped (training goes on, no further videos this run): {exc}")
            return
        self.video_steps.append(step)
        if self.run is None:
            return
        if self._defer:
            self._pending_videos.append(step)
        else:  # no checkpoints: nothing is redone, so nothing to wait for
            self._send_video(step)

    def checkpoint_failed(self) -> None:
        """The checkpoint of the rows logged since the last one could not be written (a full disk): cut
        ``metrics.csv`` back to the rows the last checkpoint covers (remove it when that covers none), so every
        row left is one a resume keeps. Truncating needs no free space."""
        self.video_steps = [s for s in self.video_steps if s not in self._pending_videos]
        self._pending_videos.clear()
        if not self._pending or not self.csv_path.exists():
            return
        if self._covered_size is None:
            self.csv_path.unlink()
        else:
            os.truncate(self.csv_path, self._covered_size)
        self._pending.clear()

    def finish(self, status: str = "finished", error: BaseException | None = None) -> None:
        """Finish the W&B run, recording how the run ended.

        Args:
            status: ``finished`` (the rows not yet sent are sent), ``interrupted`` (SIGINT), ``terminated``
                (SIGTERM) or ``crashed``; stored in the W&B summary as ``run_status`` and as the exit code
                (0, 130, 143, 1: non-zero marks the W&B run failed).
            error: the exception of a crashed run, stored in the summary as ``error``.

        Raises:
            ValueError: an unknown ``status``.
        """
        if status not in EXIT_CODES:
            raise ValueError(f"status must be one of {sorted(EXIT_CODES)}, got {status!r}")
        if status == "finished":
            self.checkpointed()
        if self.run is None:
            return
        run = self.run
        try:
            run.summary["run_status"] = status
            if error is not None:
                run.summary["error"] = f"{type(error).__name__}: {error}"
        finally:
            try:
                run.finish(exit_code=EXIT_CODES[status])
            except TimeoutError:  # not all uploaded within log.wandb.finish_timeout_s (the rest is on disk)
                pass
            else:
                if self._last_sent is not None:
                    self._record_saved(self._last_sent)
            finally:
                self.run = None


class NullLogger:
    """The logger of a process that does not log (data-parallel ranks > 0): no stdout, no metrics.csv, no W&B."""

    run_id = None
    video_steps: tuple[int, ...] = ()

    def progress(self, total: int, initial: int = 0) -> tqdm:
        return tqdm(total=total, initial=initial, disable=True)

    def log(self, row: dict[str, Any], step: int) -> None:
        pass

    def log_video(self, agent: Any, env_id: str, step: int) -> None:
        pass

    def checkpointed(self) -> None:
        pass

    def checkpoint_failed(self) -> None:
        pass

    def finish(self, status: str = "finished", error: BaseException | None = None) -> None:
        pass


def saved_step(run_dir: Path, run_id: str) -> int | None:
    """The ``env_steps`` of the last row W&B run ``run_id`` has certainly saved, from ``run_dir``'s
    ``SAVED_FILE``; None when no record of that run is readable (nothing known saved: a resume sends every row)."""
    try:
        record = json.loads((Path(run_dir) / SAVED_FILE).read_text())
        return int(record["env_steps"]) if record["run_id"] == run_id else None
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _typed_row(row: dict[str, str]) -> dict[str, Any]:
    """A ``metrics.csv`` row (strings) as logged: integers, floats, empty cells left out."""
    out: dict[str, Any] = {}
    for k, v in row.items():
        if v in ("", None):
            continue
        try:
            out[k] = int(v)
        except ValueError:
            try:
                out[k] = float(v)
            except ValueError:
                out[k] = v
    return out
