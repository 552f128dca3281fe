# ruff: noqa: E501
"""The source documents' token-savings scenario, replicated with exact o200k tokens.

    python bench/bench_token_savings.py [--seed 11]

20 problem → solution pairs from agent operations work; each round the user raises one of them
(random), the agent answers; 15 % of rounds carry a follow-up question and answer. At 10, 20, …,
100 rounds we count, with the same chat-prompt rule the context builder uses (3 per message + role
+ content + 3 priming):
- raw: the whole conversation so far plus the new question (no truncation);
- distilled: the 3 highest-priority experiences (problem / cause / solution, as the context
  builder places retrieved memories) plus the new question;
- window 10: the last 10 messages plus the new question (the sliding-window alternative).
The source's own numbers (character estimate, chars/4 + CJK/1.5) are printed next to ours,
and our texts are also counted with that estimate to show how far it is from exact.
"""

from __future__ import annotations

import argparse
import random
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from memory.services import tokens  # noqa: E402

PAIRS = [
    (
        "Database query timeout on the orders report",
        "a missing composite index on (tenant_id, created_at)",
        "Checked the query plan, found the sequential scan, created the composite index; the report runs in 0.4 s.",
    ),
    (
        "API returns 502 errors under load",
        "the upstream pool has only 10 connections",
        "Raised the pool to 50, added a 2 s connect timeout and a circuit breaker; errors stopped.",
    ),
    (
        "Nightly import job fails at 02:00",
        "the S3 credentials rotated and the job kept the old ones",
        "Switched the job to the instance role, removed static keys, re-ran the import successfully.",
    ),
    (
        "Memory usage of the worker keeps growing",
        "a module-level cache without eviction",
        "Replaced the dict with an LRU cache of 10,000 entries; memory is flat at 420 MB.",
    ),
    (
        "Login page is slow for some users",
        "password hashing with 600,000 iterations on a small instance",
        "Moved auth to a larger instance and kept the iteration count; p95 login is 180 ms.",
    ),
    (
        "Emails are not delivered to Outlook users",
        "the SPF record misses the new mail provider",
        "Added the provider's include to SPF, set up DKIM and DMARC; delivery confirmed.",
    ),
    (
        "Disk on the database server is 95 % full",
        "WAL files kept by an abandoned replication slot",
        "Dropped the unused slot, WAL shrank by 80 GB; added an alert at 80 % disk.",
    ),
    (
        "Deploys take 25 minutes",
        "the Docker build re-installs every dependency each time",
        "Reordered the Dockerfile to cache the dependency layer; deploys take 6 minutes.",
    ),
    (
        "Search results are missing new products",
        "the indexing queue is stuck behind a poison message",
        "Moved the poison message to a dead-letter queue, added retries with backoff; index is current.",
    ),
    (
        "Config change did not take effect",
        "the service reads config only at start-up",
        "Restarted the pods with a rolling update and documented the reload procedure.",
    ),
    (
        "CI fails on the migration step with error 23505",
        "a data migration inserts a duplicate key",
        "Made the data migration idempotent with ON CONFLICT DO NOTHING; CI is green.",
    ),
    (
        "Websocket connections drop every 60 seconds",
        "the load balancer idle timeout is 60 s",
        "Raised the idle timeout to 300 s and added a 30 s ping; connections stay open.",
    ),
    (
        "Reports show times one hour off",
        "naive datetimes converted with the server's local zone",
        "Stored UTC everywhere and converted in the UI with the user's zone; times are right.",
    ),
    (
        "Celery tasks run twice",
        "visibility timeout shorter than the longest task",
        "Raised the visibility timeout to 2 hours and made the task idempotent with a key.",
    ),
    (
        "Payment webhook returns 400",
        "the signature check uses the parsed body instead of the raw bytes",
        "Verified the signature on the raw request body; webhooks are accepted.",
    ),
    (
        "Cache hit rate dropped to 20 %",
        "keys include a timestamp that changes every request",
        "Removed the timestamp from the cache key and set a 5 minute TTL; hit rate is back to 85 %.",
    ),
    (
        "Users get logged out after deploys",
        "the session secret is regenerated at start-up",
        "Moved the secret to the secrets manager so it survives deploys.",
    ),
    (
        "Large CSV export crashes the web process",
        "the whole file is built in memory",
        "Streamed the CSV row by row with a generator response; memory stays under 100 MB.",
    ),
    (
        "TLS certificate expired on the API domain",
        "the renewal cron job was on a decommissioned host",
        "Moved renewal to the ingress controller with automatic ACME and added an expiry alert.",
    ),
    (
        "Slow page loads after the frontend release",
        "the bundle grew to 4 MB with an unused chart library",
        "Removed the library, enabled code splitting; the bundle is 900 KB and loads in 1.2 s.",
    ),
]
FOLLOW_UPS = [
    "Does this also apply to the staging environment?",
    "How do we make sure this does not happen again?",
    "Can you write that down in the runbook?",
    "Is there any risk in rolling this out during business hours?",
]
THEIRS = {
    10: (1121, 379, 66.2),
    20: (2124, 339, 84.0),
    30: (3320, 379, 88.6),
    40: (4380, 339, 92.3),
    50: (5387, 443, 91.8),
    60: (6168, 330, 94.6),
    70: (7054, 379, 94.6),
    80: (8257, 339, 95.9),
    90: (9524, 379, 96.0),
    100: (10972, 339, 96.9),
}


