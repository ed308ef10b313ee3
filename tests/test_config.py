"""The run config: the ``agent`` section typed by the algorithm's config dataclass at load time (also after an
``algo=`` override and on resume), choices as Literals, each section checking its own values (issue 15, item 3).
No env is built and nothing is trained here."""

from __future__ import annotations

import dataclasses
import os
import re
import typing

import pytest
import yaml
import her
from her_agents.cli import train_main
from her_agents.config import (
    DERIVED_WHEN_UNSET,
    LOOP_OWNED,
    Config,
    EnvConfig,
    ReplayConfig,
    Strategy,
    TrainConfig,
    agent_config,
    config_dict,
    config_yaml,
    load_config,
    resume_config,
    torch_thread_count,
)
from her_agents.algos.ddpg import DDPGConfig
from her_agents.algos.registry import AGENTS, make_agent
from her_agents.algos.sac import SACConfig
from her_agents.algos.td3 import TD3Config
from her_agents.algos.tqc import TQCConfig


def _agent(cfg: Config) -> dict:
    """The ``agent`` section as the YAML keys have it (what a checkpoint saves and ``--print-config`` prints)."""
    return config_dict(cfg)["agent"]


def test_agent_override_is_typed_by_the_algorithms_dataclass():
    cfg = load_config("fetch_reach_ddpg", ["agent.hidden=[64,64]", "agent.actor_lr=1", "agent.precision=bf16"])
    section = _agent(cfg)
    assert section["hidden"] == (64, 64) and all(type(h) is int for h in section["hidden"])
    assert section["actor_lr"] == 1.0 and type(section["actor_lr"]) is float
    typed = agent_config(cfg, seed=3)
    assert type(typed) is DDPGConfig
    assert typed.hidden == (64, 64) and typed.precision == "bf16" and typed.seed == 3


def test_agent_section_holds_every_field_with_its_default_but_the_loops():
    for algo, config_cls in (("ddpg", DDPGConfig), ("td3", TD3Config), ("sac", SACConfig), ("tqc", TQCConfig)):
        section = _agent(load_config("fetch_reach_ddpg", [f"algo={algo}"]))
        defaults = dataclasses.asdict(config_cls())
        expected = {k: v for k, v in defaults.items() if k not in LOOP_OWNED and k not in DERIVED_WHEN_UNSET}
        assert section == expected, algo
    # what train.py relies on: no seed (the loop's train.seed), q_clip and noise_horizon only when set (else from
    # the env)
    assert "q_clip" not in _agent(load_config("fetch_reach_ddpg"))
    assert "noise_horizon" not in _agent(load_config("fetch_reach_ddpg"))
    assert _agent(load_config("fetch_reach_ddpg", ["agent.noise_horizon=20"]))["noise_horizon"] == 20
    assert _agent(load_config("fetch_reach_ddpg", ["agent.q_clip=null"]))["q_clip"] is None
    assert _agent(load_config("fetch_reach_sac"))["q_clip"] == (-50.0, 0.0)


def test_load_config_returns_the_typed_config_built_once():
    cfg = load_config("fetch_reach_sac", ["agent.hidden=[64,64]", "train.seed=3"])
    assert type(cfg) is Config and type(cfg.train) is TrainConfig and type(cfg.agent) is SACConfig
    assert cfg.agent.hidden == (64, 64) and cfg.agent.q_clip == (-50.0, 0.0) and cfg.train.seed == 3
    assert cfg.agent_unset == {"noise_horizon"}
    ddpg = load_config("fetch_reach_ddpg")
    # q_clip left unset: the loop derives it; the typed section holds the default meanwhile, the keys leave it out
    assert ddpg.agent_unset == {"q_clip", "noise_horizon"} and ddpg.agent.q_clip is None and "q_clip" not in _agent(ddpg)
    # a copy with another section keeps the typed agent and what was left unset
    copy = dataclasses.replace(ddpg, train=dataclasses.replace(ddpg.train, seed=7))
    assert copy.agent is ddpg.agent and copy.agent_unset == {"q_clip", "noise_horizon"} and copy.train.seed == 7
    with pytest.raises(ValueError, match=r"^agent must be a mapping or a SACConfig \(algo 'sac'\), got "):
        Config(algo="sac", agent=DDPGConfig())
    assert Config(algo="td3", agent=TD3Config(hidden=(8,))).agent_unset == frozenset()


