"""Compatibility module: the code that was here now lives in modules by concern.

- ``her_envs.spec``: [`GoalEnvSpec`][her_envs.goal_env.GoalEnvSpec],
  [`spec_from_env`][her_envs.goal_env.spec_from_env] (validation and probing),
  [`check_rewards`][her_envs.goal_env.check_rewards];
- ``her_envs.make``: [`FETCH_TASKS`][her_envs.FETCH_TASKS], [`make_env`][her_envs.goal_env.make_env],
  [`goal_env_spec`][her_envs.goal_env.goal_env_spec] (envs built by id);
- ``her_envs.wrappers``: [`NormalizeAction`][her_envs.goal_env.NormalizeAction],
  [`CopyObservation`][her_envs.goal_env.CopyObservation], [`wrap_goal_env`][her_envs.goal_env.wrap_goal_env],
  the action
  mapping, [`EpisodeStartRNG`][her_envs.goal_env.EpisodeStartRNG],
  [`GraspedStart`][her_envs.goal_env.GraspedStart];
- ``her_envs.vector``: [`make_vector_env`][her_envs.goal_env.make_vector_env],
  [`split_autoreset`][her_envs.goal_env.split_autoreset], [`step_info`][her_envs.goal_env.step_info] and the
  sub-envs'
  RNG states.

This module re-exports their public names, so ``from her_envs.goal_env import make_env`` and objects pickled
under ``her_envs.goal_env`` (a [`ThresholdReward`][her_envs.goal_env.ThresholdReward], say) keep working. New
code imports from ``her_envs``.
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
