"""PPO + LoRA on agentrl envs: the training loop, top to bottom (CleanRL style).

``agentrl-train ppo`` calls :func:`train` with a :class:`~agentrl_train.config.TrainConfig`. One
update = one rollout of ``rollout_steps x num_envs`` transitions with the sampling policy (with a
group advantage: one episode per env, at most that long; :mod:`agentrl_train.group_rollout`), then
``epochs`` passes of minibatch SGD on the clipped PPO objective. The run folder gets the resolved
config, ``metrics.jsonl``, TensorBoard events, checkpoints (exact resume), ``final/``, the eval
table and the learning curve.
"""

from __future__ import annotations

import math
import random
import time
from typing import Any

import numpy as np
import torch

import agentrl_envs  # noqa: F401  (registers the ids)
from agentrl_envs.errors import AgentRLError, ConfigError
from agentrl_train import checkpoint, distributed, evaluate, ppo, resources, runlog
from agentrl_train.config import GROUP_ADVANTAGES, TrainConfig, dump_config, make_run_dir
from agentrl_train.distributed import Dist, Trainable
from agentrl_train.env_checks import check_env_config
from agentrl_train.group_rollout import collect_groups
from agentrl_train.policy import Policy, build_policy
from agentrl_train.rollout import EnvPool, Transition, collect

__all__ = [
    "accumulate",
    "episode_micro_batches",
    "train",
    "wrap_trainable",
]


def episode_micro_batches(indices: list[int], samples: list[tuple[Transition, float, float]], size: int) -> list[list[int]]:
    """One optimizer step's transitions cut into micro-batches of at most ``size``, each env's in a row.

    The step's gradient is the sum over its micro-batches, so how they are cut changes nothing but
    float rounding; keeping an env's successive transitions together lets them share one encoding
    of their prompts (:func:`ppo.unit_terms_many`).
    """
    ordered = sorted(indices, key=lambda j: (samples[j][0].env_index, j))
    return [ordered[j : j + size] for j in range(0, len(ordered), size)]


def wrap_trainable(policy: Policy, cfg: TrainConfig, dist: Any, current: Trainable | None = None) -> Trainable:
    """The policy's loss module under DDP over its trainable parameters (LoRA + value head).

    The seam for stages: returns ``current`` while the trainable set is unchanged, a new wrapper when
    the trained adapter changed (DDP must be rebuilt then, or ranks drift apart silently).
    """
    if current is not None and current.module.policy is policy:
        return distributed.wrap_trainable(current.module, dist, current)
    return distributed.wrap_trainable(ppo.PPOLoss(policy, cfg), dist)


def accumulate(
    policy: Policy,
    samples: list[tuple[Transition, float, float]],
    group: list[Any],
    cfg: TrainConfig,
    ent_coef: float,
    critic_w: float,
    dist: Any,
    stats: dict[str, list[float]],
    trainable: Trainable | None = None,
) -> None:
    """Forward and backward the micro-batches of one optimizer step; gradients summed across ranks.

    Every policy loss is divided by a global count of the step (``--loss-agg``: its units, or its
    sequences and their units or budget; :func:`ppo.unit_norms`), the value loss by its global number
    of samples, so any split of the step into micro-batches and ranks gives the same gradient. DDP's
    all-reduce runs on the last micro-batch only (``no_sync`` on the others).
    """
    trainable = wrap_trainable(policy, cfg, dist, trainable)
    flat = [j for mb in group for j in mb]
    norms = dict(zip(flat, ppo.step_unit_norms([samples[j][0] for j in flat], cfg, dist.sum)))
    n_samples = dist.sum(len(flat))
    for m_i, mb in enumerate(group):
        with trainable.no_sync(last=m_i == len(group) - 1):
            loss = trainable([samples[j] for j in mb], ent_coef, critic_w, [norms[j] for j in mb], n_samples, stats)
            trainable.backward(loss)  # summed across ranks on the last micro-batch


