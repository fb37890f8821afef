"""PPO + LoRA on agentrl envs: the training loop, top to bottom (CleanRL style).

``agentrl-train ppo`` calls :func:`train` with a :class:`~agentrl_train.config.TrainConfig`. One
update = one rollout of ``rollout_steps x num_envs`` transitions with the sampling policy (with a
group advantage: one episode per env, at most that long; :mod:`agentrl_train.group_rollout`), then
``epochs`` passes of minibatch SGD on the clipped PPO objective (:class:`~agentrl_train.ppo.PPOLoss`).
The run folder gets the resolved config, ``metrics.jsonl``, TensorBoard events, checkpoints (exact
resume), ``final/``, the eval table and the learning curve.

:func:`train` is the loop; its phases follow it in the order they run: set-up (:func:`_setup`,
:func:`_resume_or_reset`), then per update :func:`_collect`, :func:`_advantages`, :func:`_update`
(epochs of :func:`_epoch`, micro-batches through :func:`~agentrl_train.accumulation.accumulate`),
:func:`_metrics_row`, the evaluation and :func:`_save_checkpoint`, and last :func:`_finish`.
"""

from __future__ import annotations

import functools
import math
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

import agentrl_envs  # noqa: F401  (registers the ids)
from agentrl_envs.errors import AgentRLError, ConfigError
from agentrl_train import checkpoint, evaluate, ppo, resources, runlog
from agentrl_train.accumulation import accumulate, episode_micro_batches, micro_batches_per_step, wrap_trainable
from agentrl_train.config import GROUP_ADVANTAGES, TrainConfig
from agentrl_train.config_io import dump_config, make_run_dir
from agentrl_train.distributed import Dist, Trainable
from agentrl_train.env_checks import check_env_config
from agentrl_train.episodes import EnvPool, Transition
from agentrl_train.group_rollout import collect_groups
from agentrl_train.policy import Policy, build_policy
from agentrl_train.rollout import Rollout, collect
from agentrl_train.rollout_engine import Prefetch, ServerEngine, rollout_from_state, rollout_state, score_rollout

__all__ = ["train"]

#: one sample of an update: a transition, its advantage and its return
Sample = tuple[Transition, float, float]
#: the loss terms an update logs, one value per sample each (no ``vf`` without a critic)
STAT_KEYS = ("pg", "vf", "entropy", "kl_ref", "approx_kl", "clipfrac", "drift")


@dataclass(frozen=True)
class Plan:
    """The run's counts, fixed before the first update so that a resumed run follows its schedules exactly."""

    grouped: bool  #: a group advantage: one episode per env per rollout, no critic
    per_step: int  #: micro-batches per optimizer step on each rank (0: the whole rollout)
    steps_per_update: int  #: env steps of one update over all ranks (critic advantages: a full window)
    steps_per_epoch: int  #: optimizer steps of one epoch, as planned
    total_steps: int  #: optimizer steps of the whole run, as planned (the learning-rate schedule's length)
    warmup: int  #: optimizer steps over which the value-loss weight rises to 1


@dataclass
class Run:
    """What the set-up builds once and the phases share: the policy, its optimizer, the envs."""

    out: Path  #: the run folder
    plan: Plan
    policy: Policy
    named: list[tuple[str, torch.nn.Parameter]]  #: the trainable parameters (LoRA and value head)
    optimizer: torch.optim.Optimizer
    base_lrs: list[float]  #: each parameter group's learning rate before the schedule's factor
    clip_groups: dict[str, list[torch.nn.Parameter]]  #: the trainable parameters by block, clipped apart
    pool: EnvPool
    sink: resources.CountingSink | None  #: where rollouts are recorded (replay buffer, shards); None: nowhere
    sgd_rng: np.random.Generator  #: the minibatch order (and the control's reward permutation)
    engine: ServerEngine | None = None  #: the rollout servers (--rollout-engine server); None: the trainer samples
    prefetch: Prefetch | None = None  #: --async-rollouts 1: the rollout collected during the last update

    def close(self) -> None:
        """Close the envs, the recording sink and the rollout servers' connections (their adapter is unloaded)."""
        if self.prefetch is not None:
            self.prefetch.wait(raise_error=False)
        if self.engine is not None:
            self.engine.close()
        self.pool.close()
        if self.sink is not None:
            self.sink.close()


