"""agentrl_train: PPO + LoRA training on agentrl envs (torch side).

``agentrl-train ppo|sft|eval|resources|fuse|remap-adapter`` (:mod:`agentrl_train.cli`); the loop is
:func:`agentrl_train.train.train`, its pieces ``config``, ``env_checks``, ``tiny``, ``policy``, ``rollout``,
``ppo``, ``checkpoint``, ``evaluate``, ``sft``, ``distributed``, ``resources`` and ``adapters``. It depends on agentrl_envs,
never the other way round. Install from a checkout with ``pip install -e ".[train]"`` (pins
torch==2.13.0, the CPU wheel).
"""

__all__: list[str] = []
