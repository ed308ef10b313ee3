"""Compatibility module: the code that was here now lives in modules by concern.

- :mod:`her_envs.spec`: :class:`GoalEnvSpec`, :func:`spec_from_env` (validation and probing), :func:`check_rewards`;
- :mod:`her_envs.make`: :data:`FETCH_TASKS`, :func:`make_env`, :func:`goal_env_spec` (envs built by id);
- :mod:`her_envs.wrappers`: :class:`NormalizeAction`, :class:`CopyObservation`, :func:`wrap_goal_env`, the action
  mapping, :class:`EpisodeStartRNG`, :class:`GraspedStart`;
- :mod:`her_envs.vector`: :func:`make_vector_env`, :func:`split_autoreset`, :func:`step_info` and the sub-envs'
  RNG states.

This module re-exports their public names, so ``from her_envs.goal_env import make_env`` and objects pickled
under ``her_envs.goal_env`` (a :class:`ThresholdReward`, say) keep working. New code imports from ``her_envs``.
"""

from .make import FETCH_TASKS, goal_env_spec, make_env
from .spec import (
    GOAL_KEYS,
    GoalEnvSpec,
    RewardFn,
    SuccessFn,
    ThresholdReward,
    ThresholdSuccess,
    check_rewards,
    spec_from_env,
)
from .vector import (
    EnvWorkerDied,
    VectorStep,
    generator_from_state,
    make_vector_env,
    set_vector_rng_states,
    split_autoreset,
    step_info,
    vector_rng_states,
)
from .wrappers import (
    BehaviourGoal,
    CopyObservation,
    EpisodeStartRNG,
    GraspedStart,
    RareStateStart,
    NormalizeAction,
    from_env_action,
    to_env_action,
    wrap_goal_env,
)

__all__ = [
    "FETCH_TASKS",
    "GOAL_KEYS",
    "BehaviourGoal",
    "CopyObservation",
    "EnvWorkerDied",
    "EpisodeStartRNG",
    "GoalEnvSpec",
    "GraspedStart",
    "RareStateStart",
    "NormalizeAction",
    "RewardFn",
    "SuccessFn",
    "ThresholdReward",
    "ThresholdSuccess",
    "VectorStep",
    "check_rewards",
    "from_env_action",
    "generator_from_state",
    "goal_env_spec",
    "make_env",
    "make_vector_env",
    "set_vector_rng_states",
    "spec_from_env",
    "split_autoreset",
    "step_info",
    "to_env_action",
    "vector_rng_states",
    "wrap_goal_env",
]