@dataclass
class UpdateResult:
    """What one update's epochs of SGD report for its metrics row."""

    stats: dict[str, list[float]]  #: per-sample loss terms by name (:data:`STAT_KEYS`)
    critic_ws: list[float]  #: the value-loss weight of each optimizer step
    grad_norms: dict[str, float]  #: the last optimizer step's gradient norms before clipping, by block
    ent_coef: float  #: the entropy coefficient of this update
    last_step: int  #: the last optimizer step's number in the run, as planned
    early_stop: bool  #: ``--target-kl`` ended the epochs early
    tokens: int  #: tokens through the model (every epoch encodes every sample again)
    seconds: float  #: wall time of the epochs


def train(cfg: TrainConfig, *, log: Any = print, dist: Any = None) -> dict[str, Any]:
    """Run PPO; returns the final summary (also written to ``summary.json``)."""
    dist = dist or Dist()  # one process: every collective is a no-op
    if cfg.model.activation_checkpointing and cfg.env.mode == "candidates":
        raise ConfigError(
            "--activation-checkpointing: candidates mode scores its candidates over the prompt's KV cache, which "
            "checkpointed layers do not keep in training; use it with --mode generate (or in sft)"
        )
    out = make_run_dir(cfg)
    run = _setup(cfg, dist, out, log)
    start, global_steps, history = _resume_or_reset(run, cfg, dist, log)
    _sync_adapter(run, dist, start)  # the rollout servers sample with the weights of `start` updates
    if dist.is_main:  # written once the run has started: a failed resume leaves config.yaml and metrics.jsonl as they were
        dump_config(cfg, out / "config.yaml")
    logger = runlog.RunLogger(out, cfg, enabled=dist.is_main, history=history)
    trainable = wrap_trainable(run.policy, cfg, dist)
    meter = resources.ResourceMeter(dist, run.policy.device, run.sink)
    bar = runlog.progress(cfg, start, enabled=dist.is_main)
    stop_at = min(cfg.ppo.updates, start + cfg.run.max_updates_this_call) if cfg.run.max_updates_this_call else cfg.ppo.updates
    try:
        if start == 0 and dist.is_main and cfg.run.eval_every:
            logger.log_eval(0, 0, evaluate.evaluate_splits(run.policy, cfg, cfg.run.eval_splits, cfg.run.eval_episodes))
        for update in range(start, stop_at):
            t_update = time.perf_counter()
            # -- rollout ----------------------------------------------------------------------------
            with meter.phase("rollout") as counts:
                roll, engine_row = _collect(run, cfg, global_steps, update, log)
                counts.update(tokens=roll.tokens, env_steps=int(roll.valid_TN.sum()))
            # a group rollout's envs idle once their episode ended: count the steps taken (on every rank)
            global_steps += int(dist.sum(int(roll.valid_TN.sum()))) if run.plan.grouped else run.plan.steps_per_update
            if run.prefetch is not None and update + 1 < cfg.ppo.updates:  # the servers sample the next rollout meanwhile
                run.prefetch.start(functools.partial(_rollout, run, cfg, global_steps))
            # -- advantages, then epochs of minibatch SGD ------------------------------------------
            with meter.phase("update") as counts:
                samples, group_row = _advantages(roll, cfg, run.plan.grouped, run.sgd_rng, dist)
                trainable = wrap_trainable(run.policy, cfg, dist, trainable)  # a new DDP wrapper if the adapter changed
                result = _update(run, cfg, dist, trainable, samples, update)
                counts["tokens"] = result.tokens
            if run.prefetch is not None:
                t_wait = time.perf_counter()
                run.prefetch.wait()  # the next rollout, collected during this update
                engine_row["time/rollout_wait_s"] = time.perf_counter() - t_wait
            # -- logging, evaluation, checkpoints (rank 0) -----------------------------------------
            row = _metrics_row(update + 1, global_steps, roll, result, {**group_row, **engine_row}, cfg, run.plan, t_update)
            logger.log(row)
            bar.update(row)
            _check_finite(run.named, update + 1, cfg)  # every rank: DDP shares the NaN gradients
            if dist.is_main and cfg.run.eval_every and ((update + 1) % cfg.run.eval_every == 0 or update + 1 == cfg.ppo.updates):
                evals = evaluate.evaluate_splits(run.policy, cfg, cfg.run.eval_splits, cfg.run.eval_episodes)
                logger.log_eval(update + 1, global_steps, evals)
            if (cfg.run.checkpoint_every and (update + 1) % cfg.run.checkpoint_every == 0) or update + 1 == stop_at:
                with meter.phase("checkpoint"):
                    _save_checkpoint(run, cfg, dist, update + 1, global_steps, logger.history)
            _sync_adapter(run, dist, update + 1)
    finally:
        bar.close()
        run.close()
    return _finish(run, cfg, dist, stop_at, global_steps, meter, logger, log)