def test_algo_override_retypes_the_agent_section():
    sac = _agent(load_config("fetch_reach_ddpg", ["algo=sac", "agent.alpha=0.1", "agent.autotune=false"]))
    assert sac["alpha"] == 0.1 and sac["autotune"] is False
    assert sac["noise_std"] == 0.0 and sac["action_l2"] == 0.0  # SAC's defaults, not DDPG's
    with pytest.raises(ValueError, match=r"unknown key 'agent.alpha' for algo 'ddpg'; valid agent keys: action_l2"):
        load_config("fetch_reach_ddpg", ["agent.alpha=0.1"])
    with pytest.raises(ValueError, match=r"unknown key 'agent.autotune' for algo 'ddpg'"):  # set by the SAC YAML
        load_config("fetch_reach_sac", ["algo=ddpg"])
    with pytest.raises(ValueError, match=r"unknown key 'agent.policy_delay' for algo 'ddpg'"):
        load_config("fetch_reach_td3", ["agent.policy_delay=3", "algo=ddpg"])
    assert _agent(load_config("fetch_reach_td3", ["agent.policy_delay=3"]))["policy_delay"] == 3
    assert load_config("fetch_reach_ddpg", ["algo=TD3"]).algo == "td3"


@pytest.mark.parametrize("override, expect", [
    ("agent.precision=fp16", "agent.precision must be one of ['fp32', 'bf16', 'auto'], got 'fp16' (str)"),
    ("agent.hidden=[64,6.5]", "agent.hidden must be a list of integers, got [64, 6.5] (list)"),
    ("agent.n_critics=2", "unknown key 'agent.n_critics' for algo 'ddpg'"),
    ("agent.q_clip=[0,-1]", "agent.q_clip must be null or [low, high] with low <= high, got [0.0, -1.0]"),
    ("agent.q_clip=[1,2,3]", "agent.q_clip must be a list of 2 numbers or null, got [1, 2, 3] (list)"),
    ("agent.action_l2=-1", "agent.action_l2 must be >= 0, got -1.0"),
    ("agent.n_threads=2", "agent.n_threads is set by the training loop: use train.torch_threads"),
    ("algo=ppo", "unknown algo 'ppo'; valid algos: ['ddpg', 'sac', 'td3', 'tqc']"),
    ("env.grasped_start=0.5", "env.grasped_start must be 0 for FetchReach-v4 (it needs an object to hold: "
                              "FetchPickAndPlace), got 0.5"),
    ("env.grasped_start=2", "env.grasped_start must be in [0, 1], got 2.0"),
    ("env.vectorization=threads", "env.vectorization must be one of ['sync', 'async'], got 'threads'"),
    ("log.wandb.mode=online2", "log.wandb.mode must be one of ['auto', 'online', 'offline', 'disabled']"),
    ("dist.mode=ps", "dist.mode must be one of ['data_parallel', 'actor_learner'], got 'ps'"),
    ("dist.backend=mpi", "dist.backend must be one of ['auto', 'gloo', 'nccl'], got 'mpi'"),
    ("train.device=gpu", "train.device must be auto, cpu, cuda or cuda:N, got 'gpu'"),
    ("train.gamma=1.5", "train.gamma must be in (0, 1], got 1.5"),
    ("train.updates_per_step=inf", "train.updates_per_step must be a finite number, got inf (float)"),
    ("train.updates_per_step=nan", "train.updates_per_step must be a finite number, got nan (float)"),
    ("agent.actor_lr=inf", "agent.actor_lr must be a finite number, got 'inf' (str)"),
    ("agent.polyak=.nan", "agent.polyak must be a finite number, got nan (float)"),
    ("agent.q_clip=[.nan,0]", "agent.q_clip must be a list of 2 numbers or null, got [nan, 0] (list)"),
    ("dist.timeout_s=inf", "dist.timeout_s must be a finite number, got inf (float)"),
    ("log.wandb.init_timeout_s=inf", "log.wandb.init_timeout_s must be a finite number, got inf (float)"),
    ("agent.compile=maybe", "agent.compile must be true or false, got 'maybe' (str)"),
    ("replay.n_step=0", "replay.n_step must be an integer >= 1, got 0"),
    ("replay.n_sampled_goal=-1", "replay.n_sampled_goal (k) must be an integer >= 0, got -1"),
    ("replay.alpha=-1", "replay.alpha must be a finite number >= 0, got -1.0"),
    ("replay.td_error_clip=0", "replay.td_error_clip must be a finite number > 0"),
    ("replay.capacity=0", "replay.capacity must be >= 1, got 0"),
    ("log.wandb.init_timeout_s=0", "log.wandb.init_timeout_s must be > 0, got 0.0"),
    ("dist.weight_sync_every=0", "dist.weight_sync_every must be >= 1, got 0"),
    ("train.torch_threads=0", "train.torch_threads must be auto or an integer >= 1, got 0"),
    ("train.torch_threads=fast", "train.torch_threads must be an integer or 'auto', got 'fast' (str)"),
])
def test_bad_value_is_refused_naming_the_key(override, expect):
    with pytest.raises(ValueError) as info:
        load_config("fetch_reach_ddpg", [override])
    assert expect in str(info.value)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("override, expect", [
    ("log.wandb.project=a/b", "log.wandb.project: W&B project names have 1 to 128 characters, none of / \\ # ? % :; "
                              "got 'a/b', which holds /"),
    ("log.wandb.project=what?", "log.wandb.project: W&B project names"),
    ("log.wandb.project=" + "p" * 129, "log.wandb.project: W&B project names have 1 to 128 characters, none of / \\ "
                                       "# ? % :; got 129 characters"),
    ("log.wandb.project=''", "log.wandb.project: W&B project names have 1 to 128 characters"),
    ("log.wandb.tags=[ok," + "t" * 65 + "]", "log.wandb.tags[1]: W&B tags have 1 to 64 characters, got 65"),
    ("log.wandb.tags=['']", "log.wandb.tags[0]: W&B tags have 1 to 64 characters, got 0"),
    ("log.wandb.group=' '", "log.wandb.group: expected a non-empty name or null"),
])
def test_names_wandb_would_refuse_after_its_retries_are_refused_at_config_time(override, expect):
    """W&B checks project names and tags only inside ``wandb.init``, after two minutes of retries, and the run
    then goes on without W&B: the config refuses them before the run starts."""
    with pytest.raises(ValueError) as info:
        load_config("fetch_reach_ddpg", [override])
    assert expect in str(info.value) and "\n" not in str(info.value)
    load_config("fetch_reach_ddpg", ["log.wandb.project=my-project_2", "log.wandb.tags=[" + "t" * 64 + "]"])


