# For mypy only (`mypy_path` in pyproject.toml): setuptools installs the folder envs/ as `her_envs` through an
# editable-install import hook that type checkers do not follow, so `her_envs` is resolved here as the checked
# folder itself (one set of types: `her_envs.VectorStep` is `envs.VectorStep`).
from envs import *  # noqa: F403 (every name of envs/__init__.py, as its __all__ says)
from envs import __all__ as __all__
