"""One-row model lookups of the cognition hot paths, their SQL compiled once per connection.

Django compiles a queryset to SQL on every evaluation. For the state row a checkpoint write locks
(a join, an annotation, deferred fields) and the row a state read fetches, that was 0.5 to 0.9 ms
of Python per call, about as long as the query itself (issue 15). `first_compiled` compiles the
queryset once, with stand-in values for its arguments, and afterwards only runs the SQL and builds
the instances as Django's own iterator does (the model, its `select_related` objects, its
annotations), so what callers get is unchanged.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from django.db import DEFAULT_DB_ALIAS, connections
from django.db.models import Model, QuerySet
from django.db.models.query import get_related_populators

from memory.prepared import prepared_cursor

M = TypeVar("M", bound=Model)

# Stand-ins for the arguments while compiling: ids no row has, found back among the parameters.
_STAND_INS = (-7_301_001, -7_301_002, -7_301_003, -7_301_004)


@dataclass(frozen=True)
class _Compiled:
    sql: str
    order: tuple[int, ...]  # the argument behind each SQL parameter
    compiler: Any  # the SQLCompiler, for its converters and select list
    init_list: list[str]
    start: int
    end: int
    populators: list[Any]
    annotations: dict[str, int]


def first_compiled(key: str, build: Callable[..., QuerySet[M]], *args: int) -> M | None:
    """`build(*args).first()`, with build's SQL compiled once per connection under `key`.

    `build` must use its (integer) arguments only as values compared in SQL, and nothing else
    that changes between calls. If its SQL does not take exactly them as parameters, every call
    falls back to `.first()`.
    """
    connection = connections[DEFAULT_DB_ALIAS]  # per thread, as Django's connections are
    cache: dict[str, _Compiled | None] = connection.__dict__.setdefault("_cognition_compiled", {})
    if key not in cache:
        cache[key] = _compile(build(*_STAND_INS[: len(args)]), len(args))
    compiled = cache[key]
    if compiled is None:
        return build(*args).first()
    with prepared_cursor() as cursor:
        cursor.execute(compiled.sql, [args[i] for i in compiled.order])
        fetched = cursor.fetchone()
    if fetched is None:
        return None
    row = next(iter(compiled.compiler.results_iter([[fetched]])))  # with the fields' converters
    obj: M = compiled.compiler.klass_info["model"].from_db(
        DEFAULT_DB_ALIAS, compiled.init_list, row[compiled.start : compiled.end]
    )
    for populator in compiled.populators:
        populator.populate(row, obj)
    for name, position in compiled.annotations.items():
        setattr(obj, name, row[position])
    return obj


def _compile(queryset: QuerySet[Any], arity: int) -> _Compiled | None:
    if not queryset.ordered:  # as .first() does
        queryset = queryset.order_by("pk")
    compiler = queryset[:1].query.get_compiler(using=queryset.db)
    sql, params = compiler.as_sql()
    stand_ins = _STAND_INS[:arity]
    if queryset.db != DEFAULT_DB_ALIAS or sorted(params) != sorted(stand_ins):
        return None
    select, klass_info = compiler.select, compiler.klass_info
    start, end = klass_info["select_fields"][0], klass_info["select_fields"][-1] + 1
    return _Compiled(
        sql=sql,
        order=tuple(stand_ins.index(value) for value in params),
        compiler=compiler,
        init_list=[column[0].target.attname for column in select[start:end]],
        start=start,
        end=end,
        populators=get_related_populators(klass_info, select, queryset.db),  # type: ignore[call-arg]  # stubs of Django 6
        annotations=dict(compiler.annotation_col_map),
    )