def experience_text(pair: tuple[str, str, str]) -> str:
    problem, cause, solution = pair
    return f"Relevant past experience: Problem: {problem}. Cause: {cause}. Solution: {solution}"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seed", type=int, default=11)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    counter = tokens.TokenCounter("o200k_base")

    def naive(messages: list[dict[str, str]]) -> int:
        return tokens.REPLY_PRIMING + sum(
            tokens.MESSAGE_OVERHEAD + tokens.naive_estimate(m["role"]) + tokens.naive_estimate(m["content"])
            for m in messages
        )

    history: list[dict[str, str]] = []
    seen: Counter[int] = Counter()
    rows = []
    for round_no in range(1, 101):
        index = rng.randrange(len(PAIRS))
        problem, cause, solution = PAIRS[index]
        seen[index] += 1
        history.append({"role": "user", "content": f"{problem}. What should we do?"})
        history.append({"role": "assistant", "content": f"The cause is {cause}. {solution}"})
        if rng.random() < 0.15:
            history.append({"role": "user", "content": rng.choice(FOLLOW_UPS)})
            history.append(
                {
                    "role": "assistant",
                    "content": f"Yes: for '{problem.lower()}' the same fix applies; "
                    "I added it to the runbook with the check we ran.",
                }
            )
        if round_no % 10:
            continue
        question = {
            "role": "user",
            "content": f"{PAIRS[rng.randrange(len(PAIRS))][0]} again. What should we do?",
        }
        raw = [*history, question]
        # the 3 highest-priority experiences: most often confirmed solutions (ties: most recent first)
        top = [i for i, _ in sorted(seen.items(), key=lambda kv: -kv[1])[:3]]
        distilled = [{"role": "system", "content": experience_text(PAIRS[i])} for i in top] + [question]
        window = [*history[-10:], question]
        raw_t, dist_t, win_t = (
            counter.prompt_tokens(raw),
            counter.prompt_tokens(distilled),
            counter.prompt_tokens(window),
        )
        rows.append((round_no, raw_t, dist_t, win_t, naive(raw), naive(distilled)))

    print(
        "| rounds | theirs raw (est.) | theirs distilled (est.) | theirs savings | ours raw (exact) | ours distilled (exact) "
        "| ours savings | ours window-10 (exact) | chars/4 rule on our raw | rule error vs exact |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for round_no, raw_t, dist_t, win_t, naive_raw, _naive_dist in rows:
        t_raw, t_dist, t_sav = THEIRS[round_no]
        print(
            f"| {round_no} | {t_raw:,} | {t_dist:,} | {t_sav:.1f} % | {raw_t:,} | {dist_t:,} | "
            f"{(1 - dist_t / raw_t) * 100:.1f} % | {win_t:,} | {naive_raw:,} | {(naive_raw - raw_t) / raw_t * 100:+.1f} % |"
        )


if __name__ == "__main__":
    main()
