"""Nightly retuning: schedules, their ticks (the history) and their event log.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-26

- optico_schedules: name, spec, cron, budget, always_retune, webhook, the next cron slot, the tick
  lock, and the incumbent (best configuration, its MFU, the framework fingerprint it was measured under).
- optico_schedule_ticks: one row per firing (unique per schedule and cron slot).
- optico_schedule_events: a per-schedule event log, numbered 1.. per schedule.
Trials already carry their fingerprint (optico_trials.fingerprint, since 0001).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _created() -> sa.Column:
    return sa.Column("created_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now())


def upgrade() -> None:
    op.create_table(
        "optico_schedules",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("name", sa.String(128), nullable=False),
        sa.Column("spec", sa.JSON(), nullable=False),
        sa.Column("workload_key", sa.String(64), nullable=False),
        sa.Column("cron", sa.String(128), nullable=False),
        sa.Column("max_trials", sa.Integer(), nullable=False),
        sa.Column("always_retune", sa.Boolean(), nullable=False, server_default=sa.false()),
        sa.Column("webhook_url", sa.Text(), nullable=True),
        _created(),
        sa.Column("next_fire_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("last_tick_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("locked_by", sa.String(255), nullable=True),
        sa.Column("locked_until", sa.DateTime(timezone=True), nullable=True),
        sa.Column("incumbent_strategy", sa.JSON(none_as_null=True), nullable=True),
        sa.Column("incumbent_mfu", sa.Float(), nullable=True),
        sa.Column("incumbent_fingerprint", sa.JSON(none_as_null=True), nullable=True),
        sa.Column("incumbent_job_id", sa.Integer(), nullable=True),
        sa.Column("incumbent_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_optico_schedules")),
        sa.UniqueConstraint("name", name=op.f("uq_optico_schedules_name")),
    )
    op.create_index(op.f("ix_optico_schedules_next_fire_at"), "optico_schedules", ["next_fire_at"])
    op.create_index(op.f("ix_optico_schedules_workload_key"), "optico_schedules", ["workload_key"])

    op.create_table(
        "optico_schedule_ticks",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("schedule_id", sa.Integer(), nullable=False),
        sa.Column("trigger", sa.String(16), nullable=False),
        sa.Column("due_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("outcome", sa.String(16), nullable=True),
        sa.Column("worker", sa.String(255), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("fingerprint", sa.JSON(none_as_null=True), nullable=True),
        sa.Column("fingerprint_changed", sa.Boolean(), nullable=True),
        sa.Column("mfu_before", sa.Float(), nullable=True),
        sa.Column("mfu_after", sa.Float(), nullable=True),
        sa.Column("noise_pct", sa.Float(), nullable=True),
        sa.Column("regression_pct", sa.Float(), nullable=True),
        sa.Column("retune_job_id", sa.Integer(), nullable=True),
        sa.Column("new_best_mfu", sa.Float(), nullable=True),
        sa.Column("report", sa.JSON(), nullable=False),
        sa.ForeignKeyConstraint(["schedule_id"], ["optico_schedules.id"], ondelete="CASCADE",
                                name=op.f("fk_optico_schedule_ticks_schedule_id_optico_schedules")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_optico_schedule_ticks")),
        sa.UniqueConstraint("schedule_id", "due_at", name=op.f("uq_optico_schedule_ticks_schedule_id_due_at")),
    )
    op.create_index(op.f("ix_optico_schedule_ticks_schedule_id"), "optico_schedule_ticks", ["schedule_id"])
    op.create_index(op.f("ix_optico_schedule_ticks_status"), "optico_schedule_ticks", ["status"])
    op.create_index(op.f("ix_optico_schedule_ticks_retune_job_id"), "optico_schedule_ticks", ["retune_job_id"])

    op.create_table(
        "optico_schedule_events",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("schedule_id", sa.Integer(), nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("kind", sa.String(64), nullable=False),
        sa.Column("payload", sa.JSON(), nullable=False),
        _created(),
        sa.ForeignKeyConstraint(["schedule_id"], ["optico_schedules.id"], ondelete="CASCADE",
                                name=op.f("fk_optico_schedule_events_schedule_id_optico_schedules")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_optico_schedule_events")),
        sa.UniqueConstraint("schedule_id", "seq", name=op.f("uq_optico_schedule_events_schedule_id_seq")),
    )


def downgrade() -> None:
    op.drop_table("optico_schedule_events")
    op.drop_index(op.f("ix_optico_schedule_ticks_retune_job_id"), table_name="optico_schedule_ticks")
    op.drop_index(op.f("ix_optico_schedule_ticks_status"), table_name="optico_schedule_ticks")
    op.drop_index(op.f("ix_optico_schedule_ticks_schedule_id"), table_name="optico_schedule_ticks")
    op.drop_table("optico_schedule_ticks")
    op.drop_index(op.f("ix_optico_schedules_workload_key"), table_name="optico_schedules")
    op.drop_index(op.f("ix_optico_schedules_next_fire_at"), table_name="optico_schedules")
    op.drop_table("optico_schedules")
