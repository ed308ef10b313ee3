"""The analysis scripts' pure parts: ``scripts/slide_failure_modes.py`` sorts an episode's end into the kind of
failure it names; the benchmark ``tests/benchmarks/bench_train_speed.py`` gives each of its runs a directory and
``tests/benchmarks/bench_train_setting.py`` reports its settings and a time breakdown that adds up;
``scripts/check_results_configs.py`` holds each config the results quote to what its committed seeds ran."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import numpy as np
import pytest

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"


def load_script(name: str):
    """``scripts/<name>.py`` imported as a module (the scripts are not a package)."""
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def slide():
    return load_script("slide_failure_modes")


START = np.array([1.3, 0.75, 0.41])
GOAL = np.array([1.8, 0.75, 0.41])  # 50 cm ahead of the puck along +x


@pytest.mark.parametrize(("final", "success", "kind"), [
    ([1.81, 0.75, 0.41], True, "success"),
    ([1.31, 0.75, 0.41], False, "untouched"),
    ([1.9, 0.80, 0.20], False, "off table"),
    ([1.6, 0.76, 0.41], False, "short"),
    ([1.95, 0.72, 0.41], False, "overshoot"),
    ([1.78, 0.85, 0.41], False, "sideways"),
])
def test_slide_failure_kinds(slide, final, success, kind):
    assert slide.classify(START, GOAL, np.array(final), success)[0] == kind


def test_slide_errors_are_measured_along_and_across_the_start_to_goal_line(slide):
    goal = START + np.array([0.3, 0.4, 0.0])  # a diagonal line: unit direction (0.6, 0.8)
    final = goal + np.array([0.072, 0.096, 0.0]) + np.array([-0.08, 0.06, 0.0])  # 12 cm past it, 10 cm aside
    kind, along, lateral = slide.classify(START, goal, final, False)
    assert along == pytest.approx(0.12) and lateral == pytest.approx(0.10) and kind == "overshoot"


@pytest.fixture(scope="module")
def behaviour():
    return load_script("fetch_policy_behaviour")


def test_policy_behaviour_tells_reaching_moving_and_saturation(behaviour):
    actions = np.array([[1.0, -1.0, 0.0, 0.5], [0.99, 0.0, 0.0, -0.5]])
    obj = np.array([[1.3, 0.75, 0.42]] * 3)
    far = behaviour.episode_stats(actions, obj + [0.2, 0, 0], obj, success=False)
    assert np.allclose(far["abs_action"], [0.995, 0.5, 0.0, 0.5])
    assert far["saturated"] == pytest.approx(3 / 8)
    assert far["closest"] == pytest.approx(0.2) and far["reached"] == 0.0 and far["moved"] == 0.0

    grip = np.array([[1.5, 0.75, 0.42], [1.33, 0.75, 0.42], [1.36, 0.75, 0.42]])
    pushed = obj + [[0, 0, 0], [0, 0, 0], [0.05, 0, 0]]
    near = behaviour.episode_stats(actions, grip, pushed, success=True)
    assert near["closest"] == pytest.approx(0.01) and near["reached"] == 1.0 and near["moved"] == 1.0
    line = behaviour.summary([far, near])
    assert "reached 0.50" in line and "moved 0.50" in line and "success 0.50" in line


def test_bench_train_speed_gives_each_run_its_own_run_directory(monkeypatch):
    """``--algos ddpg sac`` (or ``--repeats``): the second run must not find the first's run in its directory."""
    import her_agents.loop.train as train_mod

    spec = importlib.util.spec_from_file_location("bench_train_speed", SCRIPTS.parent / "tests" / "benchmarks" /
                                                  "bench_train_speed.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)

    class Opened(Exception):
        pass

    dirs = []

    def opens_the_run_dir_only(cfg, *args, **kwargs):  # the real refusal, then no training
        lock = train_mod.open_run_dir(cfg, 0, None, False)
        (lock.run_dir / "metrics.csv").write_text("env_steps,wall_time\n")
        lock.release()
        dirs.append(str(lock.run_dir))
        raise Opened

    monkeypatch.setattr(train_mod, "train", opens_the_run_dir_only)
    for algo in ("ddpg", "sac", "sac"):
        with pytest.raises(Opened):
            bench.run_ours(algo, 1000, 1000, 0)
    assert len(set(dirs)) == 3


def test_bench_train_setting_reports_each_setting_and_a_breakdown_that_adds_up(monkeypatch, capsys):
    spec = importlib.util.spec_from_file_location("bench_train_setting", SCRIPTS.parent / "tests" / "benchmarks" /
                                                  "bench_train_setting.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    monkeypatch.setenv("WANDB_MODE", "disabled")
    assert bench.main(["--config", "fetch_reach_ddpg", "--steps", "100", "--no-compile", "--settings", "1:serial",
                       "1:overlap", "--", "train.learning_starts=100", "train.warmup_steps=100",
                       "train.eval_episodes=1", "env.eval_envs=1", "agent.hidden=[16]", "train.batch_size=16"]) == 0
    out = capsys.readouterr().out
    settings = {line.split()[0]: line.split() for line in out.splitlines() if re.match(r"  1:(serial|overlap) ", line)}
    assert settings["1:serial"][1] == "1" and float(settings["1:overlap"][2]) > 0  # threads, env steps/s
    ms = {m[1]: float(m[2]) for m in re.finditer(r"^  (\S.*?) +(-?\d+\.\d+) +-?\d+\.\d+%", out, re.MULTILINE)}
    assert list(ms) == ["env step", "acting", "storing", "updates", "rest of the loop", "evaluation", "logging",
                        "checkpoint"]
    assert ms["updates"] > 0 and ms["env step"] > 0 and ms["evaluation"] > 0
    total = re.search(r"^  total +(\d+\.\d+) +100%", out, re.MULTILINE)
    assert total and sum(ms.values()) == pytest.approx(float(total[1]), abs=0.01)


def test_exploration_schemes_give_bounded_actions_of_their_kind():
    exploration = load_script("exploration_reach")
    rng = np.random.default_rng(0)
    draws = {s: np.array([exploration.Exploration(s, 4, rng)() for _ in range(2000)])
             for s in exploration.Exploration.SCHEMES}
    for a in draws.values():
        assert a.shape == (2000, 4) and np.abs(a).max() <= 1.0
    assert draws["recipe"].std() < draws["noise05"].std() < draws["sac"].std()
    ou = exploration.Exploration("ou", 4, rng)
    steps = np.array([ou() for _ in range(200)])
    assert np.corrcoef(steps[:-1, 0], steps[1:, 0])[0, 1] > 0.5  # temporally correlated, unlike the others
    with pytest.raises(ValueError, match="scheme must be one of"):
        exploration.Exploration("pink", 4, rng)


@pytest.mark.parametrize(("config", "runs", "at"), [
    ("fetch_push_sac", "push_sac_layers_s*", 200_000),
    ("fetch_push_ddpg", "push_ddpg_ebp_u1_s*", 200_000),
    ("fetch_push_td3", "push_td3_u1_s*", 200_000),
    ("fetch_pick_and_place_sac_rs", "pnp_sac_rs_s*", 350_000),
    ("fetch_pick_and_place_sac_ebp", "pnp_sac_ebp_s*", 350_000),
    ("fetch_pick_and_place_ddpg", "pnp_ddpg_grs_s*", 350_000),
    ("fetch_pick_and_place_td3", "pnp_td3_grs_s*", 350_000),
    ("fetch_slide_ddpg", "slide_ddpg_l2q_lownoise_s*", 300_000),
    ("fetch_slide_td3", "slide_td3_l2q_lownoise_s*", 300_000),
])
def test_the_configs_results_quote_are_what_their_seeds_ran(config, runs, at, capsys):
    """A config edit (or one of a config it builds on) that changes what its committed seeds ran fails here."""
    check = load_script("check_results_configs")
    results = Path(__file__).resolve().parents[1] / "results"
    code = check.main([config, str(results / runs), "--at", str(at)])
    out = capsys.readouterr().out
    assert code == 0, out
    assert out.count("config equal") == 3 and f"{config}: mean of 3 at {at}:" in out


def test_check_results_configs_names_each_key_a_run_ran_differently(tmp_path, capsys):
    check = load_script("check_results_configs")
    src = Path(__file__).resolve().parents[1] / "results" / "pnp_ddpg_grs_s0"
    run = tmp_path / "run_s0"
    run.mkdir()
    (run / "config.yaml").write_text((src / "config.yaml").read_text().replace("energy: true", "energy: false"))
    (run / "metrics.csv").write_text((src / "metrics.csv").read_text())
    assert check.main(["fetch_pick_and_place_ddpg", str(tmp_path / "run_s*"), "--at", "350000"]) == 1
    assert "config differs: replay.energy ran False, config True" in capsys.readouterr().out
    assert check.main(["fetch_pick_and_place_ddpg", str(tmp_path / "run_s0"), "--at", "123"]) == 1  # no such row
    assert "no evaluation row at 123 env steps" in capsys.readouterr().out


def test_check_results_configs_answers_bad_input_in_one_line(tmp_path, capsys):
    check = load_script("check_results_configs")
    (tmp_path / "empty").mkdir()
    assert check.main(["fetch_push_ddpg", str(tmp_path / "empty"), "--at", "1"]) == 2
    assert capsys.readouterr().err == f"runs: {tmp_path / 'empty'} has no config.yaml (a run folder holds " \
                                      "config.yaml and metrics.csv)\n"
    assert check.main(["fetch_push_dpg", str(tmp_path / "empty"), "--at", "1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("config: config 'fetch_push_dpg' is neither a file nor one of the shipped configs") and \
        err.count("\n") == 1
