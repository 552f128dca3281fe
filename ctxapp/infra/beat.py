"""Celery beat's scheduler, made to send again by itself once its broker is back.

Celery beat opens one producer, and its broker connection, for its whole life. When that
connection dies under it (the embedded mode's broker is PostgreSQL: a `pg_ctl restart` is
enough), the producer's publish retry revives its exchange on a closed channel, and every later
run of every entry fails with `SchedulingError: Couldn't apply scheduled task …: channel
disconnected`, for minutes, while the worker and the web server are long reconnected. This
scheduler forgets the producer and its connection after a send failed, so the next due entry
opens new ones (celery.beat.Scheduler creates both lazily, as after `close()`).

Selected by CELERY_BEAT_SCHEDULER (ctxapp/settings.py).
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any

from celery.beat import PersistentScheduler, SchedulingError

logger = logging.getLogger(__name__)


class ReconnectingScheduler(PersistentScheduler):
    def apply_async(self, entry: Any, producer: Any = None, advance: bool = True, **kwargs: Any) -> Any:
        try:
            return super().apply_async(entry, producer=producer, advance=advance, **kwargs)
        except SchedulingError:
            self.publisher_forget()
            raise

    def publisher_forget(self) -> None:
        """Drop the cached producer and connection: the next send opens a new connection."""
        cached: dict[str, Any] = self.__dict__  # where functools.cached_property keeps its values
        cached.pop("producer", None)
        connection = cached.pop("connection", None)
        if connection is not None:
            with contextlib.suppress(Exception):  # it is dead already; releasing only frees it
                connection.release()
            logger.warning("beat: a send failed; the next one opens a new broker connection")
