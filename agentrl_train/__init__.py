"""agentrl_train: PPO + LoRA training on agentrl envs (torch side).

Empty until the training issue lands; it depends on agentrl_envs, never the other way round.
Install from a checkout with ``pip install -e ".[train]"`` (pins torch==2.13.0, the CPU wheel).
"""

__all__: list[str] = []