def train(cfg: TrainConfig, *, log: Any = print, dist: Any = None) -> dict[str, Any]:
    """Run PPO; returns the final summary (also written to ``summary.json``)."""
    dist = dist or Dist()  # one process: every collective is a no-op
    out = make_run_dir(cfg)

    # -- seeding: the model seed is shared by every rank; env k's seeds depend on k only -----------
    random.seed(cfg.run.seed)
    np.random.seed(cfg.run.seed)
    torch.manual_seed(cfg.run.seed)
    sgd_rng = np.random.default_rng(cfg.run.seed)

    check_env_config(cfg.env)  # before building a model: a typo should fail in a second
    per_step = micro_batches_per_step(cfg, dist.world)
    policy = build_policy(cfg, log=log)
    dist.check_same_weights(policy)
    named = policy.trainable_parameters()
    lora_params = [p for n, p in named if not n.startswith("value_head")]
    param_groups, base_lrs = [{"params": lora_params, "lr": cfg.ppo.lr}], [cfg.ppo.lr]
    if policy.value_head is not None:  # none for a group advantage: no critic
        param_groups.append({"params": list(policy.value_head.parameters()), "lr": cfg.ppo.value_lr})
        base_lrs.append(cfg.ppo.value_lr)
    optimizer = torch.optim.AdamW(param_groups, weight_decay=0.0)
    grouped = cfg.ppo.advantage in GROUP_ADVANTAGES
    groups = ppo.clip_groups(named)

    make_kwargs = {"split": cfg.env.split, "error_profile": cfg.env.error_profile, **cfg.env.env_kwargs}
    if cfg.env.mode == "candidates":
        make_kwargs["candidates"] = cfg.env.candidates
    sink = None
    if cfg.run.record or cfg.run.shards:
        sink = resources.CountingSink(
            runlog.open_replay(out, cfg, dist) if cfg.run.record else None,
            runlog.open_shards(out, cfg, dist) if cfg.run.shards else None,
        )
    wrap = None
    if sink is not None:
        from agentrl_envs.data import RecordVectorTrajectories

        def wrap(vec: Any) -> Any:
            return RecordVectorTrajectories(vec, sink, policy_id=f"{cfg.model.adapter}")

    pool = EnvPool(
        cfg.env.env,
        cfg.env.num_envs,
        first_index=dist.rank * cfg.env.num_envs,
        run_seed=cfg.run.seed,
        vectorization=cfg.env.vectorization,
        make_kwargs=make_kwargs,
        wrap=wrap,
        group_size=cfg.ppo.group_size if grouped else 0,
    )
    start_update, global_steps, history = 0, 0, []
    if cfg.run.resume:
        try:
            state = checkpoint.load_latest(out, policy, optimizer, pool, sgd_rng, rank=dist.rank, world=dist.world)
        except BaseException:
            pool.close()
            if sink is not None:
                sink.close()
            raise
        start_update, global_steps, history = state["update"], state["global_steps"], state.get("history", [])
        log(f"resumed from update {start_update} ({global_steps} env steps)")
    else:
        pool.reset()
    # written once the run has started: a failed resume leaves the run's config.yaml and metrics.jsonl as they were
    if dist.is_main:
        dump_config(cfg, out / "config.yaml")
    logger = runlog.RunLogger(out, cfg, enabled=dist.is_main, history=history)

    steps_per_update = cfg.ppo.rollout_steps * cfg.env.num_envs * dist.world
    trainable = wrap_trainable(policy, cfg, dist)
    meter = resources.ResourceMeter(dist, policy.device, sink)
    # schedules run on the optimizer step as planned (update, epoch, step), so a resumed run follows them exactly
    steps_per_epoch = ppo.optimizer_steps_per_epoch(cfg.ppo.rollout_steps * cfg.env.num_envs, cfg.ppo.micro_batch, per_step)
    total_steps = cfg.ppo.updates * cfg.ppo.epochs * steps_per_epoch
    warmup = ppo.critic_warmup_steps(cfg.ppo.critic_warmup, total_steps)
    bar = runlog.progress(cfg, start_update, enabled=dist.is_main)
    update = start_update
    stop_at = (
        cfg.ppo.updates
        if not cfg.run.max_updates_this_call
        else min(cfg.ppo.updates, start_update + cfg.run.max_updates_this_call)
    )
    try:
        if start_update == 0 and dist.is_main and cfg.run.eval_every:
            logger.log_eval(0, 0, evaluate.evaluate_splits(policy, cfg, cfg.run.eval_splits, cfg.run.eval_episodes))
        for update in range(start_update, stop_at):
            t_update = time.perf_counter()
            # -- rollout ----------------------------------------------------------------------------
            with meter.phase("rollout") as counts:
                pool.set_training_step(global_steps)  # the aux reward schedule runs on global env steps
                roll = (collect_groups if grouped else collect)(
                    policy, pool, cfg, recorder=pool.envs if sink is not None else None
                )
                valid = roll.valid_TN
                counts.update(tokens=roll.tokens, env_steps=int(valid.sum()))
            # a group rollout's envs idle once their episode ended: count the steps taken (on every rank)
            global_steps += int(dist.sum(int(valid.sum()))) if grouped else steps_per_update

            with meter.phase("update") as counts:
                # -- rewards -> advantages (statistics are global under DDP) --------------------------
                rewards = roll.rewards_TN.copy()
                if cfg.ppo.shuffle_rewards:  # control: rewards carry no information about the actions
                    rewards[valid] = sgd_rng.permutation(rewards[valid])
                    # ... nor about episode length: permuted rewards with a positive mean would pay for every
                    # extra step, so the control centres them (a per-step reward of 0 in expectation).
                    rewards = np.where(valid, rewards - rewards[valid].mean(), 0.0)
                group_row: dict[str, float] = {}
                if grouped:
                    # each env's one episode, scored by its (undiscounted) return, the same advantage on every step
                    adv_TN, flat_G = ppo.episode_group_advantages(rewards, valid, cfg.ppo.group_size, cfg.ppo.advantage)
                    ret_TN = np.zeros_like(rewards)  # no value head to train
                    group_row = _group_metrics(flat_G, roll.cut_N, dist)
                else:
                    rewards = ppo.normalize_rewards(
                        rewards, valid, cfg.ppo.reward_norm, cfg.ppo.min_sigma, dist.moments(rewards[valid])
                    )
                    adv_TN, ret_TN = ppo.advantages(roll, rewards, cfg.ppo.advantage, cfg.ppo.gamma, cfg.ppo.lam)
                    if cfg.ppo.whiten_advantages:
                        adv_TN = ppo.whiten(adv_TN, dist.moments(adv_TN[valid]))

                # -- PPO update ---------------------------------------------------------------------
                policy.train()
                trainable = wrap_trainable(policy, cfg, dist, trainable)  # a new DDP wrapper if the adapter changed
                samples = [(roll.transitions[t][i], float(adv_TN[t, i]), float(ret_TN[t, i])) for t, i in zip(*np.nonzero(valid))]
                ent_coef = ppo.entropy_coef(update, cfg.ppo.updates, cfg.ppo.ent_start, cfg.ppo.ent_end)
                critic_ws: list[float] = []
                stats: dict[str, list[float]] = {
                    k: [] for k in ("pg", "vf", "entropy", "kl_ref", "approx_kl", "clipfrac", "drift") if k != "vf" or not grouped
                }
                grad_norms: dict[str, float] = {}
                t_sgd = time.perf_counter()
                stop_early = False
                epochs_run = 0
                for epoch in range(cfg.ppo.epochs):
                    epochs_run += 1
                    epoch_kl_from = len(stats["approx_kl"])
                    order = sgd_rng.permutation(len(samples))
                    mbs = [order[j : j + cfg.ppo.micro_batch] for j in range(0, len(order), cfg.ppo.micro_batch)]
                    step = per_step or len(mbs)
                    for s_i, g in enumerate(range(0, len(mbs), step)):
                        opt_step = (update * cfg.ppo.epochs + epoch) * steps_per_epoch + s_i
                        for param_group, base_lr in zip(optimizer.param_groups, base_lrs, strict=True):
                            param_group["lr"] = base_lr * ppo.lr_factor(opt_step, total_steps, cfg.ppo.lr_schedule)
                        critic_ws.append(ppo.critic_weight(opt_step, warmup))
                        group = episode_micro_batches([j for mb in mbs[g : g + step] for j in mb], samples, cfg.ppo.micro_batch)
                        accumulate(policy, samples, group, cfg, ent_coef, critic_ws[-1], dist, stats, trainable)
                        grad_norms = ppo.clip_gradients(groups, cfg.ppo.grad_clip, cfg.ppo.clip_mode)
                        optimizer.step()
                        optimizer.zero_grad(set_to_none=True)
                    epoch_kls = np.asarray(stats["approx_kl"][epoch_kl_from:])
                    if cfg.ppo.target_kl and ppo.should_stop_early(epoch_kls, cfg.ppo.target_kl, dist.moments(epoch_kls)):
                        stop_early = True  # decided once for all ranks, on this epoch's global mean
                        break
                policy.eval()
                counts["tokens"] = epochs_run * sum(
                    len(tr.prompt_ids) + sum(len(c) for c in tr.cand_ids) + len(tr.new_ids) for tr, _, _ in samples
                )
            sgd_s = time.perf_counter() - t_sgd

            # -- logging, evaluation, checkpoints (rank 0) ---------------------------------------
            row = {
                "update": update + 1,
                "env_steps": global_steps,
                "episodes": len(roll.episodes),
                "return": _mean([e["return"] for e in roll.episodes]),
                "success": _mean([float(e["success"]) for e in roll.episodes]),
                "reward_raw": float(roll.rewards_TN[valid].mean()),
                **{k: _mean(v) for k, v in stats.items()},
                **group_row,
                "ent_coef": ent_coef,
                **({} if grouped else {"critic_weight": _mean(critic_ws)}),  # the mean over this update's optimizer steps
                "lr_factor": ppo.lr_factor(opt_step, total_steps, cfg.ppo.lr_schedule),  # at its last step
                "early_stop": stop_early,
                **{f"grad_norm/{k}": v for k, v in grad_norms.items()},
                "time/rollout_model_s": roll.model_seconds,
                "time/rollout_env_s": roll.env_seconds,
                "time/update_s": sgd_s,
                "time/total_s": time.perf_counter() - t_update,
                "rollout_tokens": roll.tokens,
            }
            logger.log(row)
            bar.update(row)
            if not all(bool(torch.isfinite(p).all()) for _, p in named):  # every rank: DDP shares the NaN gradients
                raise ConfigError(
                    f"ppo diverged at update {update + 1}: the adapter's or value head's weights are not finite; lower "
                    f"--lr (now {cfg.ppo.lr:g}), --value-lr (now {cfg.ppo.value_lr:g}) or --lora-alpha-ratio (now "
                    f"{cfg.model.lora_alpha_ratio:g}); no checkpoint or final/ of these weights was written"
                )
            is_last = update + 1 == cfg.ppo.updates
            if dist.is_main and cfg.run.eval_every and ((update + 1) % cfg.run.eval_every == 0 or is_last):
                logger.log_eval(
                    update + 1, global_steps, evaluate.evaluate_splits(policy, cfg, cfg.run.eval_splits, cfg.run.eval_episodes)
                )
            if (cfg.run.checkpoint_every and (update + 1) % cfg.run.checkpoint_every == 0) or update + 1 == stop_at:
                with meter.phase("checkpoint"):
                    _check_in_sync(policy, dist, update + 1)
                    checkpoint.save(
                        out,
                        update + 1,
                        global_steps,
                        policy,
                        optimizer,
                        pool,
                        sgd_rng,
                        logger.history,
                        dist,
                        cfg.run.keep_checkpoints,
                    )
        update = stop_at
    finally:
        bar.close()
        pool.close()
        if sink is not None:
            sink.close()

    summary: dict[str, Any] = {"updates": update, "env_steps": global_steps, "finished": update >= cfg.ppo.updates}
    summary["world"] = dist.world
    summary["rank_weight_max_abs_diff"] = dist.max_weight_diff(policy)
    summary["resources"] = meter.write(out, cfg.model.adapter)["phases"]
    if dist.is_main:
        summary["resources_table"] = resources.table(resources.load(out))
        log(summary["resources_table"])
    if update >= cfg.ppo.updates and dist.is_main:
        policy.save(out / "final")
        dump_config(cfg, out / "final" / "config.yaml")
        table = evaluate.final_eval(policy, cfg, out, log)
        if table:
            summary["eval"] = table
        logger.plot_curve(out / "learning_curve.png")
    logger.close(summary)
    return summary


