"""optico_jobs.best_mfu: the best trial's MFU on the job row, indexed, so job lists sort by it in SQL.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-24
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _mfu(metrics: object) -> float | None:
    if isinstance(metrics, str):
        try:
            metrics = json.loads(metrics)
        except ValueError:
            return None
    value = metrics.get("mfu") if isinstance(metrics, dict) else None
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def upgrade() -> None:
    with op.batch_alter_table("optico_jobs") as batch:
        batch.add_column(sa.Column("best_mfu", sa.Float(), nullable=True))
        batch.create_index(batch.f("ix_optico_jobs_best_mfu"), ["best_mfu"])
    conn = op.get_bind()
    jobs = sa.table("optico_jobs", sa.column("id", sa.Integer), sa.column("best_trial_id", sa.Integer),
                    sa.column("best_mfu", sa.Float))
    trials = sa.table("optico_trials", sa.column("id", sa.Integer), sa.column("metrics", sa.JSON))
    pairs = conn.execute(sa.select(jobs.c.id, trials.c.metrics).join(trials, trials.c.id == jobs.c.best_trial_id)).all()
    for job_id, metrics in pairs:
        conn.execute(jobs.update().where(jobs.c.id == job_id).values(best_mfu=_mfu(metrics)))


def downgrade() -> None:
    with op.batch_alter_table("optico_jobs") as batch:
        batch.drop_index("ix_optico_jobs_best_mfu")
        batch.drop_column("best_mfu")
