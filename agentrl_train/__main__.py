"""``python -m agentrl_train`` (and ``torchrun ... -m agentrl_train``) runs the CLI."""

from agentrl_train.cli import main

raise SystemExit(main())