def micro_batches_per_step(cfg: TrainConfig, world: int) -> int:
    """Micro-batches per optimizer step on each rank (0: the whole rollout), from ``--sync-batch`` or ``--accumulation``.

    ``--sync-batch`` is the global number of transitions per optimizer step, the same update on any
    world size; it must split into ``world x micro_batch`` pieces.
    """
    p = cfg.ppo
    if world > 1 and p.advantage in GROUP_ADVANTAGES and (p.sync_batch or p.accumulation):
        # a group rollout's length varies by rank (envs idle once their episode ended), so would the
        # number of optimizer steps, and the ranks' all-reduces would no longer pair up
        raise ConfigError(
            f"--advantage {p.advantage} on {world} ranks takes the whole rollout as one optimizer step per epoch: "
            "drop --sync-batch and --accumulation (or run on one rank)"
        )
    if not p.sync_batch:
        return p.accumulation
    if p.sync_batch % (world * p.micro_batch):
        raise ConfigError(
            f"--sync-batch={p.sync_batch}: use a multiple of ranks x --micro-batch = {world} x {p.micro_batch} "
            f"(e.g. {world * p.micro_batch * max(1, round(p.sync_batch / (world * p.micro_batch)))})"
        )
    acc = p.sync_batch // (world * p.micro_batch)
    if p.accumulation and p.accumulation != acc:
        raise ConfigError(
            f"--accumulation={p.accumulation} contradicts --sync-batch={p.sync_batch} on {world} rank(s) with "
            f"--micro-batch={p.micro_batch} (that is {acc} micro-batches per step); give only one of the two"
        )
    return acc


def _check_in_sync(policy: Policy, dist: Any, update: int) -> None:
    diff = dist.max_weight_diff(policy)
    if diff != 0.0:
        raise AgentRLError(
            f"rank {dist.rank}: trainable weights differ across ranks after update {update} (max abs diff {diff:.3g}); "
            "the DDP wrapper does not cover the trained parameters (rebuild it with train.wrap_trainable after changing them)"
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
