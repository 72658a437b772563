"""Initial pool schema: workloads, jobs, trials, messages, events.

Revision ID: 0001
Revises:
Create Date: 2026-11-22

Hand-written to match optico/pool/models.py; tests/pool checks that autogenerate finds
no difference between the two on SQLite and PostgreSQL.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _ts(name: str, nullable: bool = False, now: bool = True) -> sa.Column:
    return sa.Column(name, sa.DateTime(timezone=True), nullable=nullable,
                     server_default=sa.func.now() if now else None)


def _json(name: str, nullable: bool = False) -> sa.Column:
    return sa.Column(name, sa.JSON(none_as_null=nullable), nullable=nullable)


def upgrade() -> None:
    op.create_table(
        "optico_workloads",
        sa.Column("key", sa.String(64), nullable=False),
        sa.Column("description", sa.Text(), nullable=False),
        _json("workload"),
        _ts("created_at"),
        sa.PrimaryKeyConstraint("key", name=op.f("pk_optico_workloads")),
    )
    op.create_table(
        "optico_jobs",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("name", sa.String(255), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("workload_key", sa.String(64), nullable=False),
        _json("spec"),
        _ts("created_at"),
        _ts("updated_at"),
        _ts("heartbeat_at", nullable=True, now=False),
        sa.Column("stop_reason", sa.Text(), nullable=True),
        sa.Column("best_trial_id", sa.Integer(), nullable=True),
        sa.ForeignKeyConstraint(["workload_key"], ["optico_workloads.key"], ondelete="RESTRICT",
                                name=op.f("fk_optico_jobs_workload_key_optico_workloads")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_optico_jobs")),
    )
    op.create_index(op.f("ix_optico_jobs_status"), "optico_jobs", ["status"])
    op.create_index(op.f("ix_optico_jobs_workload_key"), "optico_jobs", ["workload_key"])
    op.create_table(
        "optico_trials",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("job_id", sa.Integer(), nullable=False),
        sa.Column("index", sa.Integer(), nullable=False),
        sa.Column("signature", sa.String(64), nullable=False),
        _json("strategy"),
        sa.Column("status", sa.String(16), nullable=False),
        _json("metrics", nullable=True),
        _json("failure", nullable=True),
        sa.Column("rationale", sa.Text(), nullable=False),
        sa.Column("gpu_seconds", sa.Float(), nullable=False),
        _json("fingerprint"),
        sa.Column("log_path", sa.Text(), nullable=True),
        sa.Column("log_excerpt", sa.Text(), nullable=False),
        _ts("started_at"),
        _ts("finished_at", nullable=True, now=False),
        sa.ForeignKeyConstraint(["job_id"], ["optico_jobs.id"], ondelete="CASCADE",
                                name=op.f("fk_optico_trials_job_id_optico_jobs")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_optico_trials")),
        sa.UniqueConstraint("job_id", "index", name=op.f("uq_optico_trials_job_id_index")),
    )
    op.create_index(op.f("ix_optico_trials_signature"), "optico_trials", ["signature"])
    op.create_table(
        "optico_messages",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("job_id", sa.Integer(), nullable=False),
        sa.Column("iteration", sa.Integer(), nullable=False),
        sa.Column("agent", sa.String(64), nullable=False),
        sa.Column("kind", sa.String(64), nullable=False),
        _json("content"),
        sa.Column("text", sa.Text(), nullable=False),
        _ts("created_at"),
        sa.ForeignKeyConstraint(["job_id"], ["optico_jobs.id"], ondelete="CASCADE",
                                name=op.f("fk_optico_messages_job_id_optico_jobs")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_optico_messages")),
        sa.UniqueConstraint("job_id", "iteration", "agent", "kind",
                            name=op.f("uq_optico_messages_job_id_iteration_agent_kind")),
    )
    op.create_table(
        "optico_events",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("job_id", sa.Integer(), nullable=False),
        sa.Column("kind", sa.String(64), nullable=False),
        _json("payload"),
        _ts("created_at"),
        sa.ForeignKeyConstraint(["job_id"], ["optico_jobs.id"], ondelete="CASCADE",
                                name=op.f("fk_optico_events_job_id_optico_jobs")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_optico_events")),
    )
    op.create_index("ix_optico_events_job_id_id", "optico_events", ["job_id", "id"])


def downgrade() -> None:
    op.drop_table("optico_events")
    op.drop_table("optico_messages")
    op.drop_table("optico_trials")
    op.drop_table("optico_jobs")
    op.drop_table("optico_workloads")
