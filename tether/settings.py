"""Typed settings from defaults < TOML file < `TETHER_*` environment < command-line flags.

An unknown key in the file, or a value of the wrong type, stops the program at start with the
key named: a typo must never silently fall back to a default. Secrets never live in the TOML
file or the environment: a setting names a file, and `read_secret` also looks in systemd's
`$CREDENTIALS_DIRECTORY` (`LoadCredential=`).
"""

from __future__ import annotations

import dataclasses
import math
import os
import tomllib
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

ENV_PREFIX = "TETHER_"

S = TypeVar("S")

# `Annotated[str, COMMA_LIST]`: a string setting that lists several values, comma-separated;
# in the TOML file it may also be an array of strings.
COMMA_LIST = "comma-separated list"
# A `dict[str, X]` setting is a TOML table in the file (`[name]`, one key per line) and a TOML
# inline table in the environment (`TETHER_NAME='{ acme = "x", beta = ["y", "z"] }'`).


class SettingsError(Exception):
    """The configuration is invalid; the message names the key and what is wrong."""


def _field_types(cls: type[Any]) -> dict[str, Any]:
    hints = typing.get_type_hints(cls, include_extras=True)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


def _coerce(key: str, raw: Any, hint: Any, origin: str) -> Any:
    """Turn a TOML or string value into `hint`, or raise naming `key` and where it came from."""
    args = typing.get_args(hint)
    if typing.get_origin(hint) is typing.Annotated:
        if COMMA_LIST in args[1:] and isinstance(raw, list):
            if not raw or not all(isinstance(item, str) for item in raw):
                raise SettingsError(
                    f"{origin}: setting {key!r} must be a string or a non-empty list of strings,"
                    f" got {raw!r}"
                )
            raw = ",".join(raw)
        return _coerce(key, raw, args[0], origin)
    if typing.get_origin(hint) is dict:
        return _coerce_table(key, raw, args[1], origin)
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        if type(None) in args and (raw is None or raw == ""):
            return None
        inner = [a for a in args if a is not type(None)]
        return _coerce(key, raw, inner[0], origin)
    try:
        if hint is bool:
            if isinstance(raw, bool):
                return raw
            if isinstance(raw, str) and raw.lower() in {"1", "true", "yes", "on"}:
                return True
            if isinstance(raw, str) and raw.lower() in {"0", "false", "no", "off"}:
                return False
            raise ValueError(raw)
        if hint is int:
            if isinstance(raw, bool | float):
                raise ValueError(raw)
            return int(raw)
        if hint is float:
            if isinstance(raw, bool):
                raise ValueError(raw)
            number = float(raw)
            if not math.isfinite(number):  # inf would make a lease endless, nan every check false
                raise ValueError(raw)
            return number
        if hint is str:
            if not isinstance(raw, str):
                raise ValueError(raw)
            return raw
        if hint is Path:
            if not isinstance(raw, str | Path):
                raise ValueError(raw)
            return Path(raw)
    except (TypeError, ValueError):
        name = getattr(hint, "__name__", str(hint))
        raise SettingsError(f"{origin}: setting {key!r} must be {name}, got {raw!r}") from None
    raise SettingsError(f"{origin}: setting {key!r} has an unsupported type {hint!r}")


def _coerce_table(key: str, raw: Any, hint: Any, origin: str) -> dict[str, Any]:
    """A table setting: each entry's value turned into `hint`, named `key.<entry>`."""
    if isinstance(raw, str):
        try:
            raw = tomllib.loads(f"table = {raw}")["table"] if raw.strip() else {}
        except tomllib.TOMLDecodeError as exc:
            raise SettingsError(
                f"{origin}: setting {key!r} must be a TOML inline table such as"
                f' {{ acme = "a, b" }}: {exc}'
            ) from None
    if not isinstance(raw, dict):
        raise SettingsError(f"{origin}: setting {key!r} must be a table, got {raw!r}")
    return {str(name): _coerce(f"{key}.{name}", value, hint, origin) for name, value in raw.items()}


