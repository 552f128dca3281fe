"""The soak drill's load and what it checks.

`Load` sends an open-loop mixed load to a running `ctxapp up`: each second 4 single-message
appends, 1 context build, 2 memory searches (one user's scope, the whole tenant), 1 task created
and finished (so it is distilled), a `/readyz` poll and a dashboard page, spread over the second
and sent on a thread pool, so no request waits for another. Each request is recorded with its
kind, when it was due, its latency and its answer.

`IdleSampler` reads `pg_stat_activity` every second for connections idle in a transaction (the
start of issue 32's wedge). `settle` waits, bounded, for the background work the load implied;
`request_failures`, `IdleSampler.failures` and `exactly_once_failures` say what went wrong, with
the figures, and `summary` puts the figures on one line.
"""

from __future__ import annotations

import csv
import itertools
import logging
import os
import random
import re
import resource
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import astuple, dataclass, field, fields
from pathlib import Path
from typing import Any

import httpx
import psycopg

SLOW_SECONDS = 5.0  # no request may take longer, fault or not
IDLE_IN_TRANSACTION_SECONDS = 5.0
# A request still unanswered after this is recorded as unanswered (status 0); it has failed the
# 5 s bound anyway, and the bound keeps the load side's threads few when the server hangs.
REQUEST_TIMEOUT_SECONDS = 10.0
WORKERS = 160  # ~10 requests a second, each at most REQUEST_TIMEOUT_SECONDS (a task: two)
SAMPLE_SECONDS = 1.0
# httpx logs every request at INFO: thousands of lines in a failure report.
logging.getLogger("httpx").setLevel(logging.WARNING)

# One second of load, spread evenly over the second.
PLAN = (
    "append", "search_user", "append", "context", "append",
    "readyz", "append", "task", "search_tenant", "dashboard",
)  # fmt: skip
AGENTS = ("support-bot", "billing-bot")
USERS = ("u-ana", "u-ben")
SESSIONS = 4
DASHBOARD_PAGES = ("/", "/sessions/", "/jobs/", "/agents/", "/experiences/", "/session")

PRODUCTS = ("invoice export", "nightly import", "billing webhook", "CSV upload", "SSO login", "mobile sync")
ERRORS = ("timeout after 30 s", "permission denied", "invalid date format", "quota exceeded", "HTTP 502")
DAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday")
USER_LINES = (
    "Hi, the {product} has failed since {day}; the error says '{error}'.",
    "I tried again after clearing the cache and the {product} still shows '{error}'.",
    "Can you check order {order}? The {product} charged me twice.",
    "Our team of {n} people cannot use the {product} since the update on {day}.",
    "Thanks, that worked for the {product}. One more thing: order {order} is missing its receipt.",
)
ASSISTANT_LINES = (
    "Sorry about that. I see the {product} failing for order {order}; I restarted the job.",
    "The '{error}' error on the {product} comes from an expired token: please sign in again.",
    "I refunded the duplicate charge on order {order}; it shows within {n} days.",
    "I opened ticket {order} for the {product} team and will update you by {day}.",
    "The {product} runs again since {day}; {n} records were imported, none rejected.",
)
QUESTIONS = (
    "why does the {product} fail",
    "duplicate charge on order {order}",
    "what did we tell the customer about the {product}",
    "{error} after the update",
)


class Text:
    """Support conversations: a few templates with their blanks filled at random."""

    def __init__(self, seed: int = 32) -> None:
        self._random = random.Random(seed)
        self._lock = threading.Lock()

    def fill(self, templates: tuple[str, ...]) -> str:
        with self._lock:
            pick = self._random.choice
            return pick(templates).format(
                product=pick(PRODUCTS),
                error=pick(ERRORS),
                day=pick(DAYS),
                order=self._random.randint(10_000, 99_999),
                n=self._random.randint(2, 40),
            )


