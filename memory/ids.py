"""Public ids: a type prefix and 24 hex characters from a CSPRNG (`sess_…`, `task_…`, `exp_…`)."""

import secrets


def new_public_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(12)}"


def new_sess_id() -> str:
    return new_public_id("sess")


def new_task_id() -> str:
    return new_public_id("task")


def new_exp_id() -> str:
    return new_public_id("exp")


def new_ckpt_id() -> str:
    return new_public_id("ckpt")


def new_evt_id() -> str:
    return new_public_id("evt")
