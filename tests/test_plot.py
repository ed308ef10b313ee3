"""``her-plot``: learning curves from run directories' ``metrics.csv`` into one PNG; clear errors on bad input."""

from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from her_agents.plot import main, read_metrics

FIELDS = ["env_steps", "episodes", "updates", "wall_time", "eval/success_rate", "eval/final_distance",
          "train/success_rate", "env_steps_per_s"]


def _write_run(run_dir: Path, steps: list[int], success: list[float], seconds_per_step: float) -> Path:
    """A run directory with a hand-written metrics.csv, as the training loop writes it."""
    run_dir.mkdir(parents=True)
    with open(run_dir / "metrics.csv", "w", newline="") as f:
        w = csv.DictWriter(f, FIELDS)
        w.writeheader()
        for s, p in zip(steps, success):
            w.writerow({"env_steps": s, "episodes": s // 50, "updates": int(0.4 * s),
                        "wall_time": round(s * seconds_per_step, 2), "eval/success_rate": p,
                        "eval/final_distance": 0.2 * (1 - p), "train/success_rate": "", "env_steps_per_s": 100})
    return run_dir


@pytest.fixture
def runs(tmp_path) -> list[Path]:
    steps = [1000, 2000, 3000, 4000]
    return [
        _write_run(tmp_path / "a-s0", steps, [0.1, 0.4, 0.7, 0.9], 0.010),
        _write_run(tmp_path / "a-s1", steps[:3], [0.0, 0.5, 0.8], 0.012),  # stopped early: shorter curve
        _write_run(tmp_path / "b-s0", steps, [0.0, 0.1, 0.3, 0.5], 0.008),
    ]


