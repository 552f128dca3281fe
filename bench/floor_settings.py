"""Settings of the framework-floor benchmark (bench/floor_urls.py): ctxapp's, plus one bench route.

Only `bench/bench_peers.py --only floor` uses it; ctxapp's own URLs never mount the floor."""

from ctxapp.settings import *  # noqa: F403

ROOT_URLCONF = "bench.floor_urls"
