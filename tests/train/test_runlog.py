"""The learning curve says what it is of and what it is read against."""

from __future__ import annotations

from pathlib import Path

import pytest

from agentrl_train.config_io import load_config
from agentrl_train.runlog import RunLogger


def _rows(logger: RunLogger) -> None:
    for update, (ret, success) in enumerate([(0.2, 0.1), (0.9, 0.5)]):
        logger.log({"update": update + 1, "env_steps": 64 * (update + 1), "return": ret, "success": success})
    for update, rate in ((0, 0.06), (2, 0.5)):
        logger.log_eval(update, 64 * update, {"train": {"split": "train", "success_rate": rate, "mean_return": rate}})


@pytest.mark.parametrize(
    ("overrides", "title"),
    [
        ({}, "AgentRL/SQLPythonSMTP-v1 candidates mode: tiny, hierarchical, seed 0"),
        (
            {"env": "AgentRL/SQL-v0", "mode": "generate", "model": "smollm2-135m", "seed": 3, "error_profile": "flaky"},
            "AgentRL/SQL-v0 generate mode, faults flaky: smollm2-135m, hierarchical, seed 3",
        ),
        (
            {"advantage": "grpo", "group_size": 4, "num_envs": 8},
            "AgentRL/SQLPythonSMTP-v1 candidates mode: tiny, grpo, G=4, seed 0",
        ),
    ],
)
def test_the_curve_is_titled_with_env_mode_model_algorithm_and_seed(overrides: dict, title: str, tmp_path: Path) -> None:
    cfg = load_config(None, {"tensorboard": False, **overrides})
    logger = RunLogger(tmp_path, cfg)
    assert logger.title() == title
    _rows(logger)
    logger.plot_curve(tmp_path / "curve.png")
    assert (tmp_path / "curve.png").stat().st_size > 10_000


def test_the_curve_draws_the_start_and_the_oracle(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import matplotlib.figure

    seen: list[list[str]] = []
    save = matplotlib.figure.Figure.savefig

    def spy(fig: matplotlib.figure.Figure, *args: object, **kwargs: object) -> None:
        seen.extend([t.get_text() for t in ax.get_legend().get_texts()] for ax in fig.axes)
        save(fig, *args, **kwargs)

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", spy)
    logger = RunLogger(tmp_path, load_config(None, {"tensorboard": False}))
    _rows(logger)
    logger.plot_curve(tmp_path / "curve.png")
    assert "train before training" in seen[1] and "oracle (gold plan)" in seen[1]
