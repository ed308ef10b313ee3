"""Goal envs for HER: gymnasium-robotics Fetch tasks and any gymnasium goal env, single or vectorized.

Importing this package pulls in gymnasium and numpy only; gymnasium_robotics and MuJoCo load when an env
that needs them is built.
"""

from .goal_env import (
    FETCH_TASKS,
    CopyObservation,
    EpisodeStartRNG,
    GoalEnvSpec,
    GraspedStart,
    NormalizeAction,
    ThresholdReward,
    ThresholdSuccess,
    VectorStep,
    check_rewards,
    from_env_action,
    generator_from_state,
    goal_env_spec,
    make_env,
    make_vector_env,
    set_vector_rng_states,
    spec_from_env,
    split_autoreset,
    step_info,
    to_env_action,
    vector_rng_states,
    wrap_goal_env,
)

__all__ = [
    "FETCH_TASKS",
    "CopyObservation",
    "EpisodeStartRNG",
    "GoalEnvSpec",
    "GraspedStart",
    "NormalizeAction",
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
