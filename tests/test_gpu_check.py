"""The GPU path: CUDA graphs for compiled updates on a CUDA device, and the prepared check ``scripts/gpu_check.sh``.

Without a GPU: which ``torch.compile`` mode each device gets, that every update marks a CUDA-graph step, that
TD3 keeps a copy (not a graph output) of the actor loss it reports between delayed actor steps, the benchmark's
device code on CPU tensors, the scripts' syntax, the wheel list, and a dry run of the whole check on the CPU
(FetchReach, two seeds side by side, the results folder's layout). With a GPU (``-k cuda``, run by the check):
compiled updates under CUDA graphs, against eager ones, for every algorithm.
"""

from __future__ import annotations

import csv
import importlib.util
import io
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest
import torch

from her_agents.algos.registry import make_agent

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "gpu_check.sh"
WHEELS = ROOT / "scripts" / "gpu_wheels.sh"
OBS, GOAL, ACT = 7, 3, 2
ALGOS = ["ddpg", "td3", "sac", "tqc"]
NEEDS_CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def make_batch(batch_size: int = 16, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "observation": rng.normal(size=(batch_size, OBS)).astype(np.float32),
        "desired_goal": rng.normal(size=(batch_size, GOAL)).astype(np.float32),
        "action": rng.uniform(-1, 1, (batch_size, ACT)).astype(np.float32),
        "reward": -(rng.random(batch_size) < 0.5).astype(np.float32),
        "next_observation": rng.normal(size=(batch_size, OBS)).astype(np.float32),
        "discount": np.full(batch_size, 0.98, np.float32),
        "terminated": np.zeros(batch_size, bool),
        "weight": np.ones(batch_size, np.float32),
    }


def small_agent(algo: str, **kw):
    agent = make_agent(algo, OBS, GOAL, ACT, **{"hidden": (16,), "device": "cpu", **kw})
    batch = make_batch()
    agent.update_normalizer(batch["observation"], batch["desired_goal"])
    return agent


# ------------------------------------------------------------------------------- the compile path, on the CPU
def test_compile_mode_is_reduce_overhead_only_on_cuda(monkeypatch):
    calls = []

    def recording_compile(fn, **kwargs):
        calls.append(kwargs)
        return fn

    monkeypatch.setattr(torch, "compile", recording_compile)
    agent = small_agent("ddpg", compile=True)
    agent.update(make_batch())
    assert agent.compiled(agent.train_step).mode is None
    # the CPU path: the whole update, one graph, static shapes, Inductor's C++ wrapper
    assert calls == [{"dynamic": False, "options": {"cpp_wrapper": True}}]
    on_cuda = small_agent("ddpg", compile=True)
    on_cuda.device = torch.device("cuda")  # only the choice: nothing runs there
    fn = on_cuda.compiled(on_cuda.train_step)
    assert fn.mode == "reduce-overhead" and calls[-1] == {"dynamic": False, "mode": "reduce-overhead"}


def test_each_update_marks_one_cuda_graph_step_only_when_compiled_on_cuda(monkeypatch):
    marks = []
    monkeypatch.setattr(torch.compiler, "cudagraph_mark_step_begin", lambda: marks.append(1))
    monkeypatch.setattr(torch, "compile", lambda fn, **kwargs: fn)
    agent = small_agent("td3", compile=True)
    steps = []
    original = agent._cuda_graph_step
    agent._cuda_graph_step = lambda: (steps.append(1), original())
    for _ in range(3):
        agent.update(make_batch())
    assert len(steps) == 3 and marks == []  # every update starts a step; on the CPU it marks nothing
    agent.device = torch.device("cuda")
    agent._cuda_graph_step()
    assert marks == [1]
    eager = small_agent("td3")
    eager.device = torch.device("cuda")
    eager._cuda_graph_step()  # not compiled: no CUDA graphs, no mark
    assert marks == [1]


def test_td3_keeps_a_clone_of_the_actor_loss_for_cuda_graphs(monkeypatch):
    """Under CUDA graphs a compiled function's outputs live in memory the next update's replay overwrites:
    the actor loss TD3 reports between its delayed actor steps must be a copy."""
    outputs = []

    def recording_compile(fn, **kwargs):
        def run(*args, **kw):
            outputs.append(fn(*args, **kw))
            return outputs[-1]
        return run

    monkeypatch.setattr(torch, "compile", recording_compile)
    agent = small_agent("td3", compile=True)
    first = agent.update(make_batch())
    second = agent.update(make_batch())  # the delayed actor step
    actor_loss = outputs[-1][1]  # the update's flat metrics: critic loss, actor loss, ...
    assert actor_loss.dim() == 0 and agent._last_actor_loss.item() == pytest.approx(actor_loss.item())
    assert agent._last_actor_loss.untyped_storage().data_ptr() != actor_loss.untyped_storage().data_ptr()
    third = agent.update(make_batch())
    assert third["actor_loss"] == second["actor_loss"] != first["actor_loss"]


