"""optico_schedule_ticks.job_key: a random key per tick for its retune job's Idempotency-Key;
optico_schedules.run_requested: a tick fired by `POST .../run` is recorded as manual, not cron.

A key built from the tick id was not unique for all time: SQLite hands a removed schedule's tick ids
out again, and the new schedule's first tune adopted the old schedule's job. Ticks from before this
revision keep the old key (NULL here), so a tick in flight across the upgrade starts no second job.

Both columns are added in place (ALTER TABLE ... ADD/DROP COLUMN), never by rebuilding the table
(Alembic's SQLite batch mode): with foreign keys on, dropping the old optico_schedules would
cascade to every tick and schedule event. Hence a literal default ('0': false on both backends),
which SQLite accepts in ADD COLUMN where it refuses an expression.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-27
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("optico_schedule_ticks", sa.Column("job_key", sa.String(64), nullable=True))
    op.add_column("optico_schedules", sa.Column("run_requested", sa.Boolean(), nullable=False, server_default="0"))


def downgrade() -> None:
    # Plain SQL: SQLite (3.35 on) and PostgreSQL drop a column in place; a rebuild would cascade.
    op.execute("ALTER TABLE optico_schedules DROP COLUMN run_requested")
    op.execute("ALTER TABLE optico_schedule_ticks DROP COLUMN job_key")
