"""Package discovery for setuptools; everything else is in ``pyproject.toml``.

Packages are found, not listed: a new ``simulators/<tool>/`` (any folder with an ``__init__.py``
under ``agentrl_envs``, ``agentrl_train`` or ``simulators``) ships without a line anywhere. The two
packages that live outside their parent's folder (``[tool.setuptools.package-dir]`` in
``pyproject.toml``) are named here: ``find_packages`` cannot see a package under another name than
its folder's, and ``[tool.setuptools.packages.find]`` cannot be combined with a list, so discovery
runs here rather than in ``pyproject.toml``.
"""

from setuptools import find_packages, setup

#: The packages that ship, as ``find_packages`` patterns.
INCLUDE = ["agentrl_envs", "agentrl_envs.*", "agentrl_train", "agentrl_train.*", "simulators", "simulators.*"]
#: Packages whose folder is elsewhere (``[tool.setuptools.package-dir]`` in ``pyproject.toml``).
MAPPED = ["agentrl_envs.error_profiles", "agentrl_envs.proto"]

setup(packages=[*find_packages(include=INCLUDE), *MAPPED])