def load_bench():
    spec = importlib.util.spec_from_file_location("bench_update", ROOT / "tests" / "benchmarks" / "bench_update.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_bench_update_cuda_code_path_runs_on_cpu_tensors():
    """bench_update.py --device cuda's code (batches as device tensors, the reference and the FLOP floor on the
    device) with "cpu:0": CPU tensors, the same path but for the synchronization."""
    bench = load_bench()
    batch = bench.make_batch(8, device="cpu:0")
    assert isinstance(batch.observation, torch.Tensor)
    assert bench.time_updates(bench.ReferenceAgent("sac", (16,), "cpu:0"), batch, 1, 1, repeats=1,
                              device="cpu:0") > 0
    agent = make_agent("td3", bench.OBS, bench.GOAL, bench.ACT, device="cpu:0", hidden=[16])
    agent.update_normalizer(*bench.host(batch.observation, batch.desired_goal))
    assert bench.time_updates(agent, batch, 1, 1, repeats=1, device="cpu:0") > 0
    ms, gflop = bench.flop_floor("ddpg", batch, "fp32", (16,), False, 1, device="cpu:0")
    assert ms > 0 and gflop > 0


# ------------------------------------------------------------------------------- the scripts, on the CPU
def test_scripts_parse():
    for script in (SCRIPT, WHEELS):
        subprocess.run(["bash", "-n", str(script)], check=True)
    help_text = subprocess.run(["bash", str(SCRIPT), "--help"], capture_output=True, text=True, check=True).stdout
    assert "--dry-run" in help_text and "BUDGET_S" in help_text


def test_gpu_wheels_lists_what_the_gpu_image_lacks():
    out = subprocess.run(["bash", str(WHEELS)], env={**os.environ, "LIST_ONLY": "1", "PYTHON": sys.executable},
                         capture_output=True, text=True, check=True).stdout
    names = {spec.split("==")[0] for spec in out.split(":", 1)[1].split()}
    assert {"gymnasium", "gymnasium-robotics", "mujoco", "omegaconf"} <= names
    assert not names & {"torch", "numpy", "tqdm", "matplotlib", "wandb", "imageio-ffmpeg"}
    assert ".whl/" in (ROOT / ".gitignore").read_text().split()


@pytest.mark.skipif(bool(os.environ.get("GPU_CHECK_INNER")), reason="inside a check already")
def test_dry_run_of_the_gpu_check_on_the_cpu(tmp_path):
    """The whole check with GPU_CHECK_DEVICE=cpu and tiny settings: every step passes, two FetchReach seeds run
    side by side, and $OUT holds the step logs and results.tar.gz with each seed's config.yaml and metrics.csv
    (at most 8 files: what the device tool brings back)."""
    out = tmp_path / "out"
    env = {**os.environ, "GPU_CHECK_DEVICE": "cpu", "OUT": str(out), "WORK": str(tmp_path / "work"),
           "PYTHON": sys.executable, "SEEDS": "0 1", "STEPS": "100", "BUDGET_S": "240", "TOTAL_S": "900",
           "TESTS": "-p no:xdist tests/test_gpu_check.py -k scripts_parse",  # the -k cuda ones ran here already
           "TRAIN_OVERRIDES": "train.warmup_steps=50 train.learning_starts=50 train.eval_every=50 "
                              "train.eval_episodes=1 env.eval_envs=1 train.batch_size=16 agent.hidden=[16] "
                              "agent.compile=false"}
    env.pop("PYTHONPATH", None)
    proc = subprocess.run(["bash", str(SCRIPT)], env=env, capture_output=True, text=True, timeout=900)
    summary = (out / "summary.log").read_text()
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    for step in ("info", "install", "tests", "bench", "train"):
        assert f"{step}: exit 0" in summary, summary + proc.stdout[-3000:]
    files = sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file())
    assert files == ["bench.log", "info.log", "install.log", "results.tar.gz", "summary.log", "tests.log",
                     "train.log"]
    assert "FLOP floor" in (out / "bench.log").read_text()
    with tarfile.open(out / "results.tar.gz") as tar:
        members = set(tar.getnames())
        for seed in (0, 1):
            run = f"results/fetch_reach_sac_s{seed}"
            assert {f"{run}/config.yaml", f"{run}/metrics.csv", f"{run}/stdout.log"} <= members
            rows = list(csv.DictReader(io.TextIOWrapper(tar.extractfile(f"{run}/metrics.csv"))))
            assert rows and int(rows[-1]["env_steps"]) == 100
            config = tar.extractfile(f"{run}/config.yaml").read().decode()
            assert f"seed: {seed}" in config and "device: cpu" in config
    assert "fetch_reach_sac_s1: 2 evaluations" in summary


