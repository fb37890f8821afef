"""A :class:`~agentrl_train.config.TrainConfig` in and out: YAML files, flag values and run folders.

:func:`load_config` starts from the defaults, then reads a YAML file (sections or flat keys), then
the flags' values; each value is coerced to its field's type, and an unknown name gets the nearest
known one as a hint. A run folder holds its resolved configuration as ``config.yaml``
(:func:`dump_config`, :func:`read_run_config`). The result is always checked
(:meth:`TrainConfig.validate <agentrl_train.config.TrainConfig.validate>`).
"""

from __future__ import annotations

import dataclasses
import difflib
from pathlib import Path
from typing import Any

import yaml

from agentrl_envs.errors import ConfigError
from agentrl_envs.yamlsafe import load_yaml, read_yaml_file, short_repr
from agentrl_train.config import SECTIONS, TrainConfig, option_names

__all__ = ["config_from_dict", "dump_config", "load_config", "make_run_dir", "read_run_config"]


def load_config(path: str | Path | None = None, overrides: dict[str, Any] | None = None) -> TrainConfig:
    """Defaults, then the YAML file (sections or flat keys), then ``overrides`` (flat option names)."""
    cfg = TrainConfig()
    if path:
        try:
            data = read_yaml_file(path, f"--config {path}")  # size, alias and depth caps; regular files only
        except FileNotFoundError:
            raise ConfigError(f"--config {path}: no such file") from None
        except IsADirectoryError:
            raise ConfigError(f"--config {path}: is a folder; point at a YAML file (e.g. run.yaml)") from None
        except NotADirectoryError:
            raise ConfigError(f"--config {path}: a part of that path is a file, not a folder") from None
        if data is None:
            data = {}
        if not isinstance(data, dict):
            raise ConfigError(f"--config {path}: the top level must be a mapping of sections (model, env, ppo, run)")
        for key, value in data.items():
            if key in SECTIONS:
                if not isinstance(value, dict):
                    raise ConfigError(f"--config {path}: section {short_repr(key)} must be a mapping")
                for name, v in value.items():
                    _set(cfg, str(name), v, section=key)
            else:
                _set(cfg, str(key), value)
    for name, value in (overrides or {}).items():
        _set(cfg, name, value)
    return cfg.validate()


def make_run_dir(cfg: TrainConfig) -> Path:
    """Create the run folder ``--out`` (and its parents); ConfigError if a file is in the way."""
    out = Path(cfg.run.out)
    if not cfg.run.out:
        raise ConfigError("--out='': name a run folder (e.g. runs/ppo)")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise ConfigError(f"--out {out}: a file (not a folder) is in the way; name a run folder instead") from None
    except NotADirectoryError:
        raise ConfigError(f"--out {out}: a part of that path is a file, not a folder; name a run folder instead") from None
    except OSError as exc:
        raise ConfigError(f"--out {out}: cannot create the run folder ({exc.strerror or exc})") from None
    return out


def dump_config(cfg: TrainConfig, path: Path) -> None:
    path.write_text(yaml.safe_dump(cfg.to_dict(), sort_keys=False), encoding="utf-8")


def config_from_dict(data: dict[str, Any]) -> TrainConfig:
    """A TrainConfig from :meth:`TrainConfig.to_dict` output (a run folder's config.yaml)."""
    cfg = TrainConfig()
    for section, values in data.items():
        if section not in SECTIONS or not isinstance(values, dict):
            raise ConfigError(f"config section {short_repr(section)}: expected one of {sorted(SECTIONS)}")
        for name, v in values.items():
            _set(cfg, str(name), v, section=section)
    return cfg.validate()


def read_run_config(folder: str | Path, option: str = "--run") -> TrainConfig:
    """The TrainConfig of a run folder (its ``config.yaml``), or ConfigError naming that file.

    Args:
        folder: a ``--out`` folder of a ppo or sft run.
        option: the option the folder came from, for the message (``--run``).
    """
    f = Path(folder) / "config.yaml"
    if not f.is_file():
        raise ConfigError(f"{option} {folder}: not a run folder (no config.yaml); point at the --out folder of a ppo or sft run")
    try:
        data = read_yaml_file(f, str(f))  # size, alias and depth caps: a run folder may come from someone else
    except ConfigError as exc:
        reason = str(exc).removeprefix(f"{f}: ")
        raise ConfigError(f"{option} {folder}: {f} is damaged (not readable YAML: {reason})") from None
    except OSError as exc:
        raise ConfigError(f"{option} {folder}: {f} is damaged (not readable: {exc.strerror or type(exc).__name__})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{option} {folder}: {f} is damaged (not a mapping of sections model/env/ppo/sft/run)")
    try:
        return config_from_dict(data)
    except ConfigError as exc:
        raise ConfigError(f"{option} {folder}: {f} is damaged ({exc})") from None


