"""Strict parsers of environment values: each turns the raw string into a typed value, or raises
ValueError with a message that tells the reader what a valid value looks like."""

from __future__ import annotations

import ipaddress
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class Parser(Generic[T]):
    """A parser with the name docs/settings.md and error messages give its type ("positive int")."""

    parse: Callable[[str], T]
    name: str

    def __call__(self, raw: str) -> T:
        return self.parse(raw)


def parser(name: str) -> Callable[[Callable[[str], T]], Parser[T]]:
    def wrap(parse: Callable[[str], T]) -> Parser[T]:
        return Parser(parse, name)

    return wrap


@parser("bool")
def parse_bool(raw: str) -> bool:
    value = raw.strip().lower()
    if value in {"1", "true", "yes", "on"}:
        return True
    if value in {"0", "false", "no", "off"}:
        return False
    raise ValueError("expected one of true/false, yes/no, on/off, 1/0")


@parser("int")
def parse_int(raw: str) -> int:
    return int(raw.strip().replace("_", ""))


@parser("float")
def parse_float(raw: str) -> float:
    return float(raw.strip())


@parser("comma-separated list")
def parse_list(raw: str) -> list[str]:
    return [item.strip() for item in raw.split(",") if item.strip()]


@parser("string")
def parse_str(raw: str) -> str:
    return raw


def parse_choice(*choices: str) -> Parser[str]:
    def parse(raw: str) -> str:
        value = raw.strip().lower()
        if value not in choices:
            raise ValueError(f"expected one of {', '.join(choices)}")
        return value

    return Parser(parse, "choice")


@parser("positive number")
def parse_positive_float(raw: str) -> float:
    value = float(raw.strip())
    if not value > 0:
        raise ValueError("expected a number greater than 0")
    return value


@parser("port")
def parse_port(raw: str) -> int:
    value = int(raw.strip())
    if not 0 < value < 65536:
        raise ValueError("expected a TCP port between 1 and 65535")
    return value


@parser("rate (N/s|min|h|day, or off)")
def parse_rate(raw: str) -> str | None:
    """A request rate `N/unit` (unit: s, min, h, day), or `off`."""
    value = raw.strip().lower()
    if value in {"off", "none", ""}:
        return None
    count, _, unit = value.partition("/")
    if not count.isdigit() or int(count) <= 0 or unit[:1] not in {"s", "m", "h", "d"}:
        raise ValueError("expected a rate such as 600/min, 20/s, 10000/h or 'off'")
    return value


@parser("positive int")
def parse_positive_int(raw: str) -> int:
    value = parse_int(raw)
    if value <= 0:
        raise ValueError("expected a positive integer")
    return value


@parser("int >= 0")
def parse_non_negative_int(raw: str) -> int:
    value = parse_int(raw)
    if value < 0:
        raise ValueError("expected 0 or a positive integer")
    return value


@parser("comma-separated CIDR list")
def parse_networks(raw: str) -> list[str]:
    """Comma-separated IP networks (CIDR, or single addresses), each checked."""
    networks = parse_list(raw)
    for network in networks:
        try:
            ipaddress.ip_network(network, strict=False)
        except ValueError:
            raise ValueError(f"{network!r} is not an IP network (e.g. 10.0.0.0/8 or 127.0.0.1)") from None
    return networks
