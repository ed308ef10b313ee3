"""``her-tune``: an Optuna study over any config (``pip install her-robotics[tune]``; docs/tuning.md).

Each trial is a normal run (``her_agents.loop.train.train`` in this process, its own run directory with
``metrics.csv``, config and checkpoint, W&B group = the study's name when W&B is on) of the config with the
trial's sampled values as ``key=value`` overrides. The objective is a learning figure of the run's own evaluation
rows (``Objective``); every row is reported to the trial, and a trial the median pruner
(``optuna.pruners.MedianPruner``: below the median of earlier trials at the same env step) prunes is stopped
through the loop's own stop (``TrialHooks``: a clean stop with a checkpoint) and marked pruned.

The study lives in a storage file: a JournalStorage file (any path) or SQLite (``*.db``, ``*.sqlite``,
``sqlite:///...``). ``--n-trials N`` is the study's target of finished (complete or pruned) trials over every
``her-tune`` process and restart, so a stopped study resumes where it was and several processes share one.
A trial stopped by Ctrl-C / SIGTERM is marked failed and is tried again (same values) when the study resumes.

The search space is a YAML mapping of config keys to distributions::

    agent.actor_lr: {distribution: log-float, low: 1.0e-4, high: 3.0e-3}
    agent.polyak: {distribution: float, low: 0.9, high: 0.99}
    replay.n_sampled_goal: {distribution: int, low: 2, high: 8}
    train.batch_size: {distribution: categorical, choices: [128, 256, 512]}
"""

from __future__ import annotations

import json
import math
import sys
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml

from .loop.train import LoopHooks
from .tools import OneLineErrorParser, add_version_option, cli_entry, print_to_pipe

__all__ = ["DISTRIBUTIONS", "Objective", "Param", "TrialHooks", "best_trials_table", "check_space", "load_space",
           "main", "open_storage", "override", "parser", "run_study"]

DISTRIBUTIONS = ("float", "log-float", "int", "categorical")


@dataclass(frozen=True)
class Param:
    """One dimension of the search space: a dotted config ``key`` and its distribution (``float``, ``log-float``
    (log-uniform, ``low > 0``), ``int`` (uniform integers, ``step`` optional) in ``[low, high]``, or
    ``categorical`` over ``choices`` (lists allowed, e.g. network sizes))."""

    key: str
    distribution: str
    low: float | None = None
    high: float | None = None
    step: int | None = None
    choices: tuple[Any, ...] = ()

    def suggest(self, trial: Any) -> Any:
        """The trial's value of this key."""
        if self.distribution == "categorical":
            coded = [json.dumps(c) if isinstance(c, (list, dict)) else c for c in self.choices]
            value = trial.suggest_categorical(self.key, coded)
            return self.choices[coded.index(value)]
        low, high = self.low, self.high
        assert low is not None and high is not None, "a range has both ends (load_space)"
        if self.distribution == "int":
            return trial.suggest_int(self.key, int(low), int(high), step=self.step or 1)
        return trial.suggest_float(self.key, float(low), float(high), log=self.distribution == "log-float")

    def corner_values(self) -> list[Any]:
        """The values the config layer checks up front: both ends of a range, every choice."""
        return list(self.choices) if self.distribution == "categorical" else [self.low, self.high]


def override(key: str, value: Any) -> str:
    """``key=value`` as ``her-train`` takes it (lists and booleans in YAML flow style)."""
    if isinstance(value, (list, dict, bool)) or value is None:
        return f"{key}={json.dumps(value)}"
    return f"{key}={value!r}" if isinstance(value, float) else f"{key}={value}"


class _SpaceLoader(yaml.SafeLoader):
    """YAML 1.1's safe loader reading ``1e-4`` as a float (as configs read by OmegaConf do), not a string."""


_SpaceLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"""^[-+]?(?:[0-9][0-9_]*\.[0-9_]*(?:[eE][-+]?[0-9]+)?|[0-9][0-9_]*[eE][-+]?[0-9]+|\.[0-9_]+(?:[eE][-+]?[0-9]+)?"""
               r"""|\.(?:inf|Inf|INF)|[-+]\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"""),
    list("-+0123456789."))


