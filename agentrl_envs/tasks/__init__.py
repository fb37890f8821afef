"""Procedural, seeded, verifiable tasks."""

from agentrl_envs.tasks.base import EmailSpec, GoldRunner, SubTask, Task
from agentrl_envs.tasks.domains import DOMAINS, HELDOUT_DOMAINS, TRAIN_DOMAINS
from agentrl_envs.tasks.sampler import KINDS, SPLITS, TaskSampler

__all__ = [
    "DOMAINS",
    "HELDOUT_DOMAINS",
    "KINDS",
    "SPLITS",
    "TRAIN_DOMAINS",
    "EmailSpec",
    "GoldRunner",
    "SubTask",
    "Task",
    "TaskSampler",
]
