"""Screenshots of every dashboard page, from the demo's data, into docs/screenshots/.

    python scripts/screenshots.py                      # starts `ctxapp up` on a temp data dir
    python scripts/screenshots.py --url http://127.0.0.1:8000 --username admin --password … --api-key ctx_…

Without --url it starts a fresh ctxapp (embedded PostgreSQL, worker, scheduler) in a temporary
data directory on a free port, reads the first-run admin login and API key from its banner,
runs `ctxapp demo` against it, screenshots every page with headless Chromium, and stops it.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from playwright.sync_api import ViewportSize

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

CHROMIUM = os.environ.get("CTXAPP_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
VIEWPORT: ViewportSize = {"width": 1440, "height": 900}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Server:
    """`ctxapp up` in a subprocess; collects the first-run banner."""

    def __init__(self, data_dir: Path, port: int) -> None:
        env = dict(os.environ)
        env.update(
            {
                "CTXAPP_DATA_DIR": str(data_dir),
                "CTXAPP_PORT": str(port),
                "CTXAPP_HOST": "127.0.0.1",
                "CTXAPP_QUEUE_PREFIX": f"shots{port}",
                "PYTHONUNBUFFERED": "1",
            }
        )
        env.pop("DATABASE_URL", None)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "ctxapp.cli", "up"],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        self.lines: list[str] = []
        self.ready = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip())
            if line.startswith("Ctrl-C stops everything"):
                self.ready.set()
        self.ready.set()

    def credentials(self, timeout: float = 240) -> tuple[str, str, str, str]:
        if not self.ready.wait(timeout) or self.proc.poll() is not None:
            raise SystemExit("ctxapp up did not start:\n" + "\n".join(self.lines[-40:]))
        text = "\n".join(self.lines)
        url = re.search(r"ctxapp is up at (\S+)/", text)
        login = re.search(r"admin login\s+user '?([^'\s]+)'?\s+password '?([^'\s]+)'?", text)
        key = re.search(r"API key\s+(ctx_\S+)", text)
        if not (url and login and key):
            raise SystemExit("could not read the first-run credentials:\n" + text)
        return url.group(1), login.group(1), login.group(2), key.group(1)

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGINT)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)


def shoot(base: str, username: str, password: str, api_key: str, out: Path) -> list[str]:
    """Screenshot every page into `out`; return the console errors seen (none expected)."""
    from playwright.sync_api import sync_playwright

    from ctxapp.client import Client

    with Client(base, api_key) as ctx:
        sessions = ctx.sessions_list(agent="ops-copilot", limit=100)["items"]
    # The incident session is the first ops-copilot session (the long one, before the crash).
    incident = min(sessions, key=lambda s: s["created_at"]) if sessions else None
    user_id = next((s["user_id"] for s in sessions if s.get("user_id")), "")
    out.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    errors: list[str] = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport=VIEWPORT, device_scale_factor=1)
        page.on("console", lambda m: errors.append(f"{page.url}: {m.text}") if m.type == "error" else None)
        page.on("pageerror", lambda e: errors.append(f"{page.url}: {e}"))

        def snap(name: str, *, full: bool = True) -> None:
            path = out / f"{name}.png"
            page.screenshot(path=str(path), full_page=full)
            written.append(path)
            print(f"  {path}")

        page.goto(f"{base}/login/")
        snap("login", full=False)
        page.fill("input[name=username]", username)
        page.fill("input[name=password]", password)
        page.click("button[type=submit]")
        page.wait_for_url(f"{base}/")

        def visit(path: str) -> None:
            page.goto(f"{base}{path}")
            if page.locator("[ws-connect]").count():
                page.wait_for_selector("#live-status.on", timeout=15_000)
            page.wait_for_load_state("networkidle")
            time.sleep(0.8)  # the first live frame (re-render on connect) settles

        visit("/")
        snap("overview")
        visit("/sessions/")
        snap("sessions")
        if incident is not None:
            visit(f"/sessions/{incident['id']}/")
            snap("session")
        if user_id:
            visit(f"/users/{user_id}/")
            for summary in page.locator("[data-testid=history] summary").all()[:2]:
                summary.click()  # show a subject's earlier values
            snap("user")
        visit("/agents/ops-copilot/")
        radios = page.locator(".timeline input[name=a]")
        if radios.count() >= 2:
            page.locator(".timeline input[name=a]").nth(radios.count() - 1).check()
            page.click(".diff-form button[type=submit]")
            page.wait_for_selector("[data-testid=checkpoint-diff]", timeout=10_000)
        snap("agent")
        visit("/experiences/?q=connection+pool+exhausted+after+deploy")
        snap("experiences")
        visit("/jobs/")
        page.wait_for_selector("#jobs-running h2 + *", timeout=10_000)
        snap("jobs")
        browser.close()
    if errors:
        print("console errors:\n  " + "\n  ".join(errors))
    return errors


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--url")
    parser.add_argument("--username")
    parser.add_argument("--password")
    parser.add_argument("--api-key")
    parser.add_argument("--out", default=str(ROOT / "docs" / "screenshots"))
    parser.add_argument("--no-demo", action="store_true", help="screenshot the data as it is")
    parser.add_argument("--pace", type=float, default=0.05)
    args = parser.parse_args()

    from ctxapp.cli import demo

    server: Server | None = None
    try:
        if args.url:
            base, username, password, api_key = (
                args.url.rstrip("/"),
                args.username,
                args.password,
                args.api_key,
            )
        else:
            data_dir = Path(tempfile.mkdtemp(prefix="ctxapp-shots-"))
            print(f"starting ctxapp up in {data_dir} …")
            server = Server(data_dir, free_port())
            base, username, password, api_key = server.credentials()
        if not args.no_demo:
            print("running the demo …")
            code = demo.main(argparse.Namespace(url=base, api_key=api_key, pace=args.pace))
            if code:
                if server is not None:
                    print("server log (last 80 lines):\n" + "\n".join(server.lines[-80:]))
                return code
            time.sleep(5)  # let the worker finish summaries and embeddings
        print("screenshots:")
        errors = shoot(base, username, password, api_key, Path(args.out))
        if errors and server is not None:
            print("server log (last 80 lines):\n" + "\n".join(server.lines[-80:]))
        if errors:
            return 1
    finally:
        if server is not None:
            server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