def _check_png(path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.image as mpimg

    assert path.is_file()
    assert path.stat().st_size > 10_000, path.stat().st_size  # two panels of curves, not an empty canvas
    img = mpimg.imread(path)
    assert img.shape[:2] == (440, 1210), img.shape  # figsize (11, 4) at 110 dpi
    assert img.shape[2] in (3, 4)
    assert img[..., :3].std() > 0.05  # something was drawn


def test_her_plot_writes_png_of_grouped_runs(runs, tmp_path):
    out = tmp_path / "plots" / "compare.png"
    proc = subprocess.run([sys.executable, "-m", "her_agents.plot", str(runs[0]), str(runs[1]), "--label", "A",
                           str(runs[2]), "--label", "B", "--out", str(out), "--title", "synthetic"],
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"wrote {out}" in proc.stdout
    _check_png(out)


def test_her_plot_other_metric_and_single_run(runs, tmp_path):
    out = tmp_path / "dist.png"
    assert main([str(runs[2]), "--metric", "eval/final_distance", "--out", str(out)]) == 0
    _check_png(out)


def test_read_metrics_columns(runs):
    m = read_metrics(runs[1])
    assert list(m["env_steps"]) == [1000, 2000, 3000]
    assert list(m["eval/success_rate"]) == [0.0, 0.5, 0.8]
    assert np.isnan(m["train/success_rate"]).all()  # empty cells are NaN


def test_her_plot_missing_run_dir_gives_clear_error(runs, tmp_path):
    missing = tmp_path / "no-such-run"
    proc = subprocess.run([sys.executable, "-m", "her_agents.plot", str(runs[0]), str(missing), "--out",
                           str(tmp_path / "x.png")], capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert f"no metrics.csv at {missing}" in proc.stderr, proc.stderr
    assert not (tmp_path / "x.png").exists()


@pytest.mark.parametrize("case, expect", [
    ("empty", "has no rows"),
    ("metric", "no column 'eval/nope'"),
    ("table_metric", "no column 'eval/nope'"),
    ("nothing", "no run directories given"),
    ("label_first", "no run directories before it"),
    ("binary", "binary/metrics.csv is not a metrics CSV ('utf-8' codec can't decode"),
    ("table_negative", "--table: expected env steps >= 0, got -5"),
    ("table_nan", "--table: expected env steps >= 0, got nan"),
    ("levels_word", "--levels: expected numbers, got 'high'"),
    ("levels_inf", "--levels: expected finite numbers, got inf"),
    ("levels_alone", "--levels goes with --table"),
    ("not_csv", "not_csv.txt is not a metrics CSV (expected the columns env_steps and wall_time, got ['hello'])"),
])
def test_her_plot_bad_input_gives_clear_error(runs, tmp_path, capsys, case, expect):
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "metrics.csv").write_text(",".join(FIELDS) + "\n")
    (tmp_path / "binary").mkdir()
    (tmp_path / "binary" / "metrics.csv").write_bytes(b"env_steps,wall_time\n\xff\xfe\x00garbage\n")
    argv = {"empty": [str(runs[0]), str(empty)], "metric": [str(runs[0]), "--metric", "eval/nope"],
            "table_metric": [str(runs[0]), "--table", "--metric", "eval/nope"],
            "nothing": ["--out", str(tmp_path / "x.png")], "label_first": ["--label", "A", str(runs[0])],
            "binary": [str(runs[0]), str(tmp_path / "binary")],
            "table_negative": [str(runs[0]), "--table", "-5"], "table_nan": [str(runs[0]), "--table", "nan"],
            "levels_word": [str(runs[0]), "--table", "--levels", "high"],
            "levels_inf": [str(runs[0]), "--table", "--levels", "0.5", "inf"],
            "levels_alone": [str(runs[0]), "--levels", "0.5"],
            "not_csv": [str(runs[0]), str(tmp_path / "not_csv.txt")]}[case]
    (tmp_path / "not_csv.txt").write_text("hello\nworld\n")
    with pytest.raises(SystemExit) as exc:
        main([*argv, "--out", str(tmp_path / "x.png")])
    assert exc.value.code == 2
    assert expect in capsys.readouterr().err
    assert not (tmp_path / "x.png").exists()


@pytest.mark.parametrize("second", ["same", "csv", "other_label"])
def test_her_plot_the_same_run_twice_under_one_label_is_refused(runs, tmp_path, capsys, second):
    again = {"same": str(runs[0]), "csv": str(runs[0] / "metrics.csv"), "other_label": str(runs[1])}[second]
    argv = [str(runs[0]), "--label", "A", again, "--label", "A" if second != "other_label" else "B", "--table"]
    if second == "other_label":  # a run under one label and another run under the next: fine
        assert main(argv) == 0
        return
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert f"her-plot: error: --label A: run {again} is given twice (also as {runs[0]}); its mean would count it " \
           "twice" in err, err


def test_her_plot_table_gives_steps_to_each_level_and_success_at_given_steps(runs, capsys):
    assert main([str(runs[0]), str(runs[1]), "--label", "A", str(runs[2]), "--label", "B",
                 "--table", "2000", "3500"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0] == ("| run | to 0.5 | to 0.9 | min to 0.5 | min to 0.9 | at 2k | at 3.5k | env steps | wall min "
                        "| updates/step |")
    rows = {ln.split(" | ")[0].lstrip("| "): ln.split(" | ")[1:] for ln in lines[2:]}
    # a-s0: 0.1 0.4 0.7 0.9 at 1k..4k, 10 s per 1k (0.5 at 30 s, 0.9 at 40 s); at 3.5k the last evaluation at or
    # before it (3k) counts; no config.yaml: no updates/step
    assert rows["a-s0"] == ["3k", "4k", "0.5", "0.7", "0.40", "0.70", "4k", "1", "- |"]
    assert rows["a-s1"] == ["2k", "-", "0.4", "-", "0.50", "-", "3k", "1", "- |"]  # never 0.9; ended before 3.5k
    # mean of a-s0 and a-s1 on their common range (1k-3k): 0.05, 0.45, 0.75 -> 0.5 first at 3k (a-s1 there at
    # 36 s, the slower), 0.9 never
    assert rows["**A: mean of 2**"][:6] == ["3k", "-", "0.6", "-", "0.45", "-"]
    assert rows["b-s0"][:6] == ["4k", "-", "0.5", "-", "0.10", "0.30"]


def test_her_plot_table_with_out_writes_the_table_to_that_file(runs, tmp_path, capsys):
    assert main([str(runs[0]), "--table", "2000"]) == 0
    printed = capsys.readouterr().out
    out = tmp_path / "tables" / "a.md"
    assert main([str(runs[0]), "--table", "2000", "--out", str(out)]) == 0
    assert capsys.readouterr().out == f"wrote {out}\n"
    assert out.read_text() == printed and printed.startswith("| run | to 0.5 |")


def test_her_plot_table_levels_and_a_step_before_the_first_evaluation(runs, capsys):
    assert main([str(runs[0]), "--table", "0", "2000", "--levels", "0.4", "0.7"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0] == ("| run | to 0.4 | to 0.7 | min to 0.4 | min to 0.7 | at 0 | at 2k | env steps | wall min "
                        "| updates/step |")
    # a-s0: 0.1 0.4 0.7 0.9 at 1k..4k, 10 s per 1k; nothing was evaluated at or before 0 env steps
    assert lines[2].split(" | ")[1:7] == ["2k", "3k", "0.3", "0.5", "-", "0.40"]


def _write_timed_run(run_dir: Path, success: list[float], wall: list[float | str],
                     updates_per_step: float | None) -> Path:
    """A run evaluated at 1k, 2k, ... env steps with the given success rates and wall times (seconds; "" for an
    empty cell), and a config.yaml with train.updates_per_step where one is given."""
    run_dir.mkdir(parents=True)
    with open(run_dir / "metrics.csv", "w", newline="") as f:
        w = csv.DictWriter(f, ["env_steps", "wall_time", "eval/success_rate"])
        w.writeheader()
        for i, (p, t) in enumerate(zip(success, wall)):
            w.writerow({"env_steps": 1000 * (i + 1), "wall_time": t, "eval/success_rate": p})
    if updates_per_step is not None:
        (run_dir / "config.yaml").write_text(f"env:\n  id: FetchPush-v4\ntrain:\n  updates_per_step: "
                                             f"{updates_per_step}\n  update_every: 4\n")
    return run_dir


@pytest.fixture
def timed(tmp_path) -> list[Path]:
    """Three seeds at 1k..4k env steps, each at its own speed. Their mean success: 0.23, 0.6, 0.85, 0.97."""
    return [_write_timed_run(tmp_path / "t-s0", [0.2, 0.6, 0.9, 1.0], [60, 120, 180, 240], 0.5),
            _write_timed_run(tmp_path / "t-s1", [0.0, 0.3, 0.7, 0.9], [90, 180, 270, 360], 0.5),
            _write_timed_run(tmp_path / "t-s2", [0.5, 0.9, 0.95, 1.0], [30, 66, 96, 126], 0.5)]


def _table_rows(out: str) -> list[dict[str, str]]:
    """The table's rows in order, each a dict from column header to cell."""
    lines = out.strip().splitlines()
    head = [c.strip() for c in lines[0].strip("|").split("|")]
    return [dict(zip(head, (c.strip() for c in ln.strip("|").split("|")))) for ln in lines[2:]]


def test_her_plot_table_gives_wall_minutes_to_each_level(timed, capsys):
    """A run's minutes are its wall time at its own first evaluation at the level; a mean row's are the slowest
    seed's wall time at the first evaluation where the mean reaches it."""
    assert main([*map(str, timed), "--label", "T", "--table", "2k"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0] == ("| run | to 0.5 | to 0.9 | min to 0.5 | min to 0.9 | at 2k | env steps | "
                                   "wall min | updates/step |")
    rows = {row["run"]: row for row in _table_rows(out)}
    minutes = {name: (row["min to 0.5"], row["min to 0.9"]) for name, row in rows.items()}
    assert minutes["t-s0"] == ("2.0", "3.0")  # 0.6 at 2k (120 s), 0.9 at 3k (180 s)
    assert minutes["t-s1"] == ("4.5", "6.0")  # 0.7 at 3k (270 s), 0.9 at 4k (360 s)
    assert minutes["t-s2"] == ("0.5", "1.1")  # 0.5 at 1k (30 s), 0.9 at 2k (66 s)
    mean = rows["**T: mean of 3**"]
    # the mean reaches 0.5 at 2k: the seeds' wall times there are 120, 180 and 66 s -> the slowest, 180 s (not the
    # mean 122 s, nor the slowest seed's own crossing at 270 s); 0.9 at 4k: 240, 360, 126 s -> 360 s
    assert (mean["to 0.5"], mean["to 0.9"]) == ("2k", "4k")
    assert (mean["min to 0.5"], mean["min to 0.9"]) == ("3.0", "6.0")


def test_her_plot_table_minutes_are_a_dash_when_a_level_is_not_reached_or_has_no_wall_time(tmp_path, capsys):
    runs = [_write_timed_run(tmp_path / "u-s0", [0.2, 0.6, 0.8], [60, "", 180], 1),
            _write_timed_run(tmp_path / "u-s1", [0.4, 0.7, 0.8], [50, 100, 150], 1)]
    assert main([*map(str, runs), "--label", "U", "--table"]) == 0
    rows = {row["run"]: row for row in _table_rows(capsys.readouterr().out)}
    # u-s0 reaches 0.5 at 2k, whose wall_time cell is empty; no run reaches 0.9
    assert [rows["u-s0"][c] for c in ("to 0.5", "min to 0.5", "to 0.9", "min to 0.9")] == ["2k", "-", "-", "-"]
    assert [rows["u-s1"][c] for c in ("to 0.5", "min to 0.5", "to 0.9", "min to 0.9")] == ["2k", "1.7", "-", "-"]
    # the mean reaches 0.5 at 2k too: one seed's time there is unknown, so the slowest is
    assert [rows["**U: mean of 2**"][c] for c in ("to 0.5", "min to 0.5", "min to 0.9")] == ["2k", "-", "-"]


def test_her_plot_table_gives_each_runs_updates_per_step_and_the_groups_where_they_agree(timed, tmp_path, capsys):
    other = _write_timed_run(tmp_path / "o-s0", [0.5, 0.9], [10, 20], 2)  # update_every: 4 -> still 2 as stored
    bare = _write_timed_run(tmp_path / "n-s0", [0.5, 0.9], [10, 20], None)  # no config.yaml
    assert main([str(timed[0]), str(timed[1]), "--label", "same", str(timed[2]), str(other), "--label", "mixed",
                 str(timed[0]), str(bare), "--label", "unknown", "--table"]) == 0
    # the same run under two labels is fine; it shows in both
    got = [(row["run"], row["updates/step"]) for row in _table_rows(capsys.readouterr().out)]
    assert got == [("t-s0", "0.5"), ("t-s1", "0.5"), ("**same: mean of 2**", "0.5"),
                   ("t-s2", "0.5"), ("o-s0", "2"), ("**mixed: mean of 2**", ""),
                   ("t-s0", "0.5"), ("n-s0", "-"), ("**unknown: mean of 2**", "")]


def _with_env(run_dir: Path, env_id: str) -> Path:
    (run_dir / "config.yaml").write_text(f"env:\n  id: {env_id}\nalgo: ddpg\n")
    return run_dir


@pytest.fixture
def uneven(tmp_path) -> list[Path]:
    """Two runs of one env evaluated at different env steps: every 1k, and every 2k from 2k."""
    return [_with_env(_write_run(tmp_path / "e1k", [1000, 2000, 3000, 4000], [0.1, 0.2, 0.3, 0.4], 0.01),
                      "FetchReach-v4"),
            _with_env(_write_run(tmp_path / "e2k", [2000, 4000], [0.5, 0.6], 0.01), "FetchReach-v4")]


def test_her_plot_table_means_only_where_every_run_evaluated_and_says_so(uneven, capsys):
    assert main([str(uneven[0]), str(uneven[1]), "--label", "A", "--table", "1000", "2000", "3000", "4000",
                 "--levels", "0.35", "0.5"]) == 0
    out, err = capsys.readouterr()
    rows = {ln.split(" | ")[0].lstrip("| "): ln.split(" | ")[1:] for ln in out.strip().splitlines()[2:]}
    assert rows["e1k"][:8] == ["4k", "-", "0.7", "-", "0.10", "0.20", "0.30", "0.40"]
    assert rows["e2k"][:8] == ["2k", "2k", "0.3", "0.3", "-", "0.50", "0.50", "0.60"]
    # mean at 2k (0.35) and 4k (0.5) only: nothing before e2k's first evaluation, no value carried to 3k
    assert rows["**A: mean of 2**"][:8] == ["2k", "4k", "0.3", "0.7", "-", "0.35", "-", "0.50"]
    assert err.strip() == ("her-plot: label 'A': the mean of its 2 runs is taken at the 2 env steps where all of "
                           "them evaluated (2k to 4k); 2 evaluation(s) of single runs are left out")


def test_her_plot_curve_is_the_mean_where_every_run_evaluated(uneven, tmp_path, capsys, monkeypatch):
    import matplotlib.axes

    drawn = []
    real = matplotlib.axes.Axes.plot

    def plot(self, x, y, *args, **kwargs):
        drawn.append((np.asarray(x).tolist(), np.asarray(y).tolist()))
        return real(self, x, y, *args, **kwargs)

    monkeypatch.setattr(matplotlib.axes.Axes, "plot", plot)
    assert main([str(uneven[0]), str(uneven[1]), "--label", "A", "--out", str(tmp_path / "p.png")]) == 0
    (steps, mean), (minutes, mean_wall) = drawn
    assert steps == [2.0, 4.0] and mean == pytest.approx([0.35, 0.5])  # no point at 1k (e2k had none yet)
    assert minutes == pytest.approx([20 / 60, 40 / 60]) and mean_wall == mean  # the runs' mean wall time
    assert "taken at the 2 env steps where all of them evaluated" in capsys.readouterr().err


def test_her_plot_runs_without_a_common_evaluation_step_are_refused(tmp_path, capsys):
    a = _write_run(tmp_path / "a", [1000, 3000], [0.1, 0.3], 0.01)
    b = _write_run(tmp_path / "b", [2000, 4000], [0.2, 0.4], 0.01)
    for args in (["--table"], ["--out", str(tmp_path / "x.png")]):
        with pytest.raises(SystemExit) as exc:
            main([str(a), str(b), "--label", "A", *args])
        assert exc.value.code == 2
        assert ("her-plot: error: label 'A': its runs have no env step at which all of them evaluated (first "
                "evaluations at 1k, 2k); give them separate --label names") in capsys.readouterr().err
    assert not (tmp_path / "x.png").exists()


def test_her_plot_warns_when_a_label_mixes_env_ids(runs, capsys):
    _with_env(runs[0], "FetchReach-v4")
    _with_env(runs[2], "FetchPush-v4")
    assert main([str(runs[0]), str(runs[2]), "--label", "mixed", "--table"]) == 0
    err = capsys.readouterr().err
    assert ("her-plot: warning: label 'mixed' mixes env ids (FetchReach-v4: a-s0; FetchPush-v4: b-s0); its mean "
            "averages different tasks (give each env its own --label)") in err.splitlines()


@pytest.mark.parametrize("where", ["under_a_file", "read_only_dir"])
def test_her_plot_out_that_cannot_be_written_is_one_line(runs, tmp_path, capsys, where):
    import os

    if where == "under_a_file":
        (tmp_path / "a_file").write_text("")
        out, named = tmp_path / "a_file" / "x.png", f"{tmp_path / 'a_file'} (Not a directory)"
    else:
        if os.geteuid() == 0:
            pytest.skip("root writes into a read-only directory")
        (tmp_path / "ro").mkdir(mode=0o555)
        out, named = tmp_path / "ro" / "x.png", f"{tmp_path / 'ro' / 'x.png'} (Permission denied)"
    assert main([str(runs[0]), "--out", str(out)]) == 1
    err = capsys.readouterr().err
    assert err.strip() == f"her-plot: error: --out {out}: cannot write {named}", err


@pytest.mark.parametrize("levels, metric, ok", [(["1.5"], "eval/success_rate", False),
                                                (["-0.1", "0.5"], "eval/success_rate", False),
                                                (["0", "1"], "eval/success_rate", True)])
def test_her_plot_levels_of_a_rate_must_be_in_the_unit_interval(runs, capsys, levels, metric, ok):
    argv = [str(runs[0]), "--table", "--levels", *levels, "--metric", metric]
    if ok:
        assert main(argv) == 0
        return
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    assert capsys.readouterr().err == (f"her-plot: error: --levels: eval/success_rate is a rate in [0, 1], got "
                                       f"{float(levels[0]):g}\n")  # one line, no usage text


def test_her_plot_levels_are_for_success_rates_only(runs, capsys):
    """A first crossing upward means nothing for a distance (lower is better): --levels with another metric is
    refused, and its table has no level columns."""
    with pytest.raises(SystemExit) as exc:
        main([str(runs[0]), "--table", "--levels", "0.05", "--metric", "eval/final_distance"])
    assert exc.value.code == 2
    assert capsys.readouterr().err == ("her-plot: error: --levels: first crossings are given for success rates, "
                                       "got --metric eval/final_distance\n")
    assert main([str(runs[0]), "--table", "--metric", "eval/final_distance"]) == 0
    assert "to 0.5" not in capsys.readouterr().out


def test_her_plot_out_in_an_unknown_format_is_one_line(runs, tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        main([str(runs[0]), "--out", str(tmp_path / "x.txt")])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and err.startswith(f"her-plot: error: --out {tmp_path / 'x.txt'}: expected a "
                                                         "file name ending in an image format (") and "png" in err
    assert "got .txt" in err and not (tmp_path / "x.txt").exists()


@pytest.mark.parametrize("edit, expect", [
    (lambda rows: rows[2].__setitem__(slice(3, None), []), "metrics.csv, line 3: expected 8 fields (the header's), got 3"),
    (lambda rows: rows.__setitem__(slice(1, 3), [rows[2], rows[1]]),
     "metrics.csv, line 3, column env_steps: expected a number larger than the row before's, got 1000"),
    (lambda rows: rows[2].__setitem__(4, "7"), "line 3, column eval/success_rate: expected a rate in [0, 1], got 7"),
    (lambda rows: rows[2].__setitem__(4, "nan"), "line 3, column eval/success_rate: expected a rate in [0, 1]"),
    (lambda rows: rows[2].__setitem__(5, "abc"), "line 3, column eval/final_distance: expected a number, got 'abc'"),
    (lambda rows: rows[2].__setitem__(0, ""), "line 3, column env_steps: expected a number larger than the row"),
])
def test_a_corrupt_metrics_csv_is_refused_naming_the_line_and_column(runs, tmp_path, capsys, edit, expect):
    with open(runs[0] / "metrics.csv", newline="") as f:
        rows = list(csv.reader(f))
    edit(rows)
    with open(runs[0] / "metrics.csv", "w", newline="") as f:
        csv.writer(f).writerows(rows)
    with pytest.raises(SystemExit) as exc:
        main([str(runs[0]), "--table"])
    assert exc.value.code == 2
    assert expect in capsys.readouterr().err


def test_arguments_after_a_double_dash_are_run_directories(runs, capsys):
    with pytest.raises(SystemExit) as exc:
        main([str(runs[0]), "--table", "--", "-5"])
    assert exc.value.code == 2
    assert "no metrics.csv at -5" in capsys.readouterr().err


def test_her_plot_a_run_with_one_evaluation_is_drawn_as_a_point(runs, tmp_path, monkeypatch):
    import matplotlib.axes

    markers = []
    real = matplotlib.axes.Axes.plot

    def plot(self, x, y, *args, **kwargs):
        markers.append((len(np.asarray(x)), kwargs.get("marker")))
        return real(self, x, y, *args, **kwargs)

    monkeypatch.setattr(matplotlib.axes.Axes, "plot", plot)
    one = _write_run(tmp_path / "one-s0", [1000], [0.2], 0.01)
    assert main([str(runs[2]), "--label", "B", str(one), "--label", "one", "--out", str(tmp_path / "p.png")]) == 0
    assert markers == [(4, None), (4, None), (1, "o"), (1, "o")]  # both panels: the 4-point curve, then the point


def test_her_plot_table_steps_take_the_tables_own_k_and_m_suffixes(runs, capsys):
    assert main([str(runs[0]), "--table", "2000", "3.5k"]) == 0
    plain = capsys.readouterr().out
    assert main([str(runs[0]), "--table", "2k", "0.0035M"]) == 0
    assert capsys.readouterr().out == plain and "| at 2k | at 3.5k |" in plain


def test_a_metrics_csv_saved_with_a_byte_order_mark_reads_as_without(runs, tmp_path):
    """A spreadsheet saves a CSV with a UTF-8 byte-order mark before the header's first column."""
    bom = tmp_path / "bom"
    bom.mkdir()
    (bom / "metrics.csv").write_bytes(b"\xef\xbb\xbf" + (runs[0] / "metrics.csv").read_bytes())
    assert list(read_metrics(bom)) == list(read_metrics(runs[0]))
    np.testing.assert_array_equal(read_metrics(bom)["env_steps"], read_metrics(runs[0])["env_steps"])
    assert main([str(bom), "--out", str(tmp_path / "bom.png")]) == 0


@pytest.mark.parametrize("option, text, ok", [
    ("--label", "$x", True),  # one $: plain text
    ("--label", "$x^2$ run", True),
    ("--label", r"price \$5", True),
    ("--label", r"$\frac$", False),
    ("--label", "$a_$", False),
    ("--title", r"$\frac$", False),
])
def test_text_matplotlib_cannot_parse_as_math_is_one_line(runs, tmp_path, capsys, option, text, ok):
    out = tmp_path / "m.png"
    argv = [str(runs[0]), "--label", text] if option == "--label" else [str(runs[0]), "--title", text]
    if ok:
        assert main([*argv, "--out", str(out)]) == 0
        return
    with pytest.raises(SystemExit) as exc:
        main([*argv, "--out", str(out)])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith(f"her-plot: error: {option} {text!r}: matplotlib cannot draw the math text between "
                              "its $ signs (") and err[-1].endswith(r"write \$ for a literal dollar sign"), err
    assert not out.exists()


def test_her_plot_table_out_to_a_fifo_is_written_into_it_not_replaced(runs, tmp_path, capsys):
    # a rename onto /dev/full or /dev/stdout (as root) would replace the device with a plain file
    import os
    import threading

    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    got: list[str] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_text()), daemon=True)
    reader.start()
    assert main([str(runs[0]), "--table", "--out", str(fifo)]) == 0
    reader.join(timeout=30)
    assert fifo.is_fifo() and got and got[0].startswith("| run |"), got
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []  # no temp file left


def test_her_plot_of_a_symlink_loop_is_one_line(tmp_path, capsys):
    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    with pytest.raises(SystemExit) as exc:
        main([str(tmp_path / "a"), "--out", str(tmp_path / "x.png")])
    err = capsys.readouterr().err.strip()
    assert exc.value.code == 2 and err == f"her-plot: error: no metrics.csv at {tmp_path / 'a'}", err
