"""Run configuration: typed dataclasses (the documented defaults), YAML files in ``configs/`` and ``key=value``
overrides, merged with OmegaConf. Unknown keys are refused with the list of valid ones.

Who checks what, once:

- types and choices (``Literal`` fields): OmegaConf while merging the layers (naming the key and what the user
  wrote), then each section's ``__post_init__`` (``her_agents.fields.check_types``, which also covers a
  section built directly);
- ranges: each section's ``__post_init__``; the replay values (and ``train.gamma``) are the ``her`` library's, so
  [`check_replay`][her_agents.config.check_replay] builds its pieces from them and names the key in its error;
- the ``agent`` section: the algorithm's config dataclass (``DDPGConfig``, ``TD3Config``, ``SACConfig``), picked
  by ``algo`` after all layers are merged ([`agent_section`][her_agents.config.agent_section]), so an
  ``algo=`` override re-types the section.

[`load_config`][her_agents.config.load_config] and [`resume_config`][her_agents.config.resume_config] build
the merged values into [`Config`][her_agents.config.Config] (which runs those
checks) and return it, typed: every section a dataclass, ``agent`` the algorithm's config dataclass. OmegaConf
is used only to parse and merge the YAML layers and overrides, and to write the resolved config out
([`config_dict`][her_agents.config.config_dict] for checkpoints and W&B,
[`config_yaml`][her_agents.config.config_yaml] for ``--print-config`` and ``config.yaml``).

The modules behind this face: ``sections`` (the ``env``, ``replay``, ``train``, ``log`` and ``dist``
dataclasses and their checks), ``root`` (``Config``, the ``agent`` section, the config written out), ``files``
(finding and reading the YAML configs) and ``loading`` (merging the layers: ``load_config``,
``resume_config``). None imports torch.
"""

# in reading order: the API page lists the names in the order they are imported here
from .sections import Strategy, DEVICES, EnvConfig, ReplayConfig, TrainConfig, WandbConfig, LogConfig, DistConfig
from .root import Config, LOOP_OWNED, DERIVED_WHEN_UNSET, agent_section, agent_config, config_dict, config_yaml
from .sections import check_replay
from .files import config_dir, resolve_config_path
from .loading import load_config, RESUME_FROZEN, resume_config
from .sections import check_device_name, check_device
from .sections import torch_thread_count, usable_cores
from .sections import DistBackend as DistBackend
from .sections import DistMode as DistMode
from .sections import Vectorization as Vectorization
from .sections import WandbMode as WandbMode

__all__ = ["DERIVED_WHEN_UNSET", "DEVICES", "LOOP_OWNED", "RESUME_FROZEN", "Config", "DistConfig", "EnvConfig",
           "LogConfig", "ReplayConfig", "Strategy", "TrainConfig", "WandbConfig", "agent_config", "agent_section",
           "check_device", "check_device_name", "check_replay", "config_dict", "config_dir", "config_yaml",
           "load_config", "resolve_config_path", "resume_config", "torch_thread_count", "usable_cores"]