# -- set-up ------------------------------------------------------------------------------------------


def _setup(cfg: TrainConfig, dist: Any, out: Path, log: Any) -> Run:
    """Seed, check the env options, build the policy, its optimizer and the envs; nothing is trained or reset yet."""
    # the model seed is shared by every rank; env k's seeds depend on k only
    random.seed(cfg.run.seed)
    np.random.seed(cfg.run.seed)
    torch.manual_seed(cfg.run.seed)
    sgd_rng = np.random.default_rng(cfg.run.seed)

    check_env_config(cfg.env)  # before building a model: a typo should fail in a second
    plan = _plan(cfg, dist)
    policy = build_policy(cfg, log=log)
    dist.check_same_weights(policy)
    named = policy.trainable_parameters()
    lora_params = [p for n, p in named if not n.startswith("value_head")]
    param_groups, base_lrs = [{"params": lora_params, "lr": cfg.ppo.lr}], [cfg.ppo.lr]
    if policy.value_head is not None:  # none for a group advantage: no critic
        param_groups.append({"params": list(policy.value_head.parameters()), "lr": cfg.ppo.value_lr})
        base_lrs.append(cfg.ppo.value_lr)
    optimizer = torch.optim.AdamW(param_groups, weight_decay=0.0)
    sink = None
    if cfg.run.record or cfg.run.shards:
        sink = resources.CountingSink(
            runlog.open_replay(out, cfg, dist) if cfg.run.record else None,
            runlog.open_shards(out, cfg, dist) if cfg.run.shards else None,
        )
    pool = _make_pool(cfg, dist, sink, plan.grouped)
    run = Run(out, plan, policy, named, optimizer, base_lrs, ppo.clip_groups(named), pool, sink, sgd_rng)
    if cfg.ppo.rollout_engine == "server":
        run.engine = _server_engine(cfg, policy, out)
        run.prefetch = Prefetch() if cfg.ppo.async_rollouts else None
    return run


def _server_engine(cfg: TrainConfig, policy: Policy, out: Path) -> ServerEngine:
    """The rollout servers, checked to answer (``AGENTRL_ROLLOUT_API_KEY``: their bearer token)."""
    import os
    import re

    engine = ServerEngine(
        cfg.ppo.rollout_url,
        prefix=re.sub(r"[^A-Za-z0-9_-]", "-", f"{out.name}-{cfg.model.adapter}")[-60:].lstrip("-_") or "agentrl",
        stop_ids=sorted(policy.stop_ids),
        stops=policy.stops,
        vocab_size=len(policy.tokenizer),
        timeout=cfg.ppo.rollout_timeout,
        retries=cfg.ppo.rollout_retries,
        api_key=os.environ.get("AGENTRL_ROLLOUT_API_KEY", ""),
    )
    try:
        engine.check()
    except BaseException:
        engine.close()
        raise
    return engine