def load_settings(
    cls: type[S],
    *,
    config_file: Path | None = None,
    environ: Mapping[str, str] | None = None,
    flags: Mapping[str, Any] | None = None,
) -> S:
    """Build `cls` from its defaults, then the TOML file, then `TETHER_*`, then `flags`.

    `flags` holds only the flags the user gave (None means "not given"). The dataclass's own
    `__post_init__` checks ranges and raises `SettingsError`.
    """
    hints = _field_types(cls)
    values: dict[str, Any] = {}
    if config_file is not None:
        try:
            with config_file.open("rb") as fh:
                data = tomllib.load(fh)
        except FileNotFoundError:
            raise SettingsError(f"config file {config_file} does not exist") from None
        except OSError as exc:  # a directory, no permission, ...
            why = exc.strerror or type(exc).__name__
            raise SettingsError(f"config file {config_file} cannot be read: {why}") from None
        except tomllib.TOMLDecodeError as exc:
            raise SettingsError(f"config file {config_file} is not valid TOML: {exc}") from None
        for key, raw in data.items():
            if key not in hints:
                known = ", ".join(sorted(hints))
                raise SettingsError(f"{config_file}: unknown setting {key!r} (known: {known})")
            values[key] = _coerce(key, raw, hints[key], str(config_file))
    # Only the program's own fields are looked up: the runner and the supervisor share the
    # `TETHER_` prefix on one machine, so another variable is not a typo.
    env = os.environ if environ is None else environ
    for key, hint in hints.items():
        var = ENV_PREFIX + key.upper()
        if var in env:
            values[key] = _coerce(key, env[var], hint, f"environment {var}")
    for key, raw in (flags or {}).items():
        if raw is None:
            continue
        if key not in hints:
            raise SettingsError(f"unknown setting {key!r}")
        values[key] = _coerce(key, raw, hints[key], f"flag --{key.replace('_', '-')}")
    try:
        return cls(**values)
    except TypeError as exc:  # a field without default was not given anywhere
        raise SettingsError(str(exc)) from None


def config_file_from(flag: str | None, environ: Mapping[str, str] | None = None) -> Path | None:
    """`--config` wins; else `TETHER_CONFIG`; else no file (embedded defaults)."""
    env = os.environ if environ is None else environ
    chosen = flag or env.get(ENV_PREFIX + "CONFIG")
    return Path(chosen) if chosen else None


def require_positive(name: str, value: float) -> None:
    if not value > 0:
        raise SettingsError(f"setting {name!r} must be > 0, got {value!r}")


def read_secret(
    path: Path | None, credential: str, environ: Mapping[str, str] | None = None
) -> str:
    """Read a secret from `path`, else from `$CREDENTIALS_DIRECTORY/<credential>`.

    The secret's value never appears in an error message: only where it was looked for.
    """
    env = os.environ if environ is None else environ
    candidates: list[Path] = []
    if path is not None:
        candidates.append(path)
    elif env.get("CREDENTIALS_DIRECTORY"):
        candidates.append(Path(env["CREDENTIALS_DIRECTORY"]) / credential)
    if not candidates:
        raise SettingsError(
            f"no {credential}: give a file path, or LoadCredential={credential}:... under systemd"
        )
    target = candidates[0]
    try:
        secret = target.read_text(encoding="utf-8-sig").strip()  # -sig: a BOM is not the secret
    except OSError as exc:
        raise SettingsError(f"cannot read {credential} from {target}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise SettingsError(f"{credential} file {target} is not UTF-8 text") from None
    if not secret:
        raise SettingsError(f"{credential} file {target} is empty")
    if not (secret.isascii() and secret.isprintable()) or any(c.isspace() for c in secret):
        # It would go into an HTTP header, and an error about that header would quote it.
        raise SettingsError(
            f"{credential} file {target} must hold the secret alone on one line: it has"
            " spaces, line breaks, or control or non-ASCII characters inside"
        )
    return secret