def test_wandb_rules_are_wandbs_own():
    """The forbidden characters are the ones W&B's own settings check refuses."""
    from wandb.sdk.wandb_settings import Settings

    from her_agents.config.sections import _WANDB_PROJECT_FORBIDDEN

    for ch in _WANDB_PROJECT_FORBIDDEN:
        with pytest.raises(Exception, match="Invalid project name"):
            Settings(project=f"a{ch}b")
    Settings(project="a-b_c.d")


def test_sac_options_are_checked_by_sacs_dataclass():
    with pytest.raises(ValueError, match=r"agent.alpha must be > 0, got 0.0"):
        load_config("fetch_reach_ddpg", ["algo=sac", "agent.alpha=0"])
    with pytest.raises(ValueError, match=r"agent.log_std_min must be <= log_std_max, got 3.0"):
        load_config("fetch_reach_ddpg", ["algo=sac", "agent.log_std_min=3"])


def test_torch_threads_auto_is_every_core_the_process_may_use_and_an_int_limits_it(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)  # conftest limits the test processes to 1
    cfg = load_config(None)
    assert cfg.train.torch_threads == "auto" and "\n  torch_threads: auto\n" in config_yaml(cfg)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    assert torch_thread_count(cfg.train.torch_threads) == cores
    assert torch_thread_count(load_config(None, ["train.torch_threads=1"]).train.torch_threads) == 1
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 2, 5, 7}, raising=False)  # e.g. under taskset
    monkeypatch.setattr(os, "cpu_count", lambda: 16)
    assert torch_thread_count("auto") == 4
    # with train.overlap_env the env workers step while the updates run: a core each, at least one thread left
    assert torch_thread_count("auto", env_workers=1) == 3 and torch_thread_count("auto", env_workers=8) == 1
    assert torch_thread_count(2, env_workers=1) == 2  # a number is taken as given
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")  # two torchrun ranks on this node share the cores
    assert torch_thread_count("auto") == 2 and torch_thread_count(3) == 3
    monkeypatch.delenv("LOCAL_WORLD_SIZE")
    monkeypatch.delattr(os, "sched_getaffinity")  # macOS, Windows
    assert torch_thread_count("auto") == 16
    assert torch_thread_count(None) == 1  # a checkpoint's config from before the key
    monkeypatch.setenv("OMP_NUM_THREADS", "3")  # the environment's limit wins over the core count
    assert torch_thread_count("auto") == 3 and torch_thread_count(2) == 2
    monkeypatch.setenv("OMP_NUM_THREADS", "")  # empty or not a count: ignored
    assert torch_thread_count("auto") == 16


