"""An agent's state: its networks and optimizers by name, what acting needs (``policy_state_dict``), everything to
resume (``state_dict``), and the networks' train/eval mode."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import torch
from torch import nn

from .normalizer import RunningNormalizer

__all__ = ["OPTIMIZER_SETTINGS", "AgentStateMixin"]

#: the keys of an optimizer's param group that come from the agent's config (``make_adam``), kept when a state is
#: loaded (``AgentStateMixin.load_state_dict``)
OPTIMIZER_SETTINGS = ("lr", "weight_decay", "decoupled_weight_decay")


class AgentStateMixin:
    """Checkpoint state and train/eval mode of ``her_agents.algos.base.GoalConditionedAgentBase``. An algorithm
    lists everything a checkpoint needs in ``_checkpoint_items``."""

    config: Any
    actor: nn.Module
    rng: np.random.Generator
    num_updates: int
    obs_normalizer: RunningNormalizer
    goal_normalizer: RunningNormalizer

    #: per-instance caches (compiled functions, parameter lists, the numpy actor, the colored noise source, the
    #: generator reseeded before each draw between updates): rebuilt on demand, never pickled or deep-copied
    _CACHES = ("_numpy_actor", "_polyak_params", "_param_lists", "_compiled_step", "_noise_source",
               "_draw_generator")

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k not in self._CACHES}

    def _checkpoint_items(self) -> dict[str, Any]:
        """Name -> object with ``state_dict``/``load_state_dict`` (modules, optimizers, normalizers)."""
        raise NotImplementedError

    def set_training(self, training: bool) -> None:
        """Put the online networks in train (``update``) or eval (acting) mode, as ``nn.Module.train`` does, so
        layers such as dropout or batch norm behave as they should in each; target networks stay in eval mode.
        A no-op when the mode does not change."""
        if self.__dict__.get("_training") is training:
            return
        for name, item in self._checkpoint_items().items():
            if isinstance(item, nn.Module):
                item.train(training and "target" not in name)
        self._training = training

    def networks(self) -> dict[str, nn.Module]:
        """Every network (online and target) by name, in checkpoint order."""
        return {k: v for k, v in self._checkpoint_items().items() if isinstance(v, nn.Module)}

    def optimizers(self) -> dict[str, torch.optim.Optimizer]:
        """Every optimizer by name, in checkpoint order."""
        return {k: v for k, v in self._checkpoint_items().items() if isinstance(v, torch.optim.Optimizer)}

    def policy_state_dict(self) -> dict[str, Any]:
        """``actor`` (CPU tensor copies of the policy network's state), ``obs_normalizer`` and ``goal_normalizer``
        (their statistics): what ``act`` needs."""
        return {
            "actor": {k: v.detach().cpu().clone() for k, v in self.actor.state_dict().items()},
            "obs_normalizer": self.obs_normalizer.state_dict(),
            "goal_normalizer": self.goal_normalizer.state_dict(),
        }

    def load_policy_state_dict(self, state: dict[str, Any]) -> None:
        """Load ``policy_state_dict``.

        Raises:
            RuntimeError / ValueError: a policy network or normalizer of another shape.
        """
        self.actor.load_state_dict(state["actor"])
        self.obs_normalizer.load_state_dict(state["obs_normalizer"])
        self.goal_normalizer.load_state_dict(state["goal_normalizer"])

    def state_dict(self) -> dict[str, Any]:
        """Everything to resume: networks, targets, optimizers, normalizers, counters, config, rng state."""
        state: dict[str, Any] = {k: v.state_dict() for k, v in self._checkpoint_items().items()}
        state["obs_normalizer"] = self.obs_normalizer.state_dict()
        state["goal_normalizer"] = self.goal_normalizer.state_dict()
        state["num_updates"] = self.num_updates
        state["config"] = dataclasses.asdict(self.config)
        state["rng"] = self.rng.bit_generator.state
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Load ``state_dict`` (of an agent of the same algorithm and sizes): the learned state (networks,
        targets, the optimizers' moments and step counts, the normalizers' statistics, the update count, the
        exploration RNG). The settings stay this agent's, i.e. its config's: the optimizers' ``OPTIMIZER_SETTINGS``
        (``actor_lr``, ``critic_lr``, ``alpha_lr``, ``actor_weight_decay``, ``critic_weight_decay``) and the
        normalizers' ``norm_eps``, ``norm_clip_obs``, ``norm_clip_range``, so that a run resumed with another
        value (``her-train --resume RUN agent.critic_lr=...``) goes on with it."""
        for k, v in self._checkpoint_items().items():
            if isinstance(v, torch.optim.Optimizer):
                settings = [{key: group[key] for key in OPTIMIZER_SETTINGS if key in group}
                            for group in v.param_groups]
                v.load_state_dict(state[k])  # its param groups are the state's, settings included
                for group, own in zip(v.param_groups, settings, strict=True):
                    group.update(own)
            else:
                v.load_state_dict(state[k])
        for name, normalizer in (("obs_normalizer", self.obs_normalizer), ("goal_normalizer", self.goal_normalizer)):
            normalizer.load_state_dict({**state[name], "eps": normalizer.eps, "clip_obs": normalizer.clip_obs,
                                        "clip_range": normalizer.clip_range})
        self.num_updates = int(state["num_updates"])
        if "rng" in state:
            self.rng.bit_generator.state = state["rng"]
