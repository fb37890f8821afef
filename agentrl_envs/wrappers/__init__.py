"""Gymnasium wrappers over the agentrl envs, one file each, imported from their module.

- ``candidates_discrete``: :class:`~agentrl_envs.wrappers.candidates_discrete.CandidatesDiscrete`, a
  ``Discrete(K)`` view of ``info["candidates"]`` (stateless apart from the last info);
- ``normalize_reward``: ``NormalizeRewardBatch`` (a vector wrapper) and ``NormalizeRewardSingleEnv``, which scale
  rewards by running statistics (stateful);
- ``record_trajectories``: ``RecordTrajectories`` and ``RecordVectorTrajectories``, which write every finished
  episode to a store of :mod:`agentrl_envs.data` (they change nothing the agent sees).

Nothing is imported here, so using one wrapper does not load another's dependencies (protobuf for the recorder).
"""
