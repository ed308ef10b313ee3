"""The YAML configs are package data of the ``her_configs`` package (the ``configs/`` folder), read through importlib.resources, so a wheel
install finds them from any directory (``scripts/check_wheel.sh``, run by ``.ci/run``, installs the wheel)."""

from __future__ import annotations

import importlib.resources
from pathlib import Path

import pytest

from her_agents.config import config_dir, load_config, resolve_config_path


def test_configs_are_package_data_read_through_importlib_resources(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # nothing relative to the checkout or the working directory
    assert config_dir() == importlib.resources.files("her_configs")
    names = sorted(p.name for p in config_dir().iterdir() if p.name.endswith(".yaml"))
    assert {"fetch_push_ddpg.yaml", "fetch_reach_ddpg.yaml", "fetch_reach_sac.yaml"} <= set(names)
    assert resolve_config_path("fetch_reach_ddpg").name == "fetch_reach_ddpg.yaml"
    assert load_config("fetch_reach_ddpg").env.id == "FetchReach-v4"

    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    project = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert project["package-dir"]["her_configs"] == "configs"
    assert project["package-data"]["her_configs"] == ["*.yaml"]
    assert not {"agents", "envs", "configs"} & set(project["packages"])  # collision-free installed names
