"""Building configs: from a dict or YAML preset (types coerced, unknown keys named with a
"did you mean"), ``--section.field value`` overrides, and back to a dict or YAML.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
import types
import typing
from pathlib import Path
from typing import Any

import yaml

from tokenergy.config.dfs import DFSRunConfig
from tokenergy.config.fields import ConfigError
from tokenergy.config.lm import LMRunConfig
from tokenergy.config.pipeline import PipelineRunConfig
from tokenergy.config.vector import RunConfig

CONFIG_KINDS: dict[str, type] = {
    "vector": RunConfig,
    "lm": LMRunConfig,
    "pipeline": PipelineRunConfig,
    "dfs": DFSRunConfig,
}


def _type_name(tp: Any) -> str:
    if tp is type(None):
        return "null"
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_type_name(a) for a in typing.get_args(tp))
    if tp is tuple:
        return "list"
    return getattr(tp, "__name__", str(tp))


# YAML 1.1 (PyYAML) reads 1e-4 and 3E5, numbers without a dot, as strings
_NUMBER = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?")


def _coerce(value: Any, tp: Any, path: str) -> Any:
    """Check ``value`` against a field type, converting only where it is lossless."""
    if tp in (int, float) and isinstance(value, str) and _NUMBER.fullmatch(value.strip()):
        value = float(value)
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(value, arg, path)
            except ConfigError:
                pass
        raise ConfigError(path, f"must be {_type_name(tp)}, got {value!r}")
    if tp is bool:
        if isinstance(value, bool):
            return value
    elif tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
    elif tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    elif tp is str:
        if isinstance(value, str):
            return value
    elif tp is tuple:
        if isinstance(value, (list, tuple)):
            return tuple(value)
    elif tp is dict:
        if isinstance(value, dict):
            return value
    else:  # pragma: no cover - only the types above are used in configs
        return value
    raise ConfigError(path, f"must be {_type_name(tp)}, got {value!r} ({type(value).__name__})")


def _unknown_key(key: str, allowed: list[str], path: str) -> ConfigError:
    close = difflib.get_close_matches(key, allowed, n=1, cutoff=0.6)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    where = f"{path}." if path else ""
    return ConfigError(f"{where}{key}", f"unknown key{hint} (allowed: {', '.join(allowed)})")


def _build(cls: type, data: dict, path: str) -> Any:
    if not isinstance(data, dict):
        raise ConfigError(path, f"must be a mapping of fields, got {data!r}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        if key not in fields:
            raise _unknown_key(key, list(fields), path)
        sub = f"{path}.{key}" if path else key
        tp = hints[key]
        if dataclasses.is_dataclass(tp):
            kwargs[key] = _build(tp, value or {}, sub)
        else:
            kwargs[key] = _coerce(value, tp, sub)
    try:
        return cls(**kwargs)
    except ConfigError as err:
        raise (err.prefixed(path) if path else err) from None


def config_class(data: dict | None) -> type:
    """The config class a preset asks for with its ``kind`` (``vector`` unless said)."""
    kind = (data or {}).get("kind", "vector")
    if kind not in CONFIG_KINDS:
        raise ConfigError("kind", f"must be one of {', '.join(CONFIG_KINDS)}, got {kind!r}")
    return CONFIG_KINDS[kind]


def config_from_dict(data: dict | None) -> Any:
    """Build and validate a run config (:class:`RunConfig` or :class:`LMRunConfig`, by
    ``kind``) from nested plain data (a parsed YAML file)."""
    cfg = _build(config_class(data), data or {}, "")
    ablation = getattr(cfg, "ablation", None)
    for name, overrides in (ablation.variants if ablation else {}).items():
        try:
            apply_overrides(cfg, overrides)
        except ConfigError as err:
            raise ConfigError(f"ablation.variants.{name}.{err.field_path}", err.message) from None
    return cfg


def config_to_dict(cfg: Any) -> dict:
    """Plain nested data for YAML (tuples become lists)."""

    def plain(x: Any) -> Any:
        if isinstance(x, tuple):
            return [plain(v) for v in x]
        if isinstance(x, dict):
            return {k: plain(v) for k, v in x.items()}
        if isinstance(x, list):
            return [plain(v) for v in x]
        return x

    return plain(dataclasses.asdict(cfg))


def apply_overrides(cfg: Any, overrides: dict[str, Any]) -> Any:
    """Return a new config with dotted-path overrides applied (``{"ppo.clip_eps": 0.1}``).

    Dashes in names are accepted for underscores (``ppo.clip-eps``). A path that goes on past a
    dict field sets one key of it (``env.kwargs.observation``), keeping the others. The result
    is validated as a whole, so incompatible combinations are caught too.
    """
    data = config_to_dict(cfg)
    env = data.get("env")
    new_env = {k.replace("-", "_"): v for k, v in overrides.items()}.get("env.name")
    if isinstance(env, dict) and "kwargs" in env and new_env not in (None, env.get("name")):
        env["kwargs"] = {}  # the arguments belonged to the other environment
    for dotted, value in overrides.items():
        parts = [p.replace("-", "_") for p in dotted.split(".")]
        node: Any = data
        cls: Any = type(cfg)
        for i, part in enumerate(parts):
            sub_path = ".".join(parts[: i + 1])
            parent_path = ".".join(parts[:i])
            if not (dataclasses.is_dataclass(cls) and isinstance(node, dict)):
                raise ConfigError(
                    sub_path, f"{parent_path} is not a section, it has no field {part!r}"
                )
            names = [f.name for f in dataclasses.fields(cls)]
            if part not in names:
                raise _unknown_key(part, names, parent_path)
            tp = typing.get_type_hints(cls)[part]
            if tp is dict and i < len(parts) - 1:  # a key inside a dict field (env.kwargs.size)
                node.setdefault(part, {})[".".join(parts[i + 1 :])] = value
                break
            if i == len(parts) - 1:
                if dataclasses.is_dataclass(tp):
                    raise ConfigError(
                        sub_path,
                        "is a section; override one of its fields, e.g. "
                        f"{sub_path}.{dataclasses.fields(tp)[0].name}",
                    )
                if tp is dict and isinstance(value, dict) and isinstance(node.get(part), dict):
                    node[part] = {**node[part], **value}
                else:
                    node[part] = value
            else:
                node = node.setdefault(part, {})
                cls = tp
    return _build(type(cfg), data, "")


def parse_override_args(args: list[str]) -> dict[str, Any]:
    """Parse ``["--ppo.clip-eps", "0.1", "--energy.shuffle=true"]`` into dotted overrides.

    Values are read as YAML scalars (``0.1`` → float, ``true`` → bool, ``[64, 64]`` → list,
    ``null`` → None). A flag with no value is ``true``.
    """
    out: dict[str, Any] = {}
    i = 0
    while i < len(args):
        arg = args[i]
        if not arg.startswith("--") or len(arg) == 2:
            raise ConfigError(
                "",
                f"unexpected argument {arg!r}; the config file comes first, overrides look like --section.field VALUE",
            )
        key = arg[2:]
        if "=" in key:
            key, raw = key.split("=", 1)
            i += 1
        elif i + 1 < len(args) and not args[i + 1].startswith("--"):
            raw = args[i + 1]
            i += 2
        else:
            raw = "true"
            i += 1
        try:
            value = yaml.safe_load(raw)
        except yaml.YAMLError:
            value = raw
        out[key] = value
    return out


def load_config(path: str | Path | None, overrides: dict[str, Any] | None = None) -> Any:
    """Read a YAML preset (or the defaults when ``path`` is None) and apply overrides."""
    data: dict = {}
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise ConfigError("", f"config file {str(p)!r} not found")
        try:
            data = yaml.safe_load(p.read_text()) or {}
        except yaml.YAMLError as err:
            raise ConfigError("", f"config file {str(p)!r} is not valid YAML: {err}") from None
        if not isinstance(data, dict):
            raise ConfigError("", f"config file {str(p)!r} must hold a mapping of sections")
    cfg = config_from_dict(data)
    if overrides:
        cfg = apply_overrides(cfg, _stringly(cfg, overrides))
    return cfg


def _stringly(cfg: Any, overrides: dict[str, Any]) -> dict[str, Any]:
    """A CLI value for a ``str`` field stays a string even when YAML reads it as a number."""
    out = {}
    for dotted, value in overrides.items():
        parts = [p.replace("-", "_") for p in dotted.split(".")]
        cls: Any = type(cfg)
        tp: Any = None
        for part in parts:
            if not dataclasses.is_dataclass(cls):
                tp = None
                break
            hints = typing.get_type_hints(cls)
            tp = hints.get(part)
            cls = tp
        if tp is str and value is not None and not isinstance(value, str):
            value = str(value)
        out[dotted] = value
    return out


def save_config(cfg: Any, path: str | Path) -> None:
    """Write the resolved config as YAML."""
    Path(path).write_text(yaml.safe_dump(config_to_dict(cfg), sort_keys=False))
