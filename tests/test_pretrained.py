"""Policy files, ``her-export`` and the shipped policies (``her-eval pretrained:NAME``)."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from her_agents.algos.registry import agent_from_checkpoint
from her_agents.cli import eval_main
from her_agents.config import load_config
from her_agents.loop.train import train
from her_agents.pretrained import load_pretrained, names, pretrained_dir, pretrained_results
from her_agents.run.checkpoint import load_checkpoint
from her_agents.run.export import export_run, measure
from her_agents.run.policy_file import load_policy, read_policy_file

#: success rate each shipped policy must reach on 20 episodes; a policy shipped without an entry fails
#: test_every_shipped_policy_has_a_threshold (the issue asks Push for >= 0.9)
THRESHOLDS = {"FetchReach-v4": 0.9, "FetchPush-v4": 0.9, "FetchPickAndPlace-v4": 0.9, "FetchSlide-v4": 0.6}
TINY = ["train.total_env_steps=200", "train.learning_starts=100", "train.warmup_steps=50", "train.eval_every=100",
        "train.eval_episodes=2", "env.eval_envs=2", "agent.compile=false", "log.wandb.mode=disabled",
        "log.progress=false"]


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("export") / "run"
    train(load_config("fetch_reach_ddpg", [*TINY, f"log.run_dir={run_dir}"]))
    return run_dir


@pytest.fixture(scope="module")
def exported(tiny_run, tmp_path_factory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("export") / "out"
    results = export_run(tiny_run, out, episodes=4, file_format="torch", log=lambda *_: None)
    return out, results


@pytest.mark.parametrize("name", names())
def test_shipped_policy_reaches_its_success_rate_on_20_episodes(name):
    ev = measure(pretrained_dir(name), episodes=20, seed=2026)  # other episodes than the card's
    assert ev["success_rate"] >= THRESHOLDS[name], f"{name}: {ev}"


def test_reach_ships_and_every_shipped_policy_has_a_threshold():
    assert "FetchReach-v4" in names()
    assert set(names()) <= set(THRESHOLDS)


@pytest.mark.parametrize("name", names())
def test_shipped_card_is_measured_on_the_shipped_file(name):
    res = pretrained_results(name)
    model = pretrained_dir(name) / res["file"]
    assert res["episodes"] == 100 and res["file_bytes"] == model.stat().st_size
    _, meta = read_policy_file(model)
    assert res["dtype"] == meta["dtype"] and res["env_id"] == name
    card = (pretrained_dir(name) / "README.md").read_text()
    assert f"**{res['success_rate']:.3f}** on 100 deterministic episodes" in card
    assert f"her-eval pretrained:{name}" in card
    assert model.stat().st_size < 2 * 2**20  # a few MB for all of them


def test_list_pretrained_prints_the_names(capsys):
    assert eval_main(["--list-pretrained"]) == 0
    assert capsys.readouterr().out.split() == names()


def test_unknown_pretrained_name_is_one_line_with_the_valid_ones(capsys):
    with pytest.raises(SystemExit) as exc:
        eval_main(["pretrained:FetchNope-v4", "--episodes", "1"])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "FetchNope-v4" in err and "FetchReach-v4" in err


def test_her_eval_runs_a_shipped_policy(capsys):
    assert eval_main(["pretrained:FetchReach-v4", "--episodes", "3"]) == 0
    out = capsys.readouterr().out
    assert "FetchReach-v4" in out and "success rate" in out and "over 3 episodes" in out


def test_export_writes_the_hub_layout_with_a_measured_result(exported, tiny_run):
    out, results = exported
    assert sorted(p.name for p in out.iterdir()) == ["README.md", "config.yaml", "model.pt", "results.json"]
    assert json.loads((out / "results.json").read_text()) == results
    assert (out / "config.yaml").read_text() == (tiny_run / "config.yaml").read_text()
    counters = load_checkpoint(tiny_run)["counters"]
    assert results["env_steps"] == counters["env_steps"] == 200 and results["episodes"] == 4
    assert results["success_rate"] == measure(out, episodes=4)["success_rate"]  # the file's own figure
    assert results["file_bytes"] == (out / "model.pt").stat().st_size
    assert (out / "model.pt").stat().st_size < (tiny_run / "checkpoint.pt").stat().st_size / 3
    assert "library_name: her-robotics" in (out / "README.md").read_text()


def test_exported_policy_acts_as_the_checkpoint(exported, tiny_run):
    out, results = exported
    policy = load_policy(out)
    agent = agent_from_checkpoint(load_checkpoint(tiny_run), compile=False)
    rng = np.random.default_rng(0)
    obs, goal = rng.normal(size=(64, 10)).astype(np.float32), rng.normal(size=(64, 3)).astype(np.float32)
    a, b = policy.agent.act(obs, goal, deterministic=True), agent.act(obs, goal, deterministic=True)
    tol = 0 if results["dtype"] == "float32" else 5e-3  # float16 weights, float32 arithmetic
    np.testing.assert_allclose(a, b, atol=tol)


def test_export_float32_is_exact_and_refuses_a_non_empty_directory(tiny_run, tmp_path):
    out = tmp_path / "f32"
    export_run(tiny_run, out, episodes=1, dtype="float32", file_format="torch", log=lambda *_: None)
    tensors, meta = read_policy_file(out / "model.pt")
    actor = agent_from_checkpoint(load_checkpoint(tiny_run), compile=False).actor.state_dict()
    assert meta["dtype"] == "float32"
    for k, v in actor.items():
        assert torch.equal(tensors[f"actor.{k}"], v)
    with pytest.raises(ValueError, match="not empty: pass --overwrite"):
        export_run(tiny_run, out, episodes=1, log=lambda *_: None)


class _Payload:
    def __reduce__(self):
        return (os.system, ("echo pwned",))


def test_loading_never_unpickles_code(tmp_path):
    buf = io.BytesIO()
    torch.save({"metadata": {"format": "her-robotics-policy"}, "tensors": {}, "x": _Payload()}, buf)
    (tmp_path / "model.pt").write_bytes(buf.getvalue())
    with pytest.raises(ValueError, match="not a readable her-robotics policy file"):
        read_policy_file(tmp_path / "model.pt")


def test_her_export_cli_errors_are_one_line(tmp_path):
    proc = subprocess.run([sys.executable, "-c", "import sys; from her_agents.run.export import main; "
                           "sys.exit(main())", str(tmp_path / "nope"), str(tmp_path / "out")],
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert proc.stderr.startswith("her-export: error:") and "nope" in proc.stderr


def test_load_pretrained_gives_an_acting_policy():
    policy = load_pretrained("FetchReach-v4")
    a = policy.agent.act(np.zeros((2, 10), np.float32), np.zeros((2, 3), np.float32), deterministic=True)
    assert a.shape == (2, 4) and np.all(np.abs(a) <= 1)


def test_safetensors_export_holds_the_same_policy(tiny_run, tmp_path):
    pytest.importorskip("safetensors")
    for name, fmt in (("st", "safetensors"), ("pt", "torch")):
        export_run(tiny_run, tmp_path / name, episodes=1, dtype="float16", file_format=fmt, log=lambda *_: None)
    out = tmp_path / "st"
    assert sorted(p.name for p in out.iterdir()) == ["README.md", "config.yaml", "model.safetensors", "results.json"]
    st, st_meta = read_policy_file(out / "model.safetensors")
    pt, pt_meta = read_policy_file(tmp_path / "pt" / "model.pt")
    assert st_meta == pt_meta and st.keys() == pt.keys()
    assert all(torch.equal(st[k], pt[k]) for k in st)


def test_her_eval_takes_an_exported_directory_and_still_a_run_directory(exported, tiny_run, capsys):
    out, results = exported
    assert eval_main([str(out), "--episodes", "2"]) == 0
    assert f"({out}, {results['dtype']}): success rate" in capsys.readouterr().out
    assert eval_main([str(tiny_run), "--episodes", "2"]) == 0
    assert "@ 200 env steps: success rate" in capsys.readouterr().out


@pytest.mark.parametrize("tolerance", [-1.0, 1.5, float("nan")])
def test_export_refuses_a_tolerance_outside_0_1(tmp_path, tolerance):
    # checked with the other options, before the run is read
    with pytest.raises(ValueError, match=r"^--tolerance must be a success-rate difference in \[0, 1\], got "):
        export_run(tmp_path / "run", tmp_path / "out", tolerance=tolerance, log=lambda *_: None)
    assert not (tmp_path / "out").exists()