# -- internals -----------------------------------------------------------------------------------


def _set(cfg: TrainConfig, name: str, value: Any, section: str | None = None) -> None:
    name = name.replace("-", "_")
    options = option_names()
    if name not in options or (section is not None and options[name][0] != section):
        pool = [n for n, (s, _) in options.items() if section is None or s == section]
        near = difflib.get_close_matches(name, pool, n=1)
        hint = f"; did you mean {short_repr(near[0])}?" if near else f"; known options: {', '.join(sorted(pool))}"
        where = f" in section {short_repr(section)}" if section else ""
        raise ConfigError(f"unknown option {short_repr(name)}{where}{hint}")
    sec, f = options[name]
    setattr(getattr(cfg, sec), name, _coerce(name, f, value))


def _coerce(name: str, f: dataclasses.Field[Any], value: Any) -> Any:
    kind = type(f.default) if f.default is not dataclasses.MISSING else type(f.default_factory())  # type: ignore[misc,operator]
    flag = "--" + name.replace("_", "-")
    if kind is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "1", "yes", "on", "false", "0", "no", "off"):
            return value.lower() in ("true", "1", "yes", "on")
        raise ConfigError(f"{flag}={short_repr(value)}: use true or false")
    if kind is int:
        if isinstance(value, bool) or not isinstance(value, (int, str)):
            raise ConfigError(f"{flag}={short_repr(value)}: use an integer")
        try:
            return int(value)
        except ValueError:
            raise ConfigError(f"{flag}={short_repr(value)}: use an integer") from None
    if kind is float:
        if isinstance(value, bool) or not isinstance(value, (int, float, str)):
            raise ConfigError(f"{flag}={short_repr(value)}: use a number")
        try:
            out = float(value)
        except ValueError:
            raise ConfigError(f"{flag}={short_repr(value)}: use a number") from None
        if out != out or out in (float("inf"), float("-inf")):
            raise ConfigError(f"{flag}={short_repr(value)}: use a finite number")
        return out
    if kind is str:
        if not isinstance(value, (str, int, float)) or isinstance(value, bool):
            raise ConfigError(f"{flag}={short_repr(value)}: use a string")
        return str(value)
    if kind in (dict, list):
        if isinstance(value, str):
            try:
                value = load_yaml(value, flag)
            except ConfigError as exc:
                raise ConfigError(f"{flag}={short_repr(value)}: use a YAML/JSON {kind.__name__} ({exc})") from None
            if value is None:
                value = kind()
            if kind is list and isinstance(value, str):
                value = [v.strip() for v in value.split(",") if v.strip()]
        head, _, rest = value.partition(":") if isinstance(value, str) else ("", "", "")
        if kind is dict and rest and head.strip().isidentifier() and rest[0] != "/":  # 'attn:8' is text, not a mapping
            raise ConfigError(
                f"{flag}={short_repr(value)}: use a dict; with no space after its colon YAML reads this as one string: "
                f"write {{{head.strip()[:40]}: {rest.strip()[:40]}}}"
            )
        if not isinstance(value, kind):
            raise ConfigError(f"{flag}={repr(value)[:100]}: use a {kind.__name__}")
        if kind is dict:
            for key, item in dict(value).items():  # {attn:8} is a key "attn:8" with no value
                name, _, rest = key.partition(":") if isinstance(key, str) else ("", "", "")
                if rest and name.strip().isidentifier() and item is None:
                    raise ConfigError(
                        f"{flag}: {short_repr(key)} reads as one key with no value; put a space after its colon, "
                        f"as YAML needs: {name.strip()[:40]}: {rest.strip()[:40]}"
                    )
        return value
    raise ConfigError(f"{flag}: unsupported option type {short_repr(kind)}")  # pragma: no cover
