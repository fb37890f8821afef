"""Task domains. ``TRAIN_DOMAINS`` feed the train and test splits; ``HELDOUT_DOMAINS`` only heldout."""

from agentrl_envs.tasks.domains.base import Domain, Staff
from agentrl_envs.tasks.domains.finance import FINANCE
from agentrl_envs.tasks.domains.hr import HR
from agentrl_envs.tasks.domains.logistics import LOGISTICS
from agentrl_envs.tasks.domains.retail import RETAIL

DOMAINS: dict[str, Domain] = {d.name: d for d in (RETAIL, FINANCE, HR, LOGISTICS)}
TRAIN_DOMAINS: tuple[str, ...] = ("retail", "finance", "hr")
HELDOUT_DOMAINS: tuple[str, ...] = ("logistics",)

__all__ = ["DOMAINS", "HELDOUT_DOMAINS", "TRAIN_DOMAINS", "Domain", "Staff"]