def _sync_adapter(run: Run, dist: Any, version: int) -> None:
    """Load the policy's adapter into the rollout servers as ``version`` (rank 0 saves and loads it)."""
    if run.engine is None:
        return
    if dist.is_main:
        run.engine.sync(run.policy, run.out / "rollout_adapters", version)
    dist.barrier()
    run.engine.version = version


def _plan(cfg: TrainConfig, dist: Any) -> Plan:
    """The run's counts; a ``--sync-batch`` that does not split over the ranks fails here, before a model is built."""
    per_step = micro_batches_per_step(cfg, dist.world)
    steps_per_epoch = ppo.optimizer_steps_per_epoch(cfg.ppo.rollout_steps * cfg.env.num_envs, cfg.ppo.micro_batch, per_step)
    total_steps = cfg.ppo.updates * cfg.ppo.epochs * steps_per_epoch
    return Plan(
        grouped=cfg.ppo.advantage in GROUP_ADVANTAGES,
        per_step=per_step,
        steps_per_update=cfg.ppo.rollout_steps * cfg.env.num_envs * dist.world,
        steps_per_epoch=steps_per_epoch,
        total_steps=total_steps,
        warmup=ppo.critic_warmup_steps(cfg.ppo.critic_warmup, total_steps),
    )


def _make_pool(cfg: TrainConfig, dist: Any, sink: resources.CountingSink | None, grouped: bool) -> EnvPool:
    """This rank's envs (global indices ``rank x num_envs`` on), each episode recorded into ``sink`` when there is one."""
    make_kwargs = {"split": cfg.env.split, "error_profile": cfg.env.error_profile, **cfg.env.env_kwargs}
    if cfg.env.mode == "candidates":
        make_kwargs["candidates"] = cfg.env.candidates
    wrap = None
    if sink is not None:
        from agentrl_envs.wrappers.record_trajectories import RecordVectorTrajectories

        def wrap(vec: Any) -> Any:
            return RecordVectorTrajectories(vec, sink, policy_id=f"{cfg.model.adapter}")

    return EnvPool(
        cfg.env.env,
        cfg.env.num_envs,
        first_index=dist.rank * cfg.env.num_envs,
        run_seed=cfg.run.seed,
        vectorization=cfg.env.vectorization,
        make_kwargs=make_kwargs,
        wrap=wrap,
        group_size=cfg.ppo.group_size if grouped else 0,
    )


def _resume_or_reset(run: Run, cfg: TrainConfig, dist: Any, log: Any) -> tuple[int, int, list[dict[str, Any]]]:
    """``(updates done, env steps taken, metrics rows)``: from the latest checkpoint with ``--resume``, else a reset."""
    if not cfg.run.resume:
        run.pool.reset()
        return 0, 0, []
    try:
        state = checkpoint.load_latest(
            run.out, run.policy, run.optimizer, run.pool, run.sgd_rng, rank=dist.rank, world=dist.world
        )
        if run.prefetch is not None and state.get("pending") is not None:  # the rollout collected during the last update
            run.prefetch.pending = rollout_from_state(state["pending"])
    except BaseException:
        run.close()
        raise
    log(f"resumed from update {state['update']} ({state['global_steps']} env steps)")
    return state["update"], state["global_steps"], state.get("history", [])


# -- one update --------------------------------------------------------------------------------------


def _collect(run: Run, cfg: TrainConfig, global_steps: int, update: int, log: Any) -> tuple[Rollout, dict[str, float]]:
    """This update's rollout (the one collected during the last update with ``--async-rollouts 1``, else one now).

    A server rollout is then scored by the trainer (values, reference log-probs); its row holds the
    gap between the server's log-probs and the trainer's and how many updates old its adapter is.
    """
    roll = run.prefetch.take() if run.prefetch is not None else None
    if roll is None:
        roll = _rollout(run, cfg, global_steps)
    if run.engine is None:
        return roll, {}
    t0 = time.perf_counter()
    row = score_rollout(run.policy, roll, cfg.ppo.logprob_tolerance, update, log)
    roll.model_seconds += time.perf_counter() - t0
    lag = update - min(tr.version for r in roll.transitions for tr in r if tr is not None)
    if not 0 <= lag <= cfg.ppo.async_rollouts:  # the servers answered with an adapter other than the one asked
        raise AgentRLError(
            f"update {update + 1}: its rollout was sampled with adapter version {update - lag}, {lag} updates from the "
            f"trainer's; --async-rollouts {cfg.ppo.async_rollouts} allows {cfg.ppo.async_rollouts}"
        )
    return roll, {**row, "rollout/version_lag": float(lag)}


