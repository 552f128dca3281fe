"""What a setting is: its environment variable, parser, default, documentation, secrecy and group,
kept as the metadata of one typed field of `CtxappSettings`."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, TypeVar, cast
from urllib.parse import urlsplit, urlunsplit

from ctxapp.conf.parsers import Parser

T = TypeVar("T")

ENV_PREFIX = "CTXAPP_"


@dataclass(frozen=True)
class Setting:
    env: str
    parse: Parser[Any]
    default: Any
    doc: str
    secret: bool = False
    group: str = "core"

    @property
    def name(self) -> str:
        """The attribute of `CtxappSettings`: the variable in snake case, without `CTXAPP_`."""
        return attribute_name(self.env)

    @property
    def type_name(self) -> str:
        return self.parse.name


def attribute_name(env: str) -> str:
    return env.removeprefix(ENV_PREFIX).lower()


def setting(
    env: str,
    parse: Parser[T],
    default: T,
    doc: str,
    *,
    secret: bool = False,
    group: str = "core",
) -> T:
    """Declare one field of `CtxappSettings`; typed as its value so mypy checks the default."""
    spec = Setting(env, parse, default, doc, secret=secret, group=group)
    if isinstance(default, list):
        items = list(default)
        return cast(T, dataclasses.field(default_factory=lambda: list(items), metadata={"setting": spec}))
    return cast(T, dataclasses.field(default=default, metadata={"setting": spec}))


def mask(setting: Setting, value: Any) -> str:
    if value is None or value == "":
        return "(unset)"
    if isinstance(value, list):
        return ",".join(value)
    text = str(value)
    if setting.secret:
        return "****" + (text[-4:] if len(text) > 12 else "")
    if "://" in text:
        return mask_url(text)
    return text


def mask_url(url: str) -> str:
    """Hide the password of a URL, keep everything else readable."""
    parts = urlsplit(url)
    if parts.password:
        netloc = f"{parts.username}:****@{parts.hostname}"
        if parts.port:
            netloc += f":{parts.port}"
        return urlunsplit(parts._replace(netloc=netloc))
    return url
