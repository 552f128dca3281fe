"""The one settings surface of ctxapp.

Every tunable is declared once, as a typed attribute of `CtxappSettings`
(`ctxapp.conf.server` and `ctxapp.conf.declarations`): its environment variable, type, default and
a line of documentation. `ctxapp/settings.py` loads them into `settings.CTXAPP`, read as
`settings.CTXAPP.job_keep_days`; `ctxapp config` prints their effective values and where each came
from; `docs/settings.md` is generated from them (`ctxapp config --markdown`).

Values come from, in order of precedence: the process environment, then the env file
(`CTXAPP_ENV_FILE`, default `./.env`), then the default. A value that does not parse fails at
start with the variable's name: ctxapp never guesses.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dotenv import dotenv_values

from ctxapp.conf.declarations import SETTINGS, CtxappSettings
from ctxapp.conf.spec import Setting, mask, mask_url

__all__ = [
    "SETTINGS",
    "CtxappSettings",
    "Resolved",
    "Setting",
    "SettingError",
    "load",
    "mask",
    "mask_url",
    "resolve_all",
]


class SettingError(ValueError):
    """A setting's value could not be parsed. The message names the variable."""


@dataclass(frozen=True)
class Resolved:
    setting: Setting
    value: Any
    source: str  # "default" | "environment" | "file <path>"

    def display(self) -> str:
        return mask(self.setting, self.value)


def env_file_path() -> Path:
    return Path(os.environ.get("CTXAPP_ENV_FILE", ".env"))


def _file_values() -> dict[str, str]:
    path = env_file_path()
    if not path.is_file():
        return {}
    return {k: v for k, v in dotenv_values(path).items() if v is not None}


def resolve_all(environ: Mapping[str, str] | None = None) -> dict[str, Resolved]:
    """Every setting's value and source, by variable. Raises SettingError naming the first variable
    that does not parse."""
    env = os.environ if environ is None else environ
    file_values = _file_values()
    resolved: dict[str, Resolved] = {}
    for setting in SETTINGS:
        if setting.env in env:
            raw, source = env[setting.env], "environment"
        elif setting.env in file_values:
            raw, source = file_values[setting.env], f"file {env_file_path()}"
        else:
            resolved[setting.env] = Resolved(setting, setting.default, "default")
            continue
        try:
            value = setting.parse(raw)
        except (ValueError, TypeError) as exc:
            raise SettingError(f"{setting.env}={raw!r} is not a valid {setting.type_name}: {exc}") from None
        resolved[setting.env] = Resolved(setting, value, source)
    return resolved


def load(environ: Mapping[str, str] | None = None) -> CtxappSettings:
    """The typed settings (what `settings.CTXAPP` holds). Raises SettingError like `resolve_all`."""
    return CtxappSettings(**{r.setting.name: r.value for r in resolve_all(environ).values()})
