"""The commands that talk to a running ctxapp through its API: `ctxapp demo`, `ctxapp eval`
and `ctxapp mcp` (`ctxapp ctx …` lives in ctxapp/cli/ctx.py)."""

from __future__ import annotations

import argparse

from ctxapp.cli import ctx as ctx_cli
from ctxapp.cli.base import CliError


def _target(args: argparse.Namespace, *, need_key: bool = True) -> tuple[str, str]:
    try:
        return ctx_cli.target(args, need_key=need_key)
    except ctx_cli.CtxError as exc:
        raise CliError(str(exc)) from None


def cmd_demo(args: argparse.Namespace) -> int:
    # These three import httpx (the client) or the MCP SDK (about a second): only when run.
    from ctxapp.cli import demo  # lazy: startup-cost

    args.url, args.api_key = _target(args, need_key=False)
    return int(demo.main(args))


def cmd_eval_recall(args: argparse.Namespace) -> int:
    from ctxapp.cli import evaluation  # lazy: startup-cost

    return evaluation.main_recall(
        file=args.file, url=args.url, api_key=args.api_key, as_json=args.json, cleanup=args.cleanup,
        kinds=args.kinds, loo=args.loo, baseline=args.baseline,
    )  # fmt: skip


def cmd_mcp(args: argparse.Namespace) -> int:
    from ctxapp.integrations import mcp_stdio  # lazy: startup-cost

    url, key = _target(args)
    return mcp_stdio.run_stdio(url=url, api_key=key)