def load_space(path: str | Path) -> list[Param]:
    """Read and check a search-space YAML file (distributions only; keys are checked by ``check_space``).

    Raises:
        FileNotFoundError: no file at ``path``.
        ValueError: one line naming the file, the key and what is wrong.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"--space {path}: no such file")
    try:
        raw = yaml.load(path.read_text(), Loader=_SpaceLoader)
    except yaml.YAMLError as exc:
        raise ValueError(f"--space {path}: not valid YAML ({str(exc).splitlines()[0]})") from None
    if not isinstance(raw, dict) or not raw:
        raise ValueError(f"--space {path}: expected a mapping of config keys to distributions, got "
                         f"{type(raw).__name__}")
    params = []
    for key, spec in raw.items():
        where = f"--space {path}: {key}"
        if not isinstance(spec, dict):
            raise ValueError(f"{where}: expected a mapping such as {{distribution: float, low: 0.1, high: 0.5}}, "
                             f"got {spec!r}")
        dist = spec.get("distribution")
        if dist not in DISTRIBUTIONS:
            raise ValueError(f"{where}: distribution must be one of {', '.join(DISTRIBUTIONS)}, got {dist!r}")
        allowed = {"distribution", "choices"} if dist == "categorical" else {"distribution", "low", "high", "step"}
        if dist != "int":
            allowed.discard("step")
        extra = sorted(set(spec) - allowed)
        if extra:
            raise ValueError(f"{where}: unknown field(s) {extra} for a {dist} distribution; valid: {sorted(allowed)}")
        if dist == "categorical":
            choices = spec.get("choices")
            if not isinstance(choices, list) or not choices:
                raise ValueError(f"{where}: categorical needs a non-empty list of choices, got {choices!r}")
            params.append(Param(str(key), dist, choices=tuple(choices)))
            continue
        low: Any = spec.get("low")  # checked just below
        high: Any = spec.get("high")
        number = int if dist == "int" else (int, float)
        for name, v in (("low", low), ("high", high)):
            if not isinstance(v, number) or isinstance(v, bool) or (isinstance(v, float) and not math.isfinite(v)):
                kind = "an integer" if dist == "int" else "a finite number"
                raise ValueError(f"{where}: {name} must be {kind}, got {v!r}")
        if not low < high:
            raise ValueError(f"{where}: low must be below high, got low={low}, high={high}")
        if dist == "log-float" and low <= 0:
            raise ValueError(f"{where}: log-float needs low > 0, got low={low}")
        step = spec.get("step")
        if step is not None and (not isinstance(step, int) or isinstance(step, bool) or step < 1):
            raise ValueError(f"{where}: step must be a positive integer, got {step!r}")
        params.append(Param(str(key), dist, low, high, step))
    return params


def check_space(params: list[Param], config: str, overrides: list[str]) -> None:
    """Each key with each end of its range (each choice) through the config layer's own checks: an unknown key
    (with its did-you-mean) or a value the config refuses fails here, before any trial.

    Raises:
        ValueError: the config layer's one-line error, prefixed with ``--space``.
    """
    from .config import load_config

    for p in params:
        for value in p.corner_values():
            try:
                load_config(config, [*overrides, override(p.key, value)])
            except ValueError as exc:
                raise ValueError(f"--space: {p.key}={value!r}: {exc}") from None


@dataclass(frozen=True)
class Objective:
    """A learning figure of the run's evaluation rows (``eval/success_rate`` at ``env_steps``).

    - ``success``: the success rate of the last evaluation (at the budget ``train.total_env_steps``); maximize.
    - ``auc``: the mean success rate over all evaluations (area under the learning curve); maximize.
    - ``steps_to:LEVEL``: env steps of the first evaluation with success rate >= LEVEL; minimize. A run that
      does not get there scores ``budget * (2 - best success / LEVEL)``, above every run that does, and lower the
      closer it came.

    The value reported after each row is the figure of the rows so far (for ``steps_to``, with the steps so far
    as the budget), which is what the median pruner compares between trials.
    """

    kind: str
    level: float = 0.0

    @classmethod
    def parse(cls, text: str) -> Objective:
        """Raises: ValueError for anything but ``success``, ``auc`` or ``steps_to:LEVEL`` with 0 < LEVEL <= 1."""
        if text in ("success", "auc"):
            return cls(text)
        kind, _, level = text.partition(":")
        if kind == "steps_to":
            try:
                lv = float(level)
            except ValueError:
                lv = float("nan")
            if 0 < lv <= 1:
                return cls(kind, lv)
        raise ValueError(f"--objective must be success, auc or steps_to:LEVEL (0 < LEVEL <= 1), got {text!r}")

    @property
    def direction(self) -> Literal["minimize", "maximize"]:
        return "minimize" if self.kind == "steps_to" else "maximize"

    def __str__(self) -> str:
        return f"steps_to:{self.level:g}" if self.kind == "steps_to" else self.kind

    def value(self, rows: list[dict[str, Any]]) -> float:
        """The figure of the evaluation rows so far (``env_steps``, ``eval/success_rate``)."""
        success = [float(r["eval/success_rate"]) for r in rows]
        if self.kind == "success":
            return success[-1]
        if self.kind == "auc":
            return sum(success) / len(success)
        for r, s in zip(rows, success):
            if s >= self.level:
                return float(r["env_steps"])
        budget = float(rows[-1]["env_steps"])
        return budget * (2.0 - min(max(success), self.level) / self.level)


class TrialHooks(LoopHooks):
    """The training loop's hooks for one trial: each evaluation row is reported to the trial
    (``trial.report(objective.value(rows), env_steps)``); once ``trial.should_prune()`` says so, the loop stops
    at its next env step as on a signal (checkpoint written), and ``pruned`` is set."""

    def __init__(self, trial: Any, objective: Objective) -> None:
        self.trial, self.objective = trial, objective
        self.rows: list[dict[str, Any]] = []
        self.pruned = False

    def row_extras(self, row: dict[str, Any]) -> dict[str, Any]:
        self.rows.append(row)
        self.trial.report(self.objective.value(self.rows), step=int(row["env_steps"]))
        if self.trial.should_prune():
            self.pruned = True
        return {}

    def should_stop(self, requested: bool, env_steps: int) -> bool:
        return requested or self.pruned


def _check_journal_head(path: Path, spec: str) -> None:
    """Refuse a file that is not an Optuna journal before Optuna appends to it: Optuna skips an unreadable
    last line (a write cut short), so a one-line file of anything else would be taken, appended to and only
    then fail.

    Raises:
        ValueError: the file's first line is not a JSON object (a journal entry)."""
    if not path.is_file() or path.stat().st_size == 0:
        return
    with open(path, "rb") as f:
        head = f.readline(1 << 20)
    try:
        entry = json.loads(head)
    except ValueError:
        entry = None
    if not isinstance(entry, dict) or "op_code" not in entry:
        raise ValueError(f"--storage {spec}: not an Optuna journal file: its first line is not a journal entry "
                         f"(got {head[:40]!r}); give the journal file of a study or a new file")


