"""Adapters between the agentrl envs and other training libraries (TRL)."""
