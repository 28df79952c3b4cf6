"""A workspace's SQLite MLflow store copied into PostgreSQL, table by table (``stores.postgres``: the
first `make serve` on PostgreSQL of a workspace that `make demo` or the CLI already used).

MLflow has no command that moves a store between databases; both schemas come from the same
MLflow (its own migrations bring each to the installed version first), so every row is copied as
it is, in the order of the foreign keys, in one transaction, and the counts are compared after.
"""

from __future__ import annotations

from pathlib import Path

from fedunlearn.errors import InputError

CHUNK_ROWS = 1000
SKIP = {"alembic_version"}  # both at the installed MLflow's head by then


def _open_store(uri: str) -> None:
    """MLflow's SQL store over ``uri``: creates or migrates its tables to the installed version."""
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

    artifacts = Path(uri.removeprefix("sqlite:///")).parent / "artifacts" if uri.startswith("sqlite") else Path(".")
    store = SqlAlchemyStore(uri, str(artifacts.resolve()))
    store.engine.dispose()


def copy_mlflow_store(source: str, target: str) -> dict[str, int]:
    """Copy every row of the MLflow store ``source`` (a SQLite URI) into the empty store ``target``; the
    rows per table. The target holding a run or a registered model already is refused."""
    import sqlalchemy as sa

    for uri in (source, target):
        _open_store(uri)
    reader, writer = sa.create_engine(source), sa.create_engine(target)
    try:
        old, new = sa.MetaData(), sa.MetaData()
        old.reflect(reader)
        new.reflect(writer)
        with writer.begin() as out:
            taken = [name for name in ("runs", "registered_models")
                     if out.execute(sa.select(sa.func.count()).select_from(new.tables[name])).scalar()]
            if taken:
                raise InputError(f"the MLflow database {writer.url.render_as_string(hide_password=True)} already holds "
                                 f"{' and '.join(taken)}: the workspace's SQLite store is not copied over them. Move "
                                 "mlflow/mlflow.db aside, or serve on SQLite (SERVE_DB=sqlite)")
            tables = [t for t in new.sorted_tables if t.name not in SKIP]
            for table in reversed(tables):
                out.execute(table.delete())  # the rows MLflow made in the new store (its default experiment)
            with reader.connect() as source_rows:
                counts = {t.name: _copy_table(source_rows, old.tables.get(t.name), t, out) for t in tables}
            _reset_sequences(out, tables)
            _check_counts(out, tables, counts)
        return counts
    finally:
        reader.dispose()
        writer.dispose()


def _copy_table(source, old_table, new_table, out) -> int:
    import sqlalchemy as sa

    if old_table is None:
        return 0
    columns = [c.name for c in new_table.columns if c.name in old_table.columns]
    result = source.execution_options(stream_results=True).execute(sa.select(*(old_table.c[c] for c in columns)))
    copied = 0
    while rows := result.fetchmany(CHUNK_ROWS):
        out.execute(new_table.insert(), [dict(zip(columns, row)) for row in rows])
        copied += len(rows)
    return copied


def _reset_sequences(out, tables) -> None:
    """Integer keys the database generates (serial or identity) continue after the copied ones."""
    import sqlalchemy as sa

    for table in tables:
        for column in table.primary_key.columns:
            sequence = out.execute(sa.text("SELECT pg_get_serial_sequence(:t, :c)"),
                                   {"t": f'"{table.name}"', "c": column.name}).scalar()
            if sequence:
                out.execute(sa.text(f'SELECT setval(:s, COALESCE(MAX("{column.name}"), 1), MAX("{column.name}") IS '
                                    f'NOT NULL) FROM "{table.name}"'), {"s": sequence})


def _check_counts(out, tables, counts: dict[str, int]) -> None:
    import sqlalchemy as sa

    for table in tables:
        found = out.execute(sa.select(sa.func.count()).select_from(table)).scalar()
        if found != counts[table.name]:
            raise InputError(f"copying the MLflow store: table {table.name} has {found} rows after the copy, "
                             f"{counts[table.name]} before; nothing was changed")