def test_print_config_shows_the_full_agent_section(capsys):
    assert train_main(["fetch_reach_ddpg", "--print-config", "algo=td3", "agent.hidden=[32]"]) == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    expected = {k: v for k, v in dataclasses.asdict(TD3Config(hidden=(32,))).items()
                if k not in LOOP_OWNED and k not in DERIVED_WHEN_UNSET}
    assert printed["agent"] == {k: list(v) if isinstance(v, tuple) else v for k, v in expected.items()}
    assert printed["algo"] == "td3"


def _saved(**agent) -> dict:
    """The ``checkpoint["config"]`` of a run from an earlier version: only what its YAML set in ``agent``."""
    cfg = config_dict(Config())
    cfg["env"]["id"] = "FetchReach-v4"
    cfg["agent"] = dict(agent)
    return cfg


def test_resume_of_a_run_with_a_partial_agent_section():
    cfg = resume_config(_saved(hidden=[16]), ["train.total_env_steps=500"])
    section = _agent(cfg)
    assert section["hidden"] == (16,) and section["action_l2"] == 1.0 and "seed" not in section
    assert _agent(resume_config(_saved(), []))["hidden"] == (256, 256, 256)  # `agent: {}`
    # the full section a new run saves resumes too, and equals the partial one typed
    assert _agent(resume_config(config_dict(cfg), [])) == section


@pytest.mark.parametrize("overrides, expect", [
    (["agent.hidden=[32,32]"], "agent.hidden cannot change on --resume: the run has [16], got [32, 32]"),
    (["agent.hidden=[256,256,256]"], "agent.hidden cannot change on --resume: the run has [16], got [256, 256, 256]"),
    (["algo=sac"], "algo cannot change on --resume: the run has 'ddpg', got 'sac'"),
    (["agent.layer_norm=maybe"], "agent.layer_norm must be true or false, got 'maybe' (str)"),
    # the checkpoint's RNGs continue: a new seed would be recorded and not used
    (["train.seed=3"], "train.seed cannot change on --resume: the run has 0, got 3 (the run's random streams"),
])
def test_resume_refuses_frozen_and_bad_agent_values(overrides, expect):
    with pytest.raises(ValueError) as info:
        resume_config(_saved(hidden=[16]), overrides)
    assert expect in str(info.value)


def test_resume_agent_defaults_count_as_the_runs_values():
    assert _agent(resume_config(_saved(), ["agent.hidden=[256,256,256]"]))["hidden"] == (256, 256, 256)
    with pytest.raises(ValueError, match=r"agent.n_critics cannot change on --resume: the run has 2, got 3"):
        resume_config({**_saved(), "algo": "td3"}, ["agent.n_critics=3"])
    with pytest.raises(ValueError, match=r"agent.n_quantiles cannot change on --resume: the run has 25, got 10"):
        resume_config({**_saved(), "algo": "tqc"}, ["agent.n_quantiles=10"])  # the critics' output size