def _rollout(run: Run, cfg: TrainConfig, global_steps: int) -> Rollout:
    """One rollout: ``rollout_steps`` per env, or one episode per env under a group advantage."""
    run.pool.set_training_step(global_steps)  # the aux reward schedule runs on global env steps
    rollout = collect_groups if run.plan.grouped else collect
    return rollout(run.policy, run.pool, cfg, recorder=run.pool.envs if run.sink is not None else None, engine=run.engine)


def _advantages(
    roll: Rollout, cfg: TrainConfig, grouped: bool, sgd_rng: np.random.Generator, dist: Any
) -> tuple[list[Sample], dict[str, float]]:
    """Rewards -> advantages and returns (statistics are global under DDP); the update's samples and group counts."""
    valid = roll.valid_TN
    rewards = roll.rewards_TN.copy()
    if cfg.ppo.shuffle_rewards:  # control: rewards carry no information about the actions
        rewards[valid] = sgd_rng.permutation(rewards[valid])
        # ... nor about episode length: permuted rewards with a positive mean would pay for every
        # extra step, so the control centres them (a per-step reward of 0 in expectation).
        rewards = np.where(valid, rewards - rewards[valid].mean(), 0.0)
    group_row: dict[str, float] = {}
    if grouped:
        # each env's one episode, scored by its (undiscounted) return on every step, or per step by its return-to-go
        score = ppo.episode_group_advantages if cfg.ppo.group_score == "return" else ppo.return_to_go_group_advantages
        adv_TN, flat_G = score(rewards, valid, cfg.ppo.group_size, cfg.ppo.advantage)
        ret_TN = np.zeros_like(rewards)  # no value head to train
        group_row = _group_metrics(flat_G, roll.cut_N, dist)
    else:
        rewards = ppo.normalize_rewards(rewards, valid, cfg.ppo.reward_norm, cfg.ppo.min_sigma, dist.moments(rewards[valid]))
        adv_TN, ret_TN = ppo.advantages(roll, rewards, cfg.ppo.advantage, cfg.ppo.gamma, cfg.ppo.lam)
        if cfg.ppo.whiten_advantages:
            adv_TN = ppo.whiten(adv_TN, dist.moments(adv_TN[valid]))
    samples = [(roll.transitions[t][i], float(adv_TN[t, i]), float(ret_TN[t, i])) for t, i in zip(*np.nonzero(valid))]
    return samples, group_row


def _update(run: Run, cfg: TrainConfig, dist: Any, trainable: Trainable, samples: list[Sample], update: int) -> UpdateResult:
    """``epochs`` passes of minibatch SGD over ``samples``; stops after an epoch whose mean KL passed ``--target-kl``."""
    t0 = time.perf_counter()
    run.policy.train()
    ent_coef = ppo.entropy_coef(update, cfg.ppo.updates, cfg.ppo.ent_start, cfg.ppo.ent_end)
    stats: dict[str, list[float]] = {k: [] for k in STAT_KEYS if k != "vf" or not run.plan.grouped}
    critic_ws: list[float] = []
    grad_norms: dict[str, float] = {}
    last_step, early_stop, epochs_run = -1, False, 0
    for epoch in range(cfg.ppo.epochs):
        epochs_run += 1
        kl_from = len(stats["approx_kl"])
        first_step = (update * cfg.ppo.epochs + epoch) * run.plan.steps_per_epoch
        last_step, grad_norms = _epoch(run, cfg, dist, trainable, samples, first_step, ent_coef, stats, critic_ws, grad_norms)
        epoch_kls = np.asarray(stats["approx_kl"][kl_from:])
        if cfg.ppo.target_kl and ppo.should_stop_early(epoch_kls, cfg.ppo.target_kl, dist.moments(epoch_kls)):
            early_stop = True  # decided once for all ranks, on this epoch's global mean
            break
    run.policy.eval()
    tokens = epochs_run * sum(len(tr.prompt_ids) + sum(len(c) for c in tr.cand_ids) + len(tr.new_ids) for tr, _, _ in samples)
    return UpdateResult(stats, critic_ws, grad_norms, ent_coef, last_step, early_stop, tokens, time.perf_counter() - t0)


