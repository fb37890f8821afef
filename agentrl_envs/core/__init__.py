"""The env core: one text action in, one text observation and a reward out.

- ``env``: :class:`~agentrl_envs.core.env.ToolUseEnv`, the base class every registered env shares;
- ``options``: :class:`~agentrl_envs.core.options.EnvOptions`, its ``gym.make`` keywords, checked once;
- ``episode``: what an episode starts from and reports (the reset info, task seeds);
- ``registered_envs``: the registered envs, one class (an env card) per id;
- ``actions``: the tool-call parser and :func:`~agentrl_envs.core.actions.format_call`;
- ``progress``: asks each step's tool what it achieved towards the task;
- ``candidates``: the K plausible actions of ``candidates=K``;
- ``seeding``: the env's lazily built, seeded generator.

Below the core sit ``tools``, ``tasks``, ``rewards``, ``faults``, ``backends`` and ``data``, which never import
it; above it sit the code that drives envs (``agents``, ``analysis``, ``cli``, ``server``) and the views of an env
(``wrappers``, ``integrations``).
"""
