"""``--activation-checkpointing``: the same gradients with fewer activations kept from the forward.

The small tiny model in generate mode: one forward and backward of a sequence with and without
checkpointed decoder layers gives the same log-probs, value and gradients, and the forward keeps
fewer bytes for the backward (counted with autograd's saved-tensor hooks, not timed).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from agentrl_envs.errors import ConfigError
from tests.train.conftest import small_config


def _forward_backward(tmp_path: Path, checkpointing: bool) -> tuple[torch.Tensor, dict[str, torch.Tensor], int]:
    """Log-probs, gradients and the bytes the forward saved for the backward, for one fixed sequence."""
    from agentrl_train.policy import build_policy

    cfg = small_config(tmp_path, mode="generate", env="AgentRL/SQL-v0", activation_checkpointing=checkpointing)
    policy = build_policy(cfg, log=lambda _: None)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():  # a non-zero adapter, so that its gradients are not trivially shaped
        for name, p in policy.trainable_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.02)
    ids = torch.randint(5, len(policy.tokenizer), (96,), generator=g).tolist()
    policy.train()
    saved = [0]

    def pack(t: torch.Tensor) -> torch.Tensor:
        saved[0] += t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        lp, _, value = policy.sequence_logprobs(ids[:48], ids[48:])
    (lp.sum() + value).backward()
    grads = {n: p.grad.detach().clone() for n, p in policy.trainable_parameters() if p.grad is not None}
    return lp.detach(), grads, saved[0]


def test_checkpointed_layers_give_the_same_gradients_and_keep_less(tmp_path: Path) -> None:
    lp0, g0, kept0 = _forward_backward(tmp_path / "plain", False)
    lp1, g1, kept1 = _forward_backward(tmp_path / "ckpt", True)
    torch.testing.assert_close(lp1, lp0, rtol=0, atol=1e-6)
    assert g0.keys() == g1.keys() and any("lora_A" in n for n in g0)
    for n in g0:
        torch.testing.assert_close(g1[n], g0[n], rtol=1e-5, atol=1e-7)
    assert kept1 < 0.7 * kept0, (kept0, kept1)


def test_candidates_mode_refuses_it(tmp_path: Path) -> None:
    from agentrl_train.train import train

    cfg = small_config(tmp_path, mode="candidates", activation_checkpointing=True)
    with pytest.raises(ConfigError, match=r"activation-checkpointing.*--mode generate"):
        train(cfg, log=lambda _: None)
    assert not Path(cfg.run.out).exists()


def test_a_generate_run_trains_with_it(tmp_path: Path) -> None:
    from agentrl_train.train import train

    cfg: Any = small_config(
        tmp_path, mode="generate", env="AgentRL/SQL-v0", max_new_tokens=16, updates=1, activation_checkpointing=True
    )
    assert train(cfg, log=lambda _: None)["finished"]