# ------------------------------------------------------------------------------- on a GPU
def cuda_graph_counts() -> tuple[int, int | None]:
    """(Inductor's count of compiled graphs that skipped CUDA graphs, CUDA graphs recorded on the current device;
    None where torch's CUDAGraph Trees internals are not as expected)."""
    from torch._dynamo.utils import counters

    skips = counters["inductor"]["cudagraph_skips"]
    try:
        from torch._inductor import cudagraph_trees

        manager = cudagraph_trees.get_manager(torch.cuda.current_device(), create_if_none_exists=False)

        def count(groups) -> int:
            return sum(1 + count(node.children) for nodes in groups.values() for node in nodes)

        return skips, 0 if manager is None else count(manager.roots)
    except (AttributeError, ImportError, TypeError):
        return skips, None


@NEEDS_CUDA
@pytest.mark.parametrize("algo, levers", [
    ("ddpg", {}),
    # the levers of issue 55: AdamW's decay, resets between replays (in place), REDQ's subset as a graph input
    ("ddpg", {"critic_weight_decay": 0.5, "actor_weight_decay": 0.5, "reset_every": 2}),
    ("td3", {"policy_noise": 0.0, "policy_delay": 1, "n_critics": 3, "target_subset": 2, "reset_every": 3}),
])
def test_cuda_graphs_compiled_update_matches_eager_on_cuda(algo, levers):
    """DDPG, and TD3 with the levers (no noise in the update), in fp32 on CUDA: the compiled update (CUDA graphs:
    warm-up, recording, then replays) gives the eager update's losses, TD errors and weights, and no compiled
    graph skips CUDA graphs."""
    batch = make_batch(64)
    skips_before, _ = cuda_graph_counts()
    metrics, agents = {}, {}
    for compiled in (False, True):
        torch.manual_seed(0)
        agent = make_agent(algo, OBS, GOAL, ACT, hidden=(64, 64), layer_norm=True, device="cuda",
                           compile=compiled, precision="fp32", **levers)
        agent.update_normalizer(batch["observation"], batch["desired_goal"])
        metrics[compiled] = [agent.update(batch) for _ in range(5)]
        agents[compiled] = agent
    fast = agents[True]
    assert fast.compiled(fast.train_step).mode == "reduce-overhead" and fast.compiled(fast.train_step).compiled_ok
    skips, graphs = cuda_graph_counts()
    assert skips == skips_before, "a compiled update ran without CUDA graphs (TORCH_LOGS=perf_hints says why)"
    assert graphs is None or graphs >= 1
    for eager, comp in zip(metrics[False], metrics[True]):
        assert comp["critic_loss"] == pytest.approx(eager["critic_loss"], rel=1e-3, abs=1e-5)
        assert comp["actor_loss"] == pytest.approx(eager["actor_loss"], rel=1e-3, abs=1e-5)
        np.testing.assert_allclose(comp["td_error"], eager["td_error"], rtol=1e-3, atol=1e-4)
    for name, net in agents[True].networks().items():
        ref = agents[False].networks()[name].state_dict()
        for k, t in net.state_dict().items():
            torch.testing.assert_close(t, ref[k], rtol=1e-3, atol=1e-4)


@NEEDS_CUDA
@pytest.mark.parametrize("algo", ALGOS)
def test_cuda_graphs_bf16_update_of_each_algo(algo):
    """Compiled bf16 updates on CUDA (the Fetch configs' setting there): finite metrics over replays, TD3's
    actor loss reported between delayed steps (kept across a replay), a checkpoint a CPU agent acts like."""
    batch = make_batch(64)
    torch.manual_seed(0)
    agent = make_agent(algo, OBS, GOAL, ACT, hidden=(64, 64), layer_norm=True, device="cuda", compile=True,
                       precision="auto")
    assert agent.precision == ("bf16" if torch.cuda.is_bf16_supported() else "fp32")
    agent.update_normalizer(batch["observation"], batch["desired_goal"])
    metrics = [agent.update(batch) for _ in range(6)]
    assert agent.compiled(agent.train_step).compiled_ok
    for m in metrics:
        assert m["td_error"].shape == (64,) and m["td_error"].dtype == np.float32
        assert all(np.isfinite(v) for k, v in m.items() if k != "td_error")
    if algo == "td3":  # actor steps at updates 2, 4, 6: updates 3 and 5 report the one before
        assert metrics[2]["actor_loss"] == metrics[1]["actor_loss"]
        assert metrics[4]["actor_loss"] == metrics[3]["actor_loss"] != metrics[1]["actor_loss"]
    cpu = make_agent(algo, OBS, GOAL, ACT, hidden=(64, 64), layer_norm=True, device="cpu")
    cpu.load_state_dict(agent.state_dict())
    np.testing.assert_allclose(cpu.act(batch["observation"], batch["desired_goal"], deterministic=True),
                               agent.act(batch["observation"], batch["desired_goal"], deterministic=True),
                               atol=1e-4)
