"""`ctxapp users …`: what a running ctxapp knows about each user, through the REST API (ctxapp.client).

    ctxapp users memories <user> [--as-of WHEN] [--type TYPE]   current memories (or as of WHEN)
    ctxapp users remember <user> <subject> <text> [--type TYPE]  record a value of a subject
    ctxapp users history <memory id> --user <user>                every version of its subject
    ctxapp users forget-memory <memory id> --user <user>          erase it and its earlier versions

The server and key are found as for `ctxapp ctx` (--url / --api-key, CTXAPP_URL / CTXAPP_API_KEY,
the config file, the running `ctxapp up`). Output is a table, or one JSON document with --json.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from ctxapp.cli import ctx as ctx_cli

MEMORY_TYPES = ("profile", "preference", "decision", "constraint", "plan", "fact")
Result = tuple[Any, list[Any]]


def _memory_table(title: str, memories: list[dict[str, Any]]) -> Any:
    rows = [
        [m["id"], m["subject"], m["type"], ctx_cli._short(m["text"], 60), "yes" if m["current"] else "no",
         (m["valid_from"] or "")[:19], (m["valid_to"] or "")[:19], round(m["confidence"], 2)]
        for m in memories
    ]  # fmt: skip
    columns = ["id", "subject", "type", "text", "current", "valid from", "valid to", "confidence"]
    return ctx_cli._table(title, columns, rows)


def do_memories(client: Any, args: argparse.Namespace) -> Result:
    memories = list(client.user_memories_iter(args.user, as_of=args.as_of, type=args.type))
    when = f" as of {args.as_of}" if args.as_of else ""
    return {"user_id": args.user, "items": memories}, [
        _memory_table(f"Memories of {args.user}{when}", memories)
    ]


def do_remember(client: Any, args: argparse.Namespace) -> Result:
    written = client.user_memory_create(args.user, args.subject, args.text, type=args.type)
    note = f"{written['outcome']}" + (
        f" (supersedes {written['supersedes']})" if written["supersedes"] else ""
    )
    return written, [_memory_table(f"Memory of {args.user}: {note}", [written])]


def do_history(client: Any, args: argparse.Namespace) -> Result:
    history = client.user_memory_history(args.user, args.memory)
    return history, [_memory_table(f"History of {args.memory}", history["items"])]


def do_forget_memory(client: Any, args: argparse.Namespace) -> Result:
    deleted = client.user_memory_delete(args.user, args.memory)
    return deleted, [f"Erased {deleted['count']}: {', '.join(deleted['deleted'])}"]


COMMANDS: dict[str, Callable[[Any, argparse.Namespace], Result]] = {
    "memories": do_memories,
    "remember": do_remember,
    "history": do_history,
    "forget-memory": do_forget_memory,
}


def add_parser(sub: Any) -> None:
    command = ctx_cli.command_group(
        sub,
        "users",
        help="what a running ctxapp knows about each user (memories, history, forget)",
        doc=__doc__,
        dest="users_command",
        run=run,
    )
    memories = command("memories", "the user's current memories, or those current at --as-of")
    memories.add_argument("user", help="the user id (the user_id of their sessions)")
    memories.add_argument("--as-of", default=None, help="an ISO 8601 moment, e.g. 2026-03-01T00:00:00Z")
    memories.add_argument("--type", choices=MEMORY_TYPES, default=None, help="only this type")
    remember = command("remember", "record the current value of SUBJECT for the user (supersedes the old)")
    remember.add_argument("user")
    remember.add_argument("subject", help="what it is about, e.g. home.city")
    remember.add_argument("text")
    remember.add_argument("--type", choices=MEMORY_TYPES, default=None, help="default fact")
    for name, help in (
        ("history", "every version of the memory's subject, oldest first"),
        ("forget-memory", "erase the memory and every earlier version of its subject"),
    ):
        parser = command(name, help)
        parser.add_argument("memory", help="the memory id (umem_…)")
        parser.add_argument("--user", required=True, help="the user the memory is about")


def run(args: argparse.Namespace) -> int:
    """Run one `ctxapp users` command (errors as `ctxapp ctx` prints them)."""
    return ctx_cli.run_with(args, COMMANDS[args.users_command], "ctxapp users")
