"""Goal envs for HER: gymnasium-robotics Fetch tasks and any gymnasium goal env, single or vectorized.

Importing this package pulls in gymnasium and numpy only; gymnasium_robotics and MuJoCo load when an env
that needs them is built.
"""

from envs.goal_env import (
    FETCH_TASKS,
    GoalEnvSpec,
    ThresholdReward,
    ThresholdSuccess,
    VectorStep,
    goal_env_spec,
    make_env,
    make_vector_env,
    spec_from_env,
    split_autoreset,
)

__all__ = [
    "FETCH_TASKS",
    "GoalEnvSpec",
    "ThresholdReward",
    "ThresholdSuccess",
    "VectorStep",
    "goal_env_spec",
    "make_env",
    "make_vector_env",
    "spec_from_env",
    "split_autoreset",
]
