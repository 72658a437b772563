"""optico_trials.attempt_started_at, attempt_gpus, lost_gpu_seconds: the GPU time of launches that
ended without a result.

A trial's gpu_seconds came from its last launch only: a launch whose worker died, stopped or was
cancelled spent GPU time that neither the GPU-hour budget nor the report counted. The running launch's
start and GPU count are kept, and such a launch adds its time (up to its worker's last heartbeat) to
lost_gpu_seconds. Added in place with literal defaults, as 0005 explains.

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-30
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("optico_trials", sa.Column("attempt_started_at", sa.DateTime(timezone=True), nullable=True))
    op.add_column("optico_trials", sa.Column("attempt_gpus", sa.Integer(), nullable=False, server_default="0"))
    op.add_column("optico_trials", sa.Column("lost_gpu_seconds", sa.Float(), nullable=False, server_default="0"))


def downgrade() -> None:
    for column in ("lost_gpu_seconds", "attempt_gpus", "attempt_started_at"):
        op.execute(f"ALTER TABLE optico_trials DROP COLUMN {column}")