@dataclass(frozen=True)
class Request:
    kind: str
    at: float  # when it was due, seconds after the load started
    late: float  # how much later than due the load side sent it
    seconds: float  # from sent to answered
    status: int  # 0: no answer (timeout, connection refused or reset)
    detail: str  # /readyz's status, the error's code, or why there was no answer
    json_answer: bool  # /readyz: a JSON report; any other non-2xx: the JSON error envelope


def _describe(kind: str, response: httpx.Response) -> tuple[str, bool]:
    try:
        body = response.json()
    except ValueError:
        body = None
    if kind == "readyz":
        status = body.get("status") if isinstance(body, dict) else None
        if not isinstance(status, str):
            return response.text[:80], False
        checks = body.get("checks") if isinstance(body.get("checks"), dict) else {}
        failing = [f"{name}: {part.get('error')}" for name, part in checks.items() if not part.get("ok")]
        return (f"{status} ({'; '.join(failing)})" if failing else status), True
    if response.is_success:
        return "", False
    error = body.get("error") if isinstance(body, dict) else None
    code = error.get("code") if isinstance(error, dict) else None
    if code:
        return str(code), True
    where = response.headers.get("location")
    return (f"redirect to {where}" if where else response.text[:80].replace("\n", " ")), False


class Load:
    """The open-loop mixed load against one `ctxapp up`, and what it recorded."""

    def __init__(self, base: str, api_key: str, password: str) -> None:
        limits = httpx.Limits(max_connections=WORKERS, max_keepalive_connections=32)
        self.base = base
        self.api = httpx.Client(
            base_url=base,
            headers={"Authorization": f"Bearer {api_key}"},
            timeout=REQUEST_TIMEOUT_SECONDS,
            limits=limits,
        )
        self.dashboard = httpx.Client(base_url=base, timeout=REQUEST_TIMEOUT_SECONDS, limits=limits)
        self.password = password
        self.text = Text()
        self.requests: list[Request] = []
        self.errors: list[str] = []  # load-side errors (a bug of the drill, or an answer without its fields)
        self.sessions: list[str] = []
        self.appends: dict[int, int] = {}  # append number (its metadata.soak) -> status
        self.finished: dict[str, int] = {}  # task id -> status of the request that finished it
        self.seconds = 0.0
        self.started = 0.0
        self.cpu_seconds = 0.0  # of the load side (this process) while the load ran
        self._counters = {kind: itertools.count() for kind in PLAN}
        self._stop = threading.Event()
        self._runner = threading.Thread()

    # -- before the clock starts -------------------------------------------------------------

    def prepare(self) -> None:
        """Open the sessions (two agents, two users) and log in to the dashboard."""
        for i in range(SESSIONS):
            body = {"agent": AGENTS[i % 2], "user_id": USERS[i * len(USERS) // SESSIONS], "model": "gpt-4o"}
            created = self.api.post("/api/v1/sessions", json=body)
            assert created.status_code == 201, created.text
            self.sessions.append(created.json()["id"])
        form = self.dashboard.get("/login/")
        token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', form.text)
        assert token, form.text
        login = self.dashboard.post(
            "/login/",
            data={"csrfmiddlewaretoken": token[1], "username": "admin", "password": self.password},
            headers={"Referer": f"{self.base}/login/"},
        )
        assert login.status_code == 302 and login.headers["location"] == "/", login.text
        # One read of each kind first, unrecorded: the first search and build of a process load
        # the embedder and the tokenizers (seconds, once); the drill measures the steady state.
        for warm_up in (self._search_tenant, self._context, self._readyz, self._dashboard):
            warm_up(0, 0.0)
        assert all(200 <= r.status < 300 for r in self.requests), self.requests
        self.requests.clear()

    # -- the load ----------------------------------------------------------------------------

    def clock(self) -> float:
        """Seconds since the load started."""
        return time.monotonic() - self.started

    def wait_for_clock(self, at: float) -> None:
        while not self._stop.is_set() and (delay := at - self.clock()) > 0:
            self._stop.wait(delay)

    def stop(self) -> None:
        self._stop.set()

    def write_csv(self, path: Path) -> None:
        """Every request recorded, one row each, for a closer look than the summary's."""
        with path.open("w", newline="") as out:
            writer = csv.writer(out)
            writer.writerow([f.name for f in fields(Request)])
            writer.writerows(astuple(r) for r in sorted(self.requests, key=lambda r: r.at))

    def start(self, seconds: float) -> None:
        """Send the load for `seconds`, from now, in the background (`join` waits for it)."""
        self.seconds = seconds
        self.started = time.monotonic()
        self._runner = threading.Thread(target=self._run, daemon=True, name="soak-load")
        self._runner.start()

    def join(self) -> None:
        """Wait for the load to end: every request sent answered or timed out."""
        self._runner.join(self.seconds + 3 * REQUEST_TIMEOUT_SECONDS - self.clock())
        assert not self._runner.is_alive(), "the load did not end: a request outlived its timeout"

    def _run(self) -> None:
        cpu = resource.getrusage(resource.RUSAGE_SELF)
        try:
            self._send_all()
        finally:
            after = resource.getrusage(resource.RUSAGE_SELF)  # the whole test process, threads and all
            self.cpu_seconds = after.ru_utime + after.ru_stime - cpu.ru_utime - cpu.ru_stime

    def _send_all(self) -> None:
        seconds = self.seconds
        with ThreadPoolExecutor(WORKERS, thread_name_prefix="soak-load") as pool:
            for tick in range(round(seconds * len(PLAN))):
                at = tick / len(PLAN)
                self.wait_for_clock(at)
                if self._stop.is_set():
                    break
                pool.submit(self._guarded, PLAN[tick % len(PLAN)], at)

    def _guarded(self, kind: str, at: float) -> None:
        try:
            getattr(self, f"_{kind}")(next(self._counters[kind]), at)
        except Exception as exc:  # recorded and reported: a pool thread's exception is lost
            self.errors.append(f"{kind} at {at:.1f} s: {type(exc).__name__}: {exc}")

    def _call(
        self, kind: str, at: float, client: httpx.Client, method: str, url: str, **kwargs: Any
    ) -> httpx.Response | None:
        sent = time.monotonic()
        response = None
        try:
            response = client.request(method, url, **kwargs)
            status = response.status_code
            detail, json_answer = _describe(kind, response)
        except httpx.HTTPError as exc:
            status, detail, json_answer = 0, f"{type(exc).__name__}: {exc}"[:120], False
        answered = time.monotonic()
        self.requests.append(
            Request(kind, at, sent - self.started - at, answered - sent, status, detail, json_answer)
        )
        return response

    def _append(self, n: int, at: float) -> None:
        session = self.sessions[n % SESSIONS]
        role = "user" if (n // SESSIONS) % 2 == 0 else "assistant"
        text = self.text.fill(USER_LINES if role == "user" else ASSISTANT_LINES)
        body = {"role": role, "content": text, "metadata": {"soak": n}}
        answer = self._call("append", at, self.api, "POST", f"/api/v1/sessions/{session}/messages", json=body)
        self.appends[n] = answer.status_code if answer is not None else 0

    def _context(self, n: int, at: float) -> None:
        body = {"input": self.text.fill(QUESTIONS)}
        self._call(
            "context",
            at,
            self.api,
            "POST",
            f"/api/v1/sessions/{self.sessions[n % SESSIONS]}/context",
            json=body,
        )

    def _search_user(self, n: int, at: float) -> None:
        body = {"query": self.text.fill(QUESTIONS), "scope": {"user_id": USERS[n % len(USERS)]}}
        self._call("search_user", at, self.api, "POST", "/api/v1/memory/search", json=body)

    def _search_tenant(self, n: int, at: float) -> None:
        body = {"query": self.text.fill(QUESTIONS)}
        self._call("search_tenant", at, self.api, "POST", "/api/v1/memory/search", json=body)

    def _task(self, n: int, at: float) -> None:
        body = {
            "session": self.sessions[n % SESSIONS],
            "title": f"ticket {n}",
            "input": self.text.fill(USER_LINES),
            "metadata": {"soak": n},
        }
        created = self._call("task_create", at, self.api, "POST", "/api/v1/tasks", json=body)
        if created is None or created.status_code != 201:
            return
        task = created.json()["id"]
        change = {"status": "succeeded", "output": self.text.fill(ASSISTANT_LINES)}
        finished = self._call(
            "task_finish", self.clock(), self.api, "PATCH", f"/api/v1/tasks/{task}", json=change
        )
        self.finished[task] = finished.status_code if finished is not None else 0

    def _readyz(self, n: int, at: float) -> None:
        self._call("readyz", at, self.api, "GET", "/readyz")

    def _dashboard(self, n: int, at: float) -> None:
        page = DASHBOARD_PAGES[n % len(DASHBOARD_PAGES)]
        if page == "/session":  # one session's page, with its messages
            page = f"/sessions/{self.sessions[n % SESSIONS]}/"
        self._call("dashboard", at, self.dashboard, "GET", page)


# --- connections idle in a transaction ---------------------------------------------------------

IDLE_SQL = """
SELECT EXTRACT(EPOCH FROM now() - state_change)::float8 AS age, pid, backend_type, left(query, 160)
FROM pg_stat_activity
WHERE state IN ('idle in transaction', 'idle in transaction (aborted)') AND pid <> pg_backend_pid()
ORDER BY age DESC
"""


@dataclass
class IdleSampler:
    """Every SAMPLE_SECONDS, the connections of the database idle in a transaction."""

    uri: str
    clock: Callable[[], float]
    samples: int = 0
    unanswered: int = 0  # samples the database did not answer (down, in a drill)
    oldest: float = 0.0
    oldest_at: float = 0.0
    oldest_what: str = ""
    most: int = 0  # the most connections idle in a transaction at once
    over: list[tuple[float, float]] = field(default_factory=list)  # (when, age) of samples over the bound
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, daemon=True, name="soak-idle-sampler")
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)

    def _run(self) -> None:
        conn: psycopg.Connection[Any] | None = None
        while not self._stop.wait(SAMPLE_SECONDS):
            try:
                conn = conn or psycopg.connect(
                    self.uri, autocommit=True, connect_timeout=2, options="-c statement_timeout=2000"
                )
                rows = conn.execute(IDLE_SQL).fetchall()
            except psycopg.Error:
                self.unanswered += 1
                if conn is not None:
                    conn.close()
                conn = None
                continue
            self._note(rows)
        if conn is not None:
            conn.close()

    def _note(self, rows: list[tuple[Any, ...]]) -> None:
        self.samples += 1
        self.most = max(self.most, len(rows))
        if not rows:
            return
        age, pid, backend, query = rows[0]
        at = self.clock()
        if age > self.oldest:
            self.oldest, self.oldest_at = age, at
            query = " ".join(str(query).split())
            self.oldest_what = f"pid {pid} ({backend}), {len(rows)} idle in transaction, last query: {query}"
        if age > IDLE_IN_TRANSACTION_SECONDS:
            self.over.append((at, age))

    def failures(self) -> list[str]:
        if not self.over:
            return []
        first_at, _ = self.over[0]
        return [
            f"a connection was idle in a transaction for up to {self.oldest:.0f} s (bound "
            f"{IDLE_IN_TRANSACTION_SECONDS:.0f} s): over the bound in {len(self.over)} of {self.samples} "
            f"samples from {first_at:.0f} s on, up to {self.most} such connections at once; the oldest, at "
            f"{self.oldest_at:.0f} s: {self.oldest_what}"
        ]


# --- figures and request checks ----------------------------------------------------------------


def percentile(values: Iterable[float], q: float) -> float:
    """The nearest-rank percentile `q` (0-100) of `values`; 0 for none."""
    ordered = sorted(values)
    if not ordered:
        return 0.0
    return ordered[max(0, min(len(ordered) - 1, round(q / 100 * len(ordered) + 0.5) - 1))]


def _in(window: tuple[float, float] | None, at: float) -> bool:
    return window is not None and window[0] <= at <= window[1]


def _show(requests: list[Request], limit: int = 5) -> str:
    shown = ", ".join(
        f"{r.kind} at {r.at:.1f} s: {r.status or 'no answer'} in {r.seconds:.2f} s"
        + (f" ({r.detail})" if r.detail else "")
        for r in requests[:limit]
    )
    return shown + (f", … ({len(requests)} in all)" if len(requests) > limit else "")


def _verdict(request: Request, window: tuple[float, float] | None) -> str:
    """What a user would hold against this request ("" for nothing). In the fault `window` an
    API request may fail fast with the JSON error envelope and a 503, a dashboard page with a
    503, and /readyz may report a failing part (in JSON)."""
    if request.seconds > SLOW_SECONDS or request.status == 0:
        return f"took over {SLOW_SECONDS:.0f} s or got no answer"
    in_fault = _in(window, request.at)
    if request.kind == "readyz":
        if not request.json_answer:
            return "/readyz answered no JSON report"
        return "" if request.detail == "ok" or in_fault else "/readyz not ok"
    if 200 <= request.status < 300:
        return ""
    if in_fault and request.status == 503:
        return "" if request.json_answer or request.kind == "dashboard" else "503 without the JSON error"
    return "answered 5xx" if request.status >= 500 else "answered neither 2xx nor, in the fault, 503"


def request_failures(load: Load, window: tuple[float, float] | None = None) -> list[str]:
    """What the requests did that a user would notice, grouped. `window` (seconds of the load
    clock): the fault and its grace period (see `_verdict`)."""
    wrong: dict[str, list[Request]] = defaultdict(list)
    for request in load.requests:
        if verdict := _verdict(request, window):
            wrong[verdict].append(request)
    failures = [
        f"{len(requests)} requests {verdict}: {_show(requests)}" for verdict, requests in wrong.items()
    ]
    # Latency percentiles are speed, printed in the summary line and kept in docs/reliability.md,
    # not asserted: on a shared 2-core machine an append's p99 moves 0.1-1.5 s with the load. What
    # a user notices, a request hanging (the broker wedge made every job-implying write take 30 s),
    # is SLOW_SECONDS, asserted for every request.
    if load.errors:
        failures.append(f"{len(load.errors)} load-side errors: {load.errors[:5]}")
    return failures


def _kind_figures(load: Load) -> str:
    by_kind: dict[str, list[Request]] = defaultdict(list)
    for request in load.requests:
        by_kind[request.kind].append(request)
    parts = []
    for kind, requests in sorted(by_kind.items()):
        seconds = [r.seconds for r in requests]
        bad = sum(not 200 <= r.status < 300 for r in requests)
        parts.append(
            f"{kind} {len(requests)} p50/p99/max {percentile(seconds, 50):.2f}/{percentile(seconds, 99):.2f}/"
            f"{max(seconds):.2f} s" + (f" ({bad} not 2xx)" if bad else "")
        )
    return "; ".join(parts)


def _first(requests: Iterable[Request], what: Callable[[Request], bool]) -> str:
    found = [r.at for r in requests if what(r)]
    return f"{min(found):.0f} s" if found else "never"


def summary(name: str, load: Load, sampler: IdleSampler, settled: str) -> str:
    """The drill's figures on one line."""
    readyz = [r for r in load.requests if r.kind == "readyz"]
    states = Counter(r.detail.split(" (")[0] if r.status else "no answer" for r in readyz)
    late = max((r.late for r in load.requests), default=0.0)
    over = f"{sampler.over[0][0]:.0f} s" if sampler.over else "never"
    return (
        f"soak [{name}] {load.seconds:.0f} s, load average {os.getloadavg()[0]:.2f}: {_kind_figures(load)}; "
        f"readyz not ok {len(readyz) - states.get('ok', 0)} of {len(readyz)} {dict(states)}, "
        f"first at {_first(readyz, lambda r: r.detail != 'ok')}; first request over {SLOW_SECONDS:.0f} s at "
        f"{_first(load.requests, lambda r: r.seconds > SLOW_SECONDS or r.status == 0)}; "
        f"idle in transaction max {sampler.oldest:.1f} s (at {sampler.oldest_at:.0f} s, over "
        f"{IDLE_IN_TRANSACTION_SECONDS:.0f} s from {over}, up to {sampler.most} "
        f"at once, {sampler.unanswered} of {sampler.samples + sampler.unanswered} samples unanswered); "
        f"load side at most {late:.2f} s late, {load.cpu_seconds:.0f} s of CPU; {settled}"
    )


# --- the background work, once the load stopped ------------------------------------------------


@dataclass
class Outcome:
    """The database's view of the work the load implied."""

    intents: Counter[tuple[str, str]]  # (kind, status) -> count, every job intent
    failed: list[str]  # the failed intents: kind, key, error
    messages: dict[int, list[str]]  # append number -> embedding status of each row holding it
    tasks: dict[str, tuple[str, str]]  # task id -> (status, its distillation intents' key)
    distilled: dict[str, list[str]]  # task id -> the path of each of its memory.distilled events
    distill_intents: dict[str, list[str]]  # intent key ("task:<pk>") -> its intents' statuses
    experiences: Counter[str]  # embedding status -> count

    def waiting(self) -> list[str]:
        """What is still to run."""
        waiting = [
            f"{n} {kind} intents {status}"
            for (kind, status), n in self.intents.items()
            if status in {"pending", "running"}
        ]
        pending = sum(statuses.count("pending") for statuses in self.messages.values())
        if pending:
            waiting.append(f"{pending} messages not embedded yet")
        undistilled = [
            task
            for task, (status, _) in self.tasks.items()
            if status == "succeeded" and task not in self.distilled
        ]
        if undistilled:
            waiting.append(f"{len(undistilled)} finished tasks not distilled yet")
        if self.experiences.get("pending"):
            waiting.append(f"{self.experiences['pending']} experiences not embedded yet")
        return waiting


def outcome_read(uri: str, sessions: list[str]) -> Outcome:
    with psycopg.connect(uri, autocommit=True, connect_timeout=5) as conn:
        intents: Counter[tuple[str, str]] = Counter(
            {
                (kind, status): n
                for kind, status, n in conn.execute(
                    "SELECT kind, status, count(*) FROM memory_jobintent GROUP BY kind, status"
                )
            }
        )
        failed = [
            f"{kind} {key}: {error[:200]}"
            for kind, key, error in conn.execute(
                "SELECT kind, key, error FROM memory_jobintent WHERE status = 'failed' ORDER BY id LIMIT 5"
            )
        ]
        messages: dict[int, list[str]] = defaultdict(list)
        for n, status in conn.execute(
            "SELECT (m.metadata->>'soak')::int, m.embedding_status FROM memory_message m "
            "JOIN memory_session s ON s.id = m.session_id WHERE s.public_id = ANY(%s)",
            [sessions],
        ):
            messages[n].append(status)
        tasks = {
            public_id: (status, f"task:{pk}")
            for public_id, status, pk in conn.execute(
                "SELECT public_id, status, id FROM memory_task WHERE metadata ? 'soak'"
            )
        }
        distilled: dict[str, list[str]] = defaultdict(list)
        for task, path in conn.execute(
            "SELECT payload->>'task', payload->>'path' FROM memory_event WHERE type = 'memory.distilled'"
        ):
            distilled[task].append(path)
        distill_intents: dict[str, list[str]] = defaultdict(list)
        for key, status in conn.execute(
            "SELECT key, status FROM memory_jobintent WHERE kind = 'task.distill'"
        ):
            distill_intents[key].append(status)
        experiences: Counter[str] = Counter(
            dict(
                conn.execute("SELECT embedding_status, count(*) FROM memory_experience GROUP BY 1").fetchall()
            )
        )
    return Outcome(
        intents, failed, dict(messages), tasks, dict(distilled), dict(distill_intents), experiences
    )


def settle(
    uri: str, sessions: list[str], timeout: float, running: Callable[[], bool]
) -> tuple[Outcome | None, str]:
    """Wait (at most `timeout` s, and while `running()`) until nothing the load implied is still
    to run. Returns the last outcome read (None if the database never answered) and how the wait
    went, in words."""
    started = time.monotonic()
    outcome: Outcome | None = None
    while running():
        try:
            outcome = outcome_read(uri, sessions)
        except psycopg.Error as exc:
            reason = f"database: {exc}"
        else:
            waiting = outcome.waiting()
            if not waiting:
                return outcome, f"background work done {time.monotonic() - started:.1f} s after the load"
            reason = "; ".join(waiting)
        if time.monotonic() - started > timeout:
            return outcome, f"background work NOT done {timeout:.0f} s after the load: {reason}"
        time.sleep(1.0)
    return outcome, "background work NOT done: `ctxapp up` is no longer running"


def _append_failures(load: Load, outcome: Outcome) -> list[str]:
    """Every acknowledged append stored once and embedded; no append stored twice."""
    acknowledged = [n for n, status in load.appends.items() if 200 <= status < 300]
    lost = [n for n in acknowledged if n not in outcome.messages]
    twice = {n: rows for n, rows in outcome.messages.items() if len(rows) > 1}
    not_embedded = {n: rows for n, rows in outcome.messages.items() if set(rows) != {"completed"}}
    if not (lost or twice or not_embedded):
        return []
    return [
        f"appends: {len(acknowledged)} acknowledged; lost {lost[:10]}, stored twice {list(twice)[:10]}, "
        f"not embedded {dict(list(not_embedded.items())[:10])}"
    ]


def _task_failures(load: Load, outcome: Outcome) -> list[str]:
    """Every task finished with a 2xx succeeded; every succeeded task distilled exactly once."""
    failures = []
    unfinished = [
        t
        for t, status in load.finished.items()
        if 200 <= status < 300 and outcome.tasks.get(t, ("",))[0] != "succeeded"
    ]
    if unfinished:
        failures.append(f"{len(unfinished)} tasks finished with a 2xx are not succeeded: {unfinished[:10]}")
    wrong = {
        task: (outcome.distilled.get(task, []), outcome.distill_intents.get(key, []))
        for task, (status, key) in outcome.tasks.items()
        if status == "succeeded"
        and (outcome.distilled.get(task) != ["full"] or outcome.distill_intents.get(key) != ["done"])
    }
    if wrong:
        failures.append(
            f"{len(wrong)} of {len(outcome.tasks)} finished tasks were not distilled exactly once "
            f"(memory.distilled paths, task.distill intents): {dict(list(wrong.items())[:10])}"
        )
    return failures


def exactly_once_failures(load: Load, outcome: Outcome | None, settled: str) -> list[str]:
    """Every write the server acknowledged has its work done, once; nothing failed."""
    if outcome is None:
        return [settled]
    failures = [settled] if outcome.waiting() else []
    if outcome.failed:
        failed = sum(n for (_, status), n in outcome.intents.items() if status == "failed")
        failures.append(f"{failed} job intents failed, e.g. {outcome.failed}")
    failures += _append_failures(load, outcome) + _task_failures(load, outcome)
    if set(outcome.experiences) - {"completed"}:
        failures.append(f"experiences not embedded: {dict(outcome.experiences)}")
    return failures
