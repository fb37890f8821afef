"""Tiny config-built models and random LoRA adapters for the fusion and remap tests (never a download)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from peft import LoraConfig, get_peft_model
from transformers import LlamaConfig, LlamaForCausalLM, Phi3Config, Phi3ForCausalLM

TINY = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=256,
    max_position_embeddings=128,
    rms_norm_eps=1e-6,
    pad_token_id=0,
    bos_token_id=1,
    eos_token_id=2,
    tie_word_embeddings=False,
)


def tiny_llama(seed: int = 0, **overrides: Any) -> LlamaForCausalLM:
    """A 2-layer split-layout (q/k/v_proj, gate/up_proj) model with random weights."""
    torch.manual_seed(seed)
    return LlamaForCausalLM(LlamaConfig(**{**TINY, **overrides})).eval()


def phi3_twin(llama: LlamaForCausalLM) -> Phi3ForCausalLM:
    """A fused-layout (qkv_proj, gate_up_proj) Phi-3 model computing the same function as ``llama``."""
    config = llama.config
    phi3 = Phi3ForCausalLM(
        Phi3Config(**{k: getattr(config, k) for k in TINY}, rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    )
    sd = llama.state_dict()
    fused: dict[str, torch.Tensor] = {}
    for key, value in sd.items():
        if ".q_proj." in key:
            parts = [sd[key.replace("q_proj", p)] for p in ("q_proj", "k_proj", "v_proj")]
            fused[key.replace("q_proj", "qkv_proj")] = torch.cat(parts)
        elif ".gate_proj." in key:
            fused[key.replace("gate_proj", "gate_up_proj")] = torch.cat([value, sd[key.replace("gate_proj", "up_proj")]])
        elif not any(p in key for p in (".k_proj.", ".v_proj.", ".up_proj.")):
            fused[key] = value
    phi3.load_state_dict(fused, strict=True)
    return phi3.eval()


def random_lora(
    model: torch.nn.Module,
    out_dir: Path,
    *,
    seed: int,
    r: int,
    alpha: float,
    targets: list[str],
    rank_pattern: dict[str, int] | None = None,
    alpha_pattern: dict[str, float] | None = None,
    use_rslora: bool = False,
    b_scale: float = 0.05,
) -> Path:
    """Save a LoRA adapter with random A and B (B scaled so logits stay moderate) for ``model``; returns its folder."""
    import copy

    torch.manual_seed(seed)
    config = LoraConfig(
        r=r,
        lora_alpha=alpha,
        target_modules=targets,
        rank_pattern=rank_pattern or {},
        alpha_pattern=alpha_pattern or {},
        use_rslora=use_rslora,
        init_lora_weights=False,
        lora_dropout=0.0,
    )
    peft_model = get_peft_model(copy.deepcopy(model), config)
    with torch.no_grad():
        for name, param in peft_model.named_parameters():
            if "lora_B" in name:
                param.mul_(b_scale / max(float(param.abs().max()), 1e-12))
    peft_model.save_pretrained(str(out_dir))
    return out_dir


def probe(seed: int = 123, shape: tuple[int, int] = (2, 12)) -> torch.Tensor:
    return torch.randint(0, TINY["vocab_size"], shape, generator=torch.Generator().manual_seed(seed))


@torch.no_grad()
def logits(model: torch.nn.Module, input_ids: torch.Tensor) -> torch.Tensor:
    model.eval()
    return model(input_ids=input_ids).logits.float()