def _epoch(
    run: Run,
    cfg: TrainConfig,
    dist: Any,
    trainable: Trainable,
    samples: list[Sample],
    first_step: int,
    ent_coef: float,
    stats: dict[str, list[float]],
    critic_ws: list[float],
    grad_norms: dict[str, float],
) -> tuple[int, dict[str, float]]:
    """One pass over ``samples`` in a fresh order, an optimizer step per ``per_step`` micro-batches.

    The schedules (learning rate, critic weight) run on the optimizer step as planned, ``first_step``
    on, so a resumed run follows them exactly. Appends to ``stats`` and ``critic_ws``; returns the
    last step's number and gradient norms (``(first_step - 1, grad_norms)`` when there was no step).
    """
    order = run.sgd_rng.permutation(len(samples))
    mbs = [order[j : j + cfg.ppo.micro_batch] for j in range(0, len(order), cfg.ppo.micro_batch)]
    step = run.plan.per_step or len(mbs)
    opt_step = first_step - 1
    for s_i, g in enumerate(range(0, len(mbs), step)):
        opt_step = first_step + s_i
        for param_group, base_lr in zip(run.optimizer.param_groups, run.base_lrs, strict=True):
            param_group["lr"] = base_lr * ppo.lr_factor(opt_step, run.plan.total_steps, cfg.ppo.lr_schedule)
        critic_ws.append(ppo.critic_weight(opt_step, run.plan.warmup))
        step_samples = [j for mb in mbs[g : g + step] for j in mb]
        group = episode_micro_batches(step_samples, samples, cfg.ppo.micro_batch, cfg.ppo.micro_batch_tokens)
        accumulate(run.policy, samples, group, cfg, ent_coef, critic_ws[-1], dist, stats, trainable)
        grad_norms = ppo.clip_gradients(run.clip_groups, cfg.ppo.grad_clip, cfg.ppo.clip_mode)
        run.optimizer.step()
        run.optimizer.zero_grad(set_to_none=True)
    return opt_step, grad_norms


def _metrics_row(
    done: int,
    global_steps: int,
    roll: Rollout,
    result: UpdateResult,
    group_row: dict[str, float],
    cfg: TrainConfig,
    plan: Plan,
    t_update: float,
) -> dict[str, Any]:
    """Update ``done``'s row of ``metrics.jsonl``: its episodes, loss terms, schedules, gradient norms and times."""
    return {
        "update": done,
        "env_steps": global_steps,
        "episodes": len(roll.episodes),
        "return": _mean([e["return"] for e in roll.episodes]),
        "success": _mean([float(e["success"]) for e in roll.episodes]),
        "reward_raw": float(roll.rewards_TN[roll.valid_TN].mean()),
        **{k: _mean(v) for k, v in result.stats.items()},
        **group_row,
        "ent_coef": result.ent_coef,
        **({} if plan.grouped else {"critic_weight": _mean(result.critic_ws)}),  # the mean over this update's optimizer steps
        "lr_factor": ppo.lr_factor(result.last_step, plan.total_steps, cfg.ppo.lr_schedule),  # at its last step
        "early_stop": result.early_stop,
        **{f"grad_norm/{k}": v for k, v in result.grad_norms.items()},
        "time/rollout_model_s": roll.model_seconds,
        "time/rollout_env_s": roll.env_seconds,
        "time/update_s": result.seconds,
        "time/total_s": time.perf_counter() - t_update,
        "rollout_tokens": roll.tokens,
    }


