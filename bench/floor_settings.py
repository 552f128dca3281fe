"""Settings of the framework-floor benchmarks (bench/floor_urls.py): ctxapp's, plus the floor routes.

Only `bench/bench_peers.py --only floor` and `bench/bench_cost.py` use them; ctxapp's own URLs
never mount the floor."""

from ctxapp.settings import *  # noqa: F403

ROOT_URLCONF = "bench.floor_urls"