def test_resume_takes_other_learning_rates_and_freezes_the_rare_state_cell_of_a_run_with_an_archive():
    cfg = resume_config(_saved(), ["agent.critic_lr=3e-4", "agent.actor_weight_decay=0.01", "env.rare_state_cell=0.1"])
    assert (cfg.agent.critic_lr, cfg.agent.actor_weight_decay, cfg.env.rare_state_cell) == (3e-4, 0.01, 0.1)
    saved = _saved()
    saved["env"]["rare_state_start"] = 0.2
    with pytest.raises(ValueError, match=r"^env.rare_state_cell cannot change on --resume: the run has 0.05, got 0.1 "
                                         r"\(the run's archive of rare states is binned by it"):
        resume_config(saved, ["env.rare_state_cell=0.1"])
    assert resume_config(saved, ["env.rare_state_start=0.5"]).env.rare_state_start == 0.5


def test_sections_check_their_own_values_when_built_directly():
    with pytest.raises(ValueError, match=r"^warmup_steps must be >= 0, got -5$"):
        TrainConfig(warmup_steps=-5)
    with pytest.raises(ValueError, match=r"^vectorization must be one of \['sync', 'async'\], got 'threads'"):
        EnvConfig(vectorization="threads")
    with pytest.raises(ValueError, match=r"^strategy must be one of"):
        ReplayConfig(strategy="futur")
    assert ReplayConfig(strategy=her.RelabelStrategy.FINAL).strategy == "final"
    with pytest.raises(ValueError, match=r"^noise_clip must be >= 0, got -1.0$"):
        TD3Config(noise_clip=-1)
    with pytest.raises(ValueError, match=r"^hidden must be a list of integers, got 'big' \(str\)$"):
        DDPGConfig(hidden="big")
    assert DDPGConfig(hidden=[8, 8]).hidden == (8, 8)


def test_literal_choices_are_the_libraries_names():
    assert typing.get_args(Strategy) == tuple(her.RelabelStrategy)
    assert {f.name for f in dataclasses.fields(Config)} >= {"algo", "agent"}
    assert sorted(AGENTS) == ["ddpg", "sac", "td3", "tqc"]


def test_make_agent_takes_the_typed_config():
    cfg = load_config("fetch_reach_ddpg", ["algo=td3", "agent.hidden=[8]"])
    agent = make_agent(cfg.algo, 4, 2, 2, config=agent_config(cfg, seed=0), device="cpu", n_threads=1)
    assert agent.config.hidden == (8,) and agent.config.policy_delay == 2
    with pytest.raises(ValueError, match="not both"):
        make_agent("td3", 4, 2, 2, config=agent_config(cfg), hidden=(8,))
    with pytest.raises(TypeError, match="must be a TD3Config, got DDPGConfig"):
        make_agent("td3", 4, 2, 2, config=DDPGConfig())


def test_q_clip_may_be_open_on_one_side_while_plain_numbers_must_be_finite():
    from her_agents.algos.ddpg import DDPGConfig

    assert DDPGConfig(q_clip=[float("-inf"), 0]).q_clip == (float("-inf"), 0.0)  # gamma 1: no lower bound
    with pytest.raises(ValueError, match="actor_lr must be a finite number, got inf"):
        DDPGConfig(actor_lr=float("inf"))


def test_defaults_take_a_name_or_a_list_and_refuse_other_values_and_cycles(tmp_path):
    one = tmp_path / "one.yaml"
    one.write_text("defaults: fetch_reach_ddpg\ntrain:\n  seed: 3\n")
    cfg = load_config(str(one))
    assert cfg.env.id == "FetchReach-v4" and cfg.train.seed == 3
    for text, got in [("defaults: 5\n", "got 5"), ("defaults: {a: 1}\n", "got {'a': 1}"),
                      ("defaults: [fetch_reach_ddpg, 3]\n", "got ['fetch_reach_ddpg', 3]")]:
        bad = tmp_path / "bad.yaml"
        bad.write_text(text)
        with pytest.raises(ValueError, match=r"defaults must be a config name or a list of config names .*" +
                           re.escape(got)):
            load_config(str(bad))
    a, b = tmp_path / "a.yaml", tmp_path / "b.yaml"
    a.write_text(f"defaults: [{b}]\n")
    b.write_text(f"defaults: [{a}]\n")
    with pytest.raises(ValueError, match=r"defaults form a cycle: .*a.yaml -> .*b.yaml -> .*a.yaml$"):
        load_config(str(a))