def _check_finite(named: list[tuple[str, torch.nn.Parameter]], done: int, cfg: TrainConfig) -> None:
    """Stop a run whose trainable weights left the finite numbers, before they are saved."""
    if not all(bool(torch.isfinite(p).all()) for _, p in named):
        raise ConfigError(
            f"ppo diverged at update {done}: the adapter's or value head's weights are not finite; lower "
            f"--lr (now {cfg.ppo.lr:g}), --value-lr (now {cfg.ppo.value_lr:g}) or --lora-alpha-ratio (now "
            f"{cfg.model.lora_alpha_ratio:g}); no checkpoint or final/ of these weights was written"
        )


def _save_checkpoint(run: Run, cfg: TrainConfig, dist: Any, done: int, global_steps: int, history: list[dict[str, Any]]) -> None:
    """A checkpoint after update ``done``: the weights (rank 0), every rank's envs and generators; the ranks must agree."""
    _check_in_sync(run.policy, dist, done)
    pending = run.prefetch.pending if run.prefetch is not None else None  # the next update's rollout, already collected
    checkpoint.save(
        run.out,
        done,
        global_steps,
        run.policy,
        run.optimizer,
        run.pool,
        run.sgd_rng,
        history,
        dist,
        cfg.run.keep_checkpoints,
        pending=None if pending is None else rollout_state(pending),
    )


# -- finish ------------------------------------------------------------------------------------------


def _finish(
    run: Run,
    cfg: TrainConfig,
    dist: Any,
    updates: int,
    global_steps: int,
    meter: resources.ResourceMeter,
    logger: runlog.RunLogger,
    log: Any,
) -> dict[str, Any]:
    """The summary; at the last update also ``final/`` (the adapter and its config), the final evaluation and the curve."""
    summary: dict[str, Any] = {"updates": updates, "env_steps": global_steps, "finished": updates >= cfg.ppo.updates}
    summary["world"] = dist.world
    summary["rank_weight_max_abs_diff"] = dist.max_weight_diff(run.policy)
    summary["resources"] = meter.write(run.out, cfg.model.adapter)["phases"]
    if dist.is_main:
        summary["resources_table"] = resources.table(resources.load(run.out))
        log(summary["resources_table"])
    if updates >= cfg.ppo.updates and dist.is_main:
        run.policy.save(run.out / "final")
        dump_config(cfg, run.out / "final" / "config.yaml")
        table = evaluate.final_eval(run.policy, cfg, run.out, log)
        if table:
            summary["eval"] = table
        logger.plot_curve(run.out / "learning_curve.png")
    logger.close(summary)
    return summary


# -- the phases' small helpers -----------------------------------------------------------------------


def _check_in_sync(policy: Policy, dist: Any, update: int) -> None:
    diff = dist.max_weight_diff(policy)
    if diff != 0.0:
        raise AgentRLError(
            f"rank {dist.rank}: trainable weights differ across ranks after update {update} (max abs diff {diff:.3g}); "
            "the DDP wrapper does not cover the trained parameters (rebuild it with accumulation.wrap_trainable after changing them)"
        )


def _group_metrics(flat_G: np.ndarray, cut_N: np.ndarray | None, dist: Any) -> dict[str, float]:
    """Group counts over all ranks: groups, those whose returns were all equal (no gradient), cut episodes."""
    groups, flat = dist.sum(len(flat_G)), dist.sum(int(flat_G.sum()))
    episodes = dist.sum(0 if cut_N is None else len(cut_N))
    cut = dist.sum(0 if cut_N is None else int(cut_N.sum()))
    return {
        "groups": int(groups),
        "zero_adv_groups": int(flat),
        "zero_adv_share": flat / groups if groups else math.nan,
        "cut_share": cut / episodes if episodes else math.nan,
    }


def _mean(xs: list[float]) -> float:
    return float(np.mean(xs)) if xs else math.nan