def open_storage(spec: str) -> Any:
    """The Optuna storage of ``--storage``: ``sqlite:///PATH`` or a path ending in ``.db``, ``.sqlite`` or
    ``.sqlite3`` (SQLite), any other path a JournalStorage file (several processes may share it; the file is
    created).

    Raises:
        ValueError: one line: a directory, a path whose folder cannot be written, another database URL than
            SQLite, a file that is not such a storage.
    """
    import optuna

    if "://" in spec and not spec.startswith("sqlite:///"):
        raise ValueError(f"--storage {spec}: only SQLite URLs (sqlite:///PATH) or a file path are taken")
    path = Path(spec.removeprefix("sqlite:///"))
    if path.is_dir():
        raise ValueError(f"--storage {spec}: is a directory; give a file path, e.g. {path / 'study.journal'}")
    parent = path.absolute().parent
    if not parent.is_dir():
        raise ValueError(f"--storage {spec}: the folder {parent} does not exist")
    sqlite = spec.startswith("sqlite:///") or path.suffix in (".db", ".sqlite", ".sqlite3")
    if not sqlite:
        _check_journal_head(path, spec)
    try:
        if sqlite:
            return optuna.storages.RDBStorage(f"sqlite:///{path}")
        from optuna.storages.journal import JournalFileBackend

        storage = optuna.storages.JournalStorage(JournalFileBackend(str(path)))
        storage.get_all_studies()  # reads the file: a file of another kind fails here
        return storage
    except Exception as exc:  # optuna's and SQLAlchemy's errors are many-lined
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ValueError(f"--storage {spec}: cannot open it as an Optuna storage ({type(exc).__name__}: "
                         f"{first[:200]})") from None