def test_defaults_are_looked_up_beside_the_yaml_file_not_in_the_current_directory(tmp_path, monkeypatch):
    """``defaults: base.yaml`` in ``sub/child.yaml`` means ``sub/base.yaml``, from any current directory; a
    ``base.yaml`` in the current directory is not it. Shipped config names still resolve."""
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "child.yaml").write_text("defaults: [fetch_reach_ddpg, base.yaml, base2]\ntrain:\n  seed: 3\n")
    (tmp_path / "sub" / "base.yaml").write_text("train:\n  total_env_steps: 777\n")
    (tmp_path / "sub" / "base2.yaml").write_text("train:\n  batch_size: 17\n")
    (tmp_path / "cwd").mkdir()
    (tmp_path / "cwd" / "base.yaml").write_text("train:\n  total_env_steps: 111\n")
    monkeypatch.chdir(tmp_path / "cwd")
    cfg = load_config(str(tmp_path / "sub" / "child.yaml"))
    assert (cfg.train.total_env_steps, cfg.train.batch_size, cfg.train.seed) == (777, 17, 3)
    monkeypatch.chdir(tmp_path)
    assert load_config("sub/child.yaml").train.total_env_steps == 777
    (tmp_path / "sub" / "orphan.yaml").write_text("defaults: nothere.yaml\n")
    with pytest.raises(FileNotFoundError, match=r"^config sub/orphan.yaml: defaults entry 'nothere.yaml' is neither "
                       r"a file beside it \(sub/nothere.yaml\) nor one of the shipped configs: \["):
        load_config("sub/orphan.yaml")


@pytest.mark.parametrize("text, expect", [
    ("train:\n  seed: ${oops}\n", "train.seed: expected a plain value, got the OmegaConf interpolation '${oops}'"),
    ("env:\n  id: ${oc.env:HOME}\n", "env.id: expected a plain value, got the OmegaConf interpolation"),
    ("train:\n  seed: ???\n", "train.seed: expected a value, got OmegaConf's missing-value marker '???'"),
    ("agent:\n  hidden: [1, '${x}']\n", "agent.hidden[1]: expected a plain value, got '${x}'"),
    ("train:\n  seed: [1\n", "expected a YAML mapping of settings (key: value), got text that does not parse"),
    (b"\x7fELF\x02\x01\x01\x00\xd0\xff", "expected a YAML text file (UTF-8), got a binary file (byte 0xd0 at "
                                             "offset 8)"),
    (b"train:\n  seed: 1\x00\n", "expected a YAML text file, got a binary file (a NUL byte at offset 16)"),
])
def test_config_text_yaml_or_omegaconf_cannot_take_is_one_line_naming_file_and_key(tmp_path, text, expect):
    path = tmp_path / "c.yaml"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(ValueError) as info:
        load_config(str(path))
    assert str(info.value).startswith(f"config {path}: ") and expect in str(info.value), str(info.value)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("override, expect", [
    ("a..b=1", "override 'a..b=1': the key 'a..b' has an empty part between its dots; expected section.key=value"),
    ("train.=3", "override 'train.=3': the key 'train.' has an empty part between its dots"),
    (".train=3", "override '.train=3': the key '.train' has an empty part between its dots"),
    ("=1", "override '=1' is not of the form key=value"),
    ("train.seed=${oops}", "train.seed: expected a plain value, got '${oops}' (OmegaConf interpolations and '???' "
                           "are not supported in overrides"),
    ("train.seed=???", "train.seed: expected a plain value, got '???'"),
    ("log.run_dir=$HER_SURELY_UNSET/x", "log.run_dir: expected a directory path, got '$HER_SURELY_UNSET/x', whose $ "
                                        "names an unset environment variable"),
    ("train.seed=[1,2", "train.seed: expected a YAML value, got '[1,2', which does not parse"),
    ("env.id=:", "env.id: expected a YAML value, got ':', which does not parse"),
])
def test_malformed_overrides_are_one_line_naming_the_key(override, expect):
    with pytest.raises(ValueError) as info:
        load_config("fetch_reach_ddpg", [override])
    assert expect in str(info.value) and "\n" not in str(info.value), str(info.value)


