"""`ctxapp ctx …`: context operations on a running ctxapp, through the REST API (ctxapp.client).

Each command is one or two API calls; the output is a table (rich) or, with --json, one JSON
document on stdout. Where the server and key come from, first match wins: --url / --api-key, the
environment or env file (CTXAPP_URL, CTXAPP_API_KEY), the config file (--config, default
~/.config/ctxapp/config.toml: `url = "…"`, `api_key = "…"`), and for the URL the server that
`ctxapp up` is running from this data directory, else http://127.0.0.1:CTXAPP_PORT.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ctxapp.cli.base import command_name
from ctxapp.conf import CtxappSettings, SettingError, load

DEFAULT_CONFIG = Path("~/.config/ctxapp/config.toml")
SERVER_FILE = "server.json"  # written by `ctxapp up` in the data directory while it runs
PROMOTABLE_TYPES = ("preference", "project_config", "constraint")


class CtxError(Exception):
    """A problem the user can fix; printed without a traceback."""


# --- where the server is ----------------------------------------------------------------------


def add_target_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--url",
        help="ctxapp's base URL (default: CTXAPP_URL, the config file, the server `ctxapp up` runs "
        "from this data directory, else http://127.0.0.1:CTXAPP_PORT)",
    )
    parser.add_argument("--api-key", help="API key (default: CTXAPP_API_KEY, then the config file)")
    parser.add_argument(
        "--config", help=f"config file with url and api_key (default {DEFAULT_CONFIG})", default=None
    )


def _config_file(path: str | None) -> dict[str, Any]:
    file = Path(path or DEFAULT_CONFIG).expanduser()
    if not file.is_file():
        if path:
            raise CtxError(f"The config file {file} does not exist.")
        return {}
    try:
        return tomllib.loads(file.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise CtxError(f"The config file {file} could not be read: {exc}") from None


def running_server_url(cfg: CtxappSettings) -> str | None:
    """The URL of the `ctxapp up` running from this data directory, if its file is there."""
    file = Path(cfg.data_dir).expanduser() / SERVER_FILE
    try:
        record = json.loads(file.read_text())
        url, pid = record.get("url"), record.get("pid")
    except (OSError, ValueError, AttributeError):
        return None
    if isinstance(pid, int) and not _alive(pid):
        return None  # left behind by a `ctxapp up` that was killed
    return url if isinstance(url, str) and url else None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def default_url(cfg: CtxappSettings) -> str:
    return running_server_url(cfg) or f"http://127.0.0.1:{cfg.port}"


def _settings() -> CtxappSettings:
    try:
        return load()
    except SettingError as exc:
        raise CtxError(f"Configuration error: {exc}") from None


def target(args: argparse.Namespace, *, need_key: bool = True) -> tuple[str, str]:
    """(url, api_key) for this command; CtxError when no key can be found."""
    cfg = _settings()
    config = _config_file(getattr(args, "config", None))
    url = args.url or cfg.url or config.get("url") or default_url(cfg)
    key = args.api_key or cfg.api_key or config.get("api_key") or ""
    if need_key and not key:
        raise CtxError(
            "No API key: pass --api-key, set CTXAPP_API_KEY, or put api_key in "
            f"{DEFAULT_CONFIG}. Create one with `{command_name()} manage create_api_key --tenant demo`."
        )
    return str(url).rstrip("/"), str(key)


# --- output -----------------------------------------------------------------------------------


def _console() -> Any:
    # Every `ctxapp` command imports this module for its parser: rich, httpx (the client) and the
    # MCP SDK are imported only by the commands that use them.
    from rich.console import Console  # lazy: startup-cost

    # Piped output (a file, `less`, a test) gets wide tables rather than rich's 80-column default.
    return Console(soft_wrap=False, width=None if sys.stdout.isatty() else 160)


def _table(title: str, columns: list[str], rows: list[list[Any]]) -> Any:
    from rich.table import Table  # lazy: startup-cost

    table = Table(title=title, title_justify="left")
    for column in columns:
        table.add_column(column, overflow="fold")
    for row in rows:
        table.add_row(*["" if v is None else str(v) for v in row])
    return table


def _short(text: Any, limit: int = 80) -> str:
    value = " ".join(str(text or "").split())
    return value if len(value) <= limit else value[: limit - 1] + "…"


# --- commands: each returns (JSON document, renderables) --------------------------------------

Result = tuple[Any, list[Any]]


def do_decay(client: Any, args: argparse.Namespace) -> Result:
    report = client.decay_report(args.session)
    rows = [
        [f["key"], f["type"], f["importance"], f.get("rounds_since_reference"), f.get("recommendation"),
         _short(f["content"], 60)]
        for f in report["items"]
    ]  # fmt: skip
    title = f"Decayed facts of {report['session']} (round {report['round']}): {len(rows)}"
    return report, [
        _table(title, ["key", "type", "importance", "rounds idle", "recommendation", "content"], rows)
    ]


def do_compress(client: Any, args: argparse.Namespace) -> Result:
    result = client.session_compress(args.session, target_ratio=args.ratio)
    rows = [[m["seq"], m["role"], m["category"], m["priority"], f"{m['tokens']}/{m['original_tokens']}",
             "truncated" if m["truncated"] else "kept"] for m in result["messages"]]  # fmt: skip
    rows += [[m["seq"], m["role"], m["category"], m["priority"], f"0/{m['tokens']}", "dropped"]
             for m in result["dropped"]]  # fmt: skip
    rows.sort(key=lambda row: row[0])
    summary = (
        f"ratio {result['ratio']:.2f} (target {result['target_ratio']}, "
        f"{'met' if result['target_met'] else 'NOT met'}): {result['tokens_before']} → "
        f"{result['tokens_after']} tokens, {len(result['dropped'])} messages dropped"
    )
    table = _table("History by priority", ["seq", "role", "category", "priority", "tokens", "action"], rows)
    return result, [summary, table]


def do_enhance(client: Any, args: argparse.Namespace) -> Result:
    built = client.context_build(args.session, args.query)
    # What memory search finds for the query in this session and the same user's (or agent's) others.
    found = client.memory_search(
        args.query, scope={"session": args.session, "sessions": "all"}, limit=args.limit
    )
    built = {**built, "memory_search": found["results"]}
    items = built.get("manifest", {}).get("items", [])
    # History turns are counted in the summary line; the table lists what was recalled or left out.
    shown = [i for i in items if i.get("kind") != "history" or not i.get("included", True)]
    rows = [[i.get("component"), i.get("kind"), i.get("id"), i.get("tokens"), i.get("score"),
             "yes" if i.get("included", True) else "no", i.get("reason")] for i in shown]  # fmt: skip
    budget = built.get("budget", {})
    messages = sum(1 for i in items if i.get("kind") == "history" and i.get("included", True))
    summary = (
        f"build {built.get('build_id')}: {budget.get('prompt_tokens')} prompt tokens, utilisation "
        f"{budget.get('utilisation')}, {messages} history messages"
    )
    warnings = [f"warning {w.get('code')}: {w.get('message')}" for w in built.get("warnings", [])]
    table = _table(
        "Recalled and retrieved for this query",
        ["component", "kind", "id", "tokens", "score", "included", "reason"],
        rows,
    )
    search_table = _hit_table(
        f"Memory search for this query (this and earlier sessions): {args.query}",
        found["results"],
        with_when=False,
    )
    return built, [summary, table, search_table, *warnings]


def do_register(client: Any, args: argparse.Namespace) -> Result:
    from ctxapp.mcp.tools import fact_key  # lazy: startup-cost

    key = args.key or fact_key(args.type, args.text)
    fact = client.fact_register(args.session, key=key, type=args.type, content=args.text)
    rows = [[fact.get("id"), fact.get("key"), fact.get("type"), fact.get("importance"), fact.get("content")]]
    return fact, [_table("Tracked fact", ["id", "key", "type", "importance", "content"], rows)]


def do_check_position(client: Any, args: argparse.Namespace) -> Result:
    builds = client.context_builds(args.session, limit=1)
    if not builds:
        raise CtxError(
            f"Session {args.session} has no context build yet: run `{command_name()} ctx enhance` first."
        )
    build = builds[0]
    items = (build.get("manifest") or {}).get("items", [])
    critical = [i for i in items if i.get("critical") and i.get("included", True)]
    middle = {w.get("item") for w in build.get("warnings") or [] if w.get("code") == "critical_in_middle"}
    rows = []
    for item in critical:
        position = item.get("position")
        where = "—" if position is None else ("MIDDLE" if item.get("id") in middle else
                                             "start" if position < 0.5 else "end")  # fmt: skip
        rows.append([item.get("kind"), item.get("id"), item.get("offset"), position, where])
    document = {
        "build_id": build.get("build_id"),
        "critical": [
            {"kind": r[0], "id": r[1], "offset": r[2], "position": r[3], "where": r[4]} for r in rows
        ],
        "in_middle": sorted(x for x in middle if x),
    }
    title = f"Critical items in build {build.get('build_id')} ({len(middle)} in the middle)"
    return document, [_table(title, ["kind", "id", "token offset", "position", "where"], rows)]


def do_refresh(client: Any, args: argparse.Namespace) -> Result:
    report = client.decay_report(args.session)
    due = [f for f in report["items"] if f.get("recommendation") in {"restate_now", "consider_restating"}]
    lines = [f"- {f['content']}" for f in due]
    restatement = "Still in force:\n" + "\n".join(lines) if due else ""
    if due and args.append:
        client.message_append(args.session, role="system", content=restatement)
    for fact in due:
        client.fact_reference(args.session, fact["id"], note="restated by ctxapp ctx refresh")
    document = {"session": args.session, "restated": [f["id"] for f in due], "text": restatement,
                "appended": bool(due and args.append)}  # fmt: skip
    if not due:
        return document, ["Nothing to restate: no fact has decayed."]
    return document, [restatement, f"{len(due)} facts marked referenced."]


def do_sync(client: Any, args: argparse.Namespace) -> Result:
    session = client.session_get(args.session)
    facts = client.facts_list(args.session, limit=1000)["items"]
    promoted = []
    for fact in facts:
        if fact.get("type") not in PROMOTABLE_TYPES:
            continue
        result = client.experience_promote(
            fact["type"], fact["key"], fact["content"], session=args.session,
            user_id=session.get("user_id") or None, source={"fact": fact["id"]},
        )  # fmt: skip
        promoted.append({"fact": fact["id"], "experience": result.get("id"), "outcome": result.get("outcome"),
                         "kind": fact["type"], "key": fact["key"]})  # fmt: skip
    rows = [[p["kind"], p["key"], p["experience"], p["outcome"]] for p in promoted]
    document = {"session": args.session, "promoted": promoted, "skipped": len(facts) - len(promoted)}
    title = f"Promoted to long-term memory: {len(promoted)} of {len(facts)} facts"
    return document, [_table(title, ["kind", "key", "experience", "outcome"], rows)]


def do_summarize(client: Any, args: argparse.Namespace) -> Result:
    queued = client.summarise_now(args.session)
    summaries = client.summaries_list(args.session)
    rows = [[x["id"], "yes" if x["is_current"] else "", x["covers_up_to_seq"], x["tokens"], x["method"],
             _short(x["text"])] for x in summaries[:5]]  # fmt: skip
    document = {"queued": bool(queued.get("queued")), "session": args.session, "summaries": summaries}
    return document, [
        "Summarisation queued; the worker folds the oldest history into the rolling summary.",
        _table("Latest summaries", ["id", "current", "up to seq", "tokens", "method", "text"], rows),
    ]


def _hit_table(title: str, hits: list[dict[str, Any]], *, with_when: bool = True) -> Any:
    """Memory search hits as a table: score, kind, where (session:seq or id), when, speaker, text.

    The speaker column is shown only when some hit has one: messages carry a speaker only when
    their writer named it (`name`), and a column that is empty on every row says nothing."""
    columns = ["score", "kind", "where", *(["when"] if with_when else [])]
    speakers = any(hit.get("speaker") for hit in hits)
    columns += [*(["speaker"] if speakers else []), "text"]
    rows = [
        [round(hit["score"], 4), hit["kind"], hit["id"],
         *([(hit.get("occurred_at") or "")[:10]] if with_when else []),
         *([hit.get("speaker") or ""] if speakers else []), _short(hit.get("text"), 70)]
        for hit in hits
    ]  # fmt: skip
    return _table(title, columns, rows)


def do_search(client: Any, args: argparse.Namespace) -> Result:
    scope = {k: v for k, v in {"session": args.session, "agent": args.agent, "user_id": args.user_id}.items()
             if v is not None}  # fmt: skip
    if args.current:
        if not args.session:
            raise CtxError("--current needs --session.")
        scope["sessions"] = "current"
    result = client.memory_search(args.query, scope=scope or None, kinds=args.kind or None, limit=args.limit)
    tables = [_hit_table(f"Memory search: {args.query}", result["results"])]
    return result, tables + [f"warning: {w}" for w in result.get("warnings", [])]


COMMANDS: dict[str, Callable[[Any, argparse.Namespace], Result]] = {
    "decay": do_decay,
    "compress": do_compress,
    "enhance": do_enhance,
    "register": do_register,
    "check-position": do_check_position,
    "refresh": do_refresh,
    "sync": do_sync,
    "summarize": do_summarize,
    "search": do_search,
}


def command_group(
    sub: Any, name: str, *, help: str, doc: str | None, dest: str, run: Callable[[argparse.Namespace], int]
) -> Callable[[str, str], argparse.ArgumentParser]:
    """A `ctxapp NAME COMMAND` group of remote commands: returns the maker of one COMMAND's parser,
    which takes the server's URL and key (`add_target_arguments`) and `--json`, and runs `run`."""
    group = sub.add_parser(
        name, help=help, description=doc, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    commands = group.add_subparsers(dest=dest, required=True, metavar="COMMAND")

    def command(command_name: str, command_help: str) -> argparse.ArgumentParser:
        parser = commands.add_parser(command_name, help=command_help, description=command_help)
        add_target_arguments(parser)
        parser.add_argument("--json", action="store_true", help="print one JSON document (for scripts)")
        parser.set_defaults(func=run)
        return parser

    return command


def add_parser(sub: Any) -> None:
    command = command_group(
        sub,
        "ctx",
        help="context operations on a running ctxapp (decay, compress, enhance, register, …)",
        doc=__doc__,
        dest="ctx_command",
        run=run,
    )

    command("decay", "the session's decayed facts, most urgent first").add_argument("session")
    compress = command("compress", "the session's history compressed by priority (nothing is changed)")
    compress.add_argument("session")
    compress.add_argument("--ratio", type=float, default=0.5, help="target size ÷ original (0 to 1)")
    enhance = command("enhance", "build the context for QUERY and show what was recalled and retrieved")
    enhance.add_argument("session")
    enhance.add_argument("query")
    enhance.add_argument("--limit", type=int, default=5, help="memory search hits to show (default 5)")
    register = command("register", "track a fact of the session (a constraint, decision, goal, …)")
    register.add_argument("session")
    register.add_argument("text")
    register.add_argument("--type", default="constraint", help="fact type (default constraint)")
    register.add_argument("--key", help="fact key (default: derived from the text)")
    command("check-position", "where the critical items sit in the session's last prompt").add_argument(
        "session"
    )
    refresh = command("refresh", "restate the decayed facts and mark them referenced")
    refresh.add_argument("session")
    refresh.add_argument(
        "--append", action="store_true", help="also append the restatement to the session as a system message"
    )
    command(
        "sync", "promote the session's constraints, preferences and project config to long-term memory"
    ).add_argument("session")
    command("summarize", "queue the session's summarisation and show its latest summaries").add_argument(
        "session"
    )
    search = command(
        "search", "search memory: earlier turns of every session, summaries, facts and experiences"
    )
    search.add_argument("query")
    search.add_argument("--limit", type=int, default=10, help="1 to 100 (default 10)")
    search.add_argument(
        "--session", default=None, help="this session and the other sessions of its user (or agent)"
    )
    search.add_argument("--current", action="store_true", help="only --session itself")
    search.add_argument("--agent", default=None, help="only this agent's sessions")
    search.add_argument("--user-id", default=None, help="only this user's sessions")
    search.add_argument(
        "--kind", action="append", choices=["message", "summary", "fact", "experience"],
        help="only these kinds (repeatable; default all)",
    )  # fmt: skip


def run(args: argparse.Namespace) -> int:
    """Run one `ctxapp ctx` command; errors the user can fix are printed without a traceback."""
    return run_with(args, COMMANDS[args.ctx_command], "ctxapp ctx")


def run_with(
    args: argparse.Namespace, command: Callable[[Any, argparse.Namespace], Result], name: str
) -> int:
    """Run `command` with a client for the target of `args` (also `ctxapp users`, ctxapp/cli/users.py);
    errors the user can fix are printed as `<name>: …` without a traceback."""
    from ctxapp import client as api  # lazy: startup-cost

    try:
        url, key = target(args)
        with api.Client(url, key, retries=0) as client:
            document, renderables = command(client, args)
    except CtxError as exc:
        print(f"{name}: {exc}", file=sys.stderr)
        return 2
    except api.NetworkError as exc:
        print(
            f"{name}: cannot reach ctxapp at {url}: {exc}. Is `{command_name()} up` running?", file=sys.stderr
        )
        return 3
    except api.Unauthorized:
        print(
            f"{name}: the server at {url} refused the API key (revoked, expired or wrong).", file=sys.stderr
        )
        return 2
    except api.NotFound as exc:
        print(f"{name}: not found: {exc}", file=sys.stderr)
        return 4
    except api.CtxappError as exc:
        print(f"{name}: {exc.code}: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(document, default=str))
        return 0
    console = _console()
    for item in renderables:
        console.print(item)
    return 0
