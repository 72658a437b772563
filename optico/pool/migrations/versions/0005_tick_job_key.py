"""optico_schedule_ticks.job_key: a random key per tick for its retune job's Idempotency-Key;
optico_schedules.run_requested: a tick fired by `POST .../run` is recorded as manual, not cron.

A key built from the tick id was not unique for all time: SQLite hands a removed schedule's tick ids
out again, and the new schedule's first tune adopted the old schedule's job. Ticks from before this
revision keep the old key (NULL here), so a tick in flight across the upgrade starts no second job.

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
    with op.batch_alter_table("optico_schedule_ticks") as batch:
        batch.add_column(sa.Column("job_key", sa.String(64), nullable=True))
    with op.batch_alter_table("optico_schedules") as batch:
        batch.add_column(sa.Column("run_requested", sa.Boolean(), nullable=False, server_default=sa.false()))


def downgrade() -> None:
    with op.batch_alter_table("optico_schedules") as batch:
        batch.drop_column("run_requested")
    with op.batch_alter_table("optico_schedule_ticks") as batch:
        batch.drop_column("job_key")
