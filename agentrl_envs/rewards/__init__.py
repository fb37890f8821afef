"""Reward terms. Every step's reward is the sum of named components in ``info["reward_components"]``.

Components (always present, 0.0 when they do not apply):

- ``task``: 1.0 at the end of an episode whose required task components all hold, else 0.0;
- ``aux``: the dense auxiliary reward times the schedule weight (see :mod:`agentrl_envs.rewards.schedule`);
- ``fault``: the error profile's penalty for a fault (0.0 with the ``none`` profile);
- ``format``: a penalty for an action that is not one well-formed call of an available tool.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["COMPONENTS", "RewardConfig", "zero_components"]

COMPONENTS = ("task", "aux", "fault", "format")


@dataclass(frozen=True)
class RewardConfig:
    """Reward sizes.

    Args:
        success: terminal reward when the task is solved.
        format_penalty: added for an unparseable action or an unknown tool (negative).
    """

    success: float = 1.0
    format_penalty: float = -0.1

    def __post_init__(self) -> None:
        if self.format_penalty > 0:
            raise ValueError(f"format_penalty must be <= 0, got {self.format_penalty}")


def zero_components() -> dict[str, float]:
    return dict.fromkeys(COMPONENTS, 0.0)
