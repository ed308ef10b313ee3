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


def test_her_plot_table_gives_steps_to_each_level_and_success_at_given_steps(runs, capsys):
    assert main([str(runs[0]), str(runs[1]), "--label", "A", str(runs[2]), "--label", "B",
                 "--table", "2000", "3500"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0] == "| run | to 0.5 | to 0.9 | at 2k | at 3.5k | env steps | wall min |"
    rows = {ln.split(" | ")[0].lstrip("| "): ln.split(" | ")[1:] for ln in lines[2:]}
    # a-s0: 0.1 0.4 0.7 0.9 at 1k..4k, 40 s; at 3.5k the last evaluation at or before it (3k) counts
    assert rows["a-s0"] == ["3k", "4k", "0.40", "0.70", "4k", "1 |"]
    assert rows["a-s1"] == ["2k", "-", "0.50", "-", "3k", "1 |"]  # never 0.9; ended before 3.5k
    # mean of a-s0 and a-s1 on their common range (1k-3k): 0.05, 0.45, 0.75 -> 0.5 first at 3k, 0.9 never
    assert rows["**A: mean of 2**"][:4] == ["3k", "-", "0.45", "-"]
    assert rows["b-s0"][:4] == ["4k", "-", "0.10", "0.30"]


def test_her_plot_table_levels_and_a_step_before_the_first_evaluation(runs, capsys):
    assert main([str(runs[0]), "--table", "0", "2000", "--levels", "0.4", "0.7"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0] == "| run | to 0.4 | to 0.7 | at 0 | at 2k | env steps | wall min |"
    # a-s0: 0.1 0.4 0.7 0.9 at 1k..4k; nothing was evaluated at or before 0 env steps
    assert lines[2].split(" | ")[1:5] == ["2k", "3k", "-", "0.40"]