def best_trials_table(study: Any, params: list[Param], top: int = 5) -> str:
    """A Markdown table of the ``top`` best complete trials (value, each key's value, env steps, run
    directory), and a line counting trials by state."""
    import optuna

    states = optuna.trial.TrialState
    done = [t for t in study.get_trials(deepcopy=False) if t.state == states.COMPLETE]
    done.sort(key=lambda t: t.value, reverse=study.direction == optuna.study.StudyDirection.MAXIMIZE)
    keys = [p.key for p in params]
    lines = [f"| trial | {study.user_attrs.get('objective', 'value')} | " + " | ".join(keys) + " | run directory |",
             "|---" * (len(keys) + 3) + "|"]
    for t in done[:top]:
        vals = " | ".join(_fmt(t.params.get(k)) for k in keys)
        lines.append(f"| {t.number} | {t.value:.4g} | {vals} | {t.user_attrs.get('run_dir', '')} |")
    counts = {s.name.lower(): sum(t.state == s for t in study.get_trials(deepcopy=False)) for s in states}
    summary = ", ".join(f"{n} {s}" for s, n in counts.items() if n)
    return "\n".join(lines) + f"\n\nstudy {study.study_name}: {summary or 'no trials'}"


def _fmt(v: Any) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def _finished(study: Any) -> int:
    import optuna

    states = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED)
    return len(study.get_trials(deepcopy=False, states=states))


def _retry_interrupted(study: Any) -> None:
    """Enqueue once more the values of trials stopped by a signal (failed, ``interrupted``), each once."""
    trials = study.get_trials(deepcopy=False)
    retried = {t.user_attrs.get("retry_of") for t in trials}
    for t in trials:
        if t.user_attrs.get("interrupted") and t.number not in retried:
            study.enqueue_trial(t.params, user_attrs={"retry_of": t.number})


def run_study(args: Any, params: list[Param], objective: Objective, log: Any = print) -> Any:
    """Create or load the study and run trials until it holds ``args.n_trials`` finished ones.

    Raises:
        ValueError: a storage or study that does not fit (one line).
        TrainingStopped: a trial stopped by a signal (it is marked failed and retried on resume).
    """
    import optuna

    from .config import load_config
    from .loop.train import train
    from .run.run_control import TrainingStopped

    storage = open_storage(args.storage)
    sampler = (optuna.samplers.RandomSampler(seed=args.seed) if args.sampler == "random"
               else optuna.samplers.TPESampler(seed=args.seed, n_startup_trials=args.n_startup_trials))
    pruner = (optuna.pruners.MedianPruner(n_startup_trials=args.n_startup_trials, n_warmup_steps=args.prune_after)
              if args.pruner == "median" else optuna.pruners.NopPruner())
    name = args.study or Path(args.config).stem
    study = optuna.create_study(study_name=name, storage=storage, sampler=sampler, pruner=pruner,
                                direction=objective.direction, load_if_exists=True)
    what = {"objective": str(objective), "config": args.config, "overrides": list(args.overrides),
            "space": sorted(p.key for p in params)}
    if not study.user_attrs:
        for k, v in what.items():
            study.set_user_attr(k, v)
    else:
        for k, v in what.items():
            if study.user_attrs.get(k) != v:
                raise ValueError(f"study {name!r} in {args.storage} was made with {k} {study.user_attrs.get(k)!r}, "
                                 f"got {v!r}: use another --study name (or the same {k})")
    runs_dir = Path(args.runs_dir) / name
    wandb_group = [] if any(o.startswith("log.wandb.group=") for o in args.overrides) else [
        f"log.wandb.group={name}"]

    def run_trial(trial: optuna.Trial) -> float:
        values = {p.key: p.suggest(trial) for p in params}
        run_dir = runs_dir / f"trial-{trial.number:04d}"
        trial.set_user_attr("run_dir", str(run_dir))
        cfg = load_config(args.config, [*args.overrides, *wandb_group,
                                        *(override(k, v) for k, v in values.items()), f"log.run_dir={run_dir}"])
        log(f"her-tune: trial {trial.number}: " + " ".join(override(k, v) for k, v in values.items()))
        hooks = TrialHooks(trial, objective)
        try:
            result = train(cfg, overwrite=True, hooks=hooks)
        except TrainingStopped:
            if hooks.pruned:
                log(f"her-tune: trial {trial.number} pruned at {hooks.rows[-1]['env_steps']} env steps "
                    f"({objective} {objective.value(hooks.rows):.4g})")
                raise optuna.TrialPruned() from None
            trial.set_user_attr("interrupted", True)
            raise
        except KeyboardInterrupt:  # a second Ctrl-C: stopped at once, without a checkpoint
            trial.set_user_attr("interrupted", True)
            raise
        value = objective.value(result.history)
        trial.set_user_attr("env_steps", int(result.env_steps))
        log(f"her-tune: trial {trial.number}: {objective} {value:.4g}")
        return value

    _retry_interrupted(study)
    if _finished(study) >= args.n_trials:
        log(f"her-tune: study {name} already holds {_finished(study)} finished trials (--n-trials {args.n_trials})")
        return study
    target = optuna.study.MaxTrialsCallback(
        args.n_trials, states=(optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED))
    study.optimize(run_trial, callbacks=[target], catch=())
    return study