def test_paths_a_shell_would_expand_are_expanded(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("HER_CFG_DIR", str(tmp_path))
    (tmp_path / "x.yaml").write_text("train:\n  seed: 5\n")
    assert load_config("~/x.yaml").train.seed == 5
    assert load_config("$HER_CFG_DIR/x.yaml").train.seed == 5
    assert load_config("fetch_reach_ddpg", ["log.run_dir=~/runs/a"]).log.run_dir == f"{tmp_path}/runs/a"
    with pytest.raises(FileNotFoundError, match=rf"^config '~/y.yaml' is neither a file \(it expands to "
                       rf"{re.escape(str(tmp_path))}/y.yaml\) nor one of the shipped configs"):
        load_config("~/y.yaml")


@pytest.mark.parametrize("override, expect", [
    ("replay.enrgy=true", "unknown key 'replay.enrgy' (did you mean replay.energy?); valid keys: env.id"),
    ("agent.polciy_delay=1", "unknown key 'agent.polciy_delay' for algo 'td3' (did you mean agent.policy_delay?)"),
    ("zzz.qqq=1", "unknown key 'zzz'; valid keys: env.id"),
])
def test_a_misspelled_key_gets_the_closest_valid_key(override, expect):
    with pytest.raises(ValueError) as exc:
        load_config("fetch_push_td3", [override])
    assert str(exc.value).startswith(expect)


def test_a_batch_larger_than_the_replay_names_the_capacity():
    with pytest.raises(ValueError, match=r"^train.batch_size must be in \[1, replay.capacity\] = \[1, 100\], got 256"):
        load_config("fetch_reach_ddpg", ["replay.capacity=100"])


def test_her_errors_name_their_parameter_in_a_field():
    """``her``'s range errors carry the argument's name (``.param``), which the config layer maps to its key
    without reading the message."""
    cases = [(lambda: her.PrioritizedSampler(beta0=2.0), "beta0"), (lambda: her.make_returns(0, 0.9), "n_step"),
             (lambda: her.make_returns(1, 1.5), "gamma"), (lambda: her.MixedGoals(4, 2.0), "other_desired_fraction"),
             (lambda: her.EnergySampler(dt=0.04, exponent=20.0), "exponent"),
             (lambda: her.PrioritizedSampler(eps=1e-300, alpha=5.0), "eps")]
    for build, param in cases:
        with pytest.raises(her.ParameterError) as info:
            build()
        assert isinstance(info.value, ValueError) and info.value.param == param
        assert str(info.value) == f"{param} {info.value.detail}"


def test_check_replay_keys_come_from_the_error_field(monkeypatch):
    """A message that does not start with the argument's name still gets the right key (nothing is split)."""
    from her_agents import config as config_mod

    def refuse(*args, **kwargs):
        raise her.ParameterError("beta0", "must be in [0, 1], got 2.0 (whatever the wording)")

    monkeypatch.setattr(her, "PrioritizedSampler", refuse)
    with pytest.raises(ValueError, match=r"^replay\.beta0 must be in \[0, 1\], got 2\.0 \(whatever the wording\)$"):
        config_mod.check_replay(ReplayConfig(), 0.98)


@pytest.mark.parametrize("code", [
    "import her_agents.config",
    "import sys; from her_agents.cli import train_main; sys.argv = ['her-train', '--print-config']; train_main()",
    "import sys; from her_agents.cli import train_main; sys.argv = ['her-train', 'fetch_reach_ddpg', 'algo=tqc', "
    "'--print-config']; train_main()",
    "from her_agents.config import load_config; load_config('fetch_push_ddpg', ['algo=td3'])",
])
def test_config_and_print_config_import_no_torch(code):
    """The config layer and ``her-train --print-config`` import no torch (nor wandb, gymnasium): they answer in
    well under a second instead of torch's import time."""
    import subprocess
    import sys

    probe = f"{code}\nimport sys\nprint('HEAVY', sorted(m for m in ('torch', 'wandb', 'gymnasium') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert out.splitlines()[-1] == "HEAVY []", out[-300:]
