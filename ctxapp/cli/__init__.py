"""The `ctxapp` command.

ctxapp up        web server (HTTP + websockets), Celery worker and scheduler, and — when
                 DATABASE_URL is unset — the embedded PostgreSQL, together; Ctrl-C stops all
ctxapp config    every setting's effective value and where it came from (secrets masked);
                 --markdown prints docs/settings.md
ctxapp manage …  Django's management commands (migrate, createsuperuser, create_api_key, …)
ctxapp web | worker | beat
                 one process each, for production (see docker-compose.yml)
ctxapp demo      a simulated agent that drives every dashboard panel
ctxapp mcp       the MCP server over stdio (CTXAPP_URL, CTXAPP_API_KEY) for MCP clients
ctxapp ctx …     context operations from the command line (decay, compress, enhance, …)
ctxapp users …   what is known about each user: memories, their history, forget one
"""

from __future__ import annotations

import argparse
import os
import sys
import warnings

from ctxapp.cli import ctx as ctx_cli
from ctxapp.cli import users as users_cli
from ctxapp.cli.base import EXIT_INTERRUPTED, EXIT_USAGE, CliError, Interrupted, anchor_data_dir, command_name
from ctxapp.cli.config import cmd_config, settings_markdown
from ctxapp.cli.manage import cmd_manage
from ctxapp.cli.processes import cmd_beat, cmd_web, cmd_worker
from ctxapp.cli.remote import cmd_demo, cmd_eval_recall, cmd_mcp
from ctxapp.cli.up import cmd_up

__all__ = ["CliError", "anchor_data_dir", "build_parser", "command_name", "main", "settings_markdown"]

# pgserver asks platformdirs for a runtime directory, which warns on machines without one.
warnings.filterwarnings("ignore", message="XDG_RUNTIME_DIR is not set")
warnings.filterwarnings("ignore", category=UserWarning, module="platformdirs")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ctxapp", description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="run everything (web, worker, scheduler, embedded database)")
    up.add_argument("--host", help="interface to bind (default CTXAPP_HOST)")
    up.add_argument("--port", type=int, help="port to bind (default CTXAPP_PORT)")
    up.set_defaults(func=cmd_up)
    config = sub.add_parser("config", help="print the effective configuration")
    config.add_argument(
        "--markdown", action="store_true", help="print the settings reference (docs/settings.md)"
    )
    config.add_argument("--json", action="store_true", help="print the effective configuration as JSON")
    config.set_defaults(func=cmd_config)
    sub.add_parser("manage", help="Django management commands", add_help=False)
    web = sub.add_parser("web", help="the ASGI web server only")
    web.add_argument("--host")
    web.add_argument("--port", type=int)
    web.set_defaults(func=cmd_web)
    worker = sub.add_parser("worker", help="a Celery worker only")
    worker.add_argument(
        "--name",
        help="the worker's node name (Celery's -n; default celery@<host name>): "
        "give each worker on one host its own",
    )
    worker.set_defaults(func=cmd_worker)
    sub.add_parser("beat", help="the Celery scheduler only").set_defaults(func=cmd_beat)
    demo = sub.add_parser(
        "demo",
        help="drive a simulated agent against a running ctxapp",
        description="Play a simulated on-call agent against a running ctxapp so every dashboard panel "
        "moves. Without --url it finds the server: CTXAPP_URL, the config file, the `ctxapp up` running "
        "from this data directory (CTXAPP_DATA_DIR), else http://127.0.0.1:CTXAPP_PORT.",
    )
    ctx_cli.add_target_arguments(demo)
    demo.add_argument("--pace", type=float, default=None, help="seconds between steps (CTXAPP_DEMO_PACE)")
    demo.set_defaults(func=cmd_demo)
    evaluate = sub.add_parser("eval", help="evaluate a running ctxapp on a benchmark file")
    evaluations = evaluate.add_subparsers(dest="evaluation", required=True)
    recall = evaluations.add_parser(
        "recall", help="turn recall of POST /memory/search on a LoCoMo-format file (R@1/5/10, BM25)"
    )
    recall.add_argument("file", help="LoCoMo-format JSON: [{conversation, qa}, ...]")
    recall.add_argument("--url", default="http://127.0.0.1:8000")
    recall.add_argument("--api-key", default=os.environ.get("CTXAPP_API_KEY"))
    recall.add_argument("--json", action="store_true", help="last stdout line: one JSON object of figures")
    recall.add_argument("--cleanup", action="store_true", help="delete the sessions it created")
    recall.add_argument(
        "--kinds", default=None, help="memory search kinds, comma-separated (default: message)"
    )
    recall.add_argument(
        "--loo", action="store_true",
        help="also choose settings by nested leave-one-conversation-out and report the held-out figures",
    )  # fmt: skip
    recall.add_argument(
        "--baseline", action="store_true",
        help="also rank every question with the plain recipe (MiniLM + BM25, z-score fusion, "
        "neighbour smoothing) computed locally, beside ctxapp's figures",
    )  # fmt: skip
    recall.set_defaults(func=cmd_eval_recall)
    mcp = sub.add_parser(
        "mcp",
        help="the MCP server over stdio, for MCP clients (tools call the REST API)",
        description="Serve ctxapp's memory tools over stdio to an MCP client. The server URL and API key "
        "come from --url/--api-key, CTXAPP_URL/CTXAPP_API_KEY, or the config file.",
    )
    ctx_cli.add_target_arguments(mcp)
    mcp.set_defaults(func=cmd_mcp)
    ctx_cli.add_parser(sub)
    users_cli.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        found = anchor_data_dir()
        if argv[:1] == ["manage"]:
            return cmd_manage(argv[1:])
        args = build_parser().parse_args(argv)
        args.found_data_dir = found
        return int(args.func(args) or 0)
    except CliError as exc:
        print(f"ctxapp: {exc}", file=sys.stderr, flush=True)
        return EXIT_USAGE
    except (KeyboardInterrupt, Interrupted):
        print("\nctxapp: interrupted.", file=sys.stderr, flush=True)
        return EXIT_INTERRUPTED