def parser() -> OneLineErrorParser:
    """The ``her-tune`` argument parser."""
    p = OneLineErrorParser(
        prog="her-tune",
        description="Tune a config with Optuna: each trial a normal run of CONFIG with sampled key=value overrides, "
        "scored by a learning figure of its evaluations, median-pruned, in a resumable storage file.")
    add_version_option(p)
    p.add_argument("config", help="YAML path or configs/ name, e.g. fetch_reach_sac")
    p.add_argument("overrides", nargs="*", help="key=value overrides for every trial (default: none)")
    p.add_argument("--space", required=True, help="search-space YAML: key: {distribution, low, high | choices}")
    p.add_argument("--storage", required=True, help="study file: a JournalStorage path, or SQLite "
                   "(*.db, sqlite:///PATH); resumed when it holds the study")
    p.add_argument("--study", help="study name (default: the config's name)")
    p.add_argument("--n-trials", type=int, default=20, help="finished (complete or pruned) trials the study "
                   "should hold, counting earlier runs and other processes (default: %(default)s)")
    p.add_argument("--objective", default="success", help="success (last eval's success rate), auc (mean eval "
                   "success rate) or steps_to:LEVEL (env steps to that success rate) (default: %(default)s)")
    p.add_argument("--sampler", choices=("tpe", "random"), default="tpe", help="(default: %(default)s)")
    p.add_argument("--pruner", choices=("median", "none"), default="median", help="(default: %(default)s)")
    p.add_argument("--n-startup-trials", type=int, default=5, help="trials before TPE models the space and "
                   "before the pruner prunes (default: %(default)s)")
    p.add_argument("--prune-after", type=int, default=0, help="env steps before a trial may be pruned "
                   "(default: %(default)s)")
    p.add_argument("--seed", type=int, help="sampler seed (default: random; give different ones to processes "
                   "sharing a study)")
    p.add_argument("--runs-dir", default="runs/tune", help="trials' run directories go to RUNS_DIR/STUDY/trial-N "
                   "(default: %(default)s)")
    p.add_argument("--top", type=int, default=5, help="rows of the best-trials table (default: %(default)s)")
    return p


@cli_entry("her-tune")
def main(argv: list[str] | None = None) -> int:
    p = parser()
    args = p.parse_intermixed_args(argv)
    for flag, value in (("--n-trials", args.n_trials), ("--top", args.top)):
        if value < 1:
            p.error(f"{flag} must be >= 1, got {value}")
    for flag, value in (("--n-startup-trials", args.n_startup_trials), ("--prune-after", args.prune_after)):
        if value < 0:
            p.error(f"{flag} must be >= 0, got {value}")
    try:
        import optuna
    except ImportError:
        p.error("her-tune needs Optuna: pip install 'her-robotics[tune]'")
    optuna.logging.set_verbosity(optuna.logging.WARNING)  # our own line per trial
    from .run.run_control import TrainingStopped

    try:
        objective = Objective.parse(args.objective)
        params = load_space(args.space)
        if any(o.partition("=")[0].strip() == "log.run_dir" for o in args.overrides):
            raise ValueError("log.run_dir is set per trial (--runs-dir); drop the override")
        check_space(params, args.config, list(args.overrides))
        study = run_study(args, params, objective)
    except (ValueError, FileNotFoundError) as exc:
        p.error(str(exc))
    except TrainingStopped as exc:
        print(f"her-tune: {exc}; the trial is tried again when the study resumes (the same her-tune command)",
              file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("her-tune: interrupted; resume with the same command", file=sys.stderr)
        return 130
    return print_to_pipe(best_trials_table(study, params, args.top))
