"""Goal envs for HER: gymnasium-robotics Fetch tasks and any gymnasium goal env, single or vectorized.

Importing this package pulls in gymnasium and numpy only; gymnasium_robotics and MuJoCo load when an env
that needs them is built.

Modules by concern: ``spec`` ([`GoalEnvSpec`][her_envs.GoalEnvSpec], validation and probing of an env),
``make`` (envs built by
id), ``wrappers`` (actions in ``[-1, 1]``, copied observations, episode-start wrappers) and ``vector`` (vector
envs, SAME_STEP autoreset, the sub-envs' RNG states). ``goal_env`` only re-exports them, for old imports.
"""

from . import goal_env as goal_env  # the old module path, still an attribute after `import her_envs`
from .make import FETCH_TASKS, goal_env_spec, make_env
from .spec import GoalEnvSpec, ThresholdReward, ThresholdSuccess, check_rewards, spec_from_env
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
    "BehaviourGoal",
    "CopyObservation",
    "EnvWorkerDied",
    "EpisodeStartRNG",
    "GoalEnvSpec",
    "GraspedStart",
    "RareStateStart",
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
