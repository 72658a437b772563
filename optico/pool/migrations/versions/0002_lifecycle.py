"""Job lifecycle and service: leases, live budget, idempotency, per-job event sequence, tokens.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-24

- optico_jobs: origin, started_at, finished_at, lease_owner, lease_expires_at, takeovers,
  max_trials and gpu_hours (the live budget, filled from each job's spec), idempotency_key,
  spec_hash; status 'completed' becomes 'succeeded'.
- optico_trials: attempts, wall_seconds.
- optico_messages: prompt_tokens, completion_tokens, cost_usd (copied out of LLM call content).
- optico_events: seq, numbered 1.. per job in id order, unique per job.
- optico_tokens: new.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _as_dict(value: object) -> dict:
    if isinstance(value, dict):
        return value
    if isinstance(value, str):
        try:
            loaded = json.loads(value)
        except ValueError:
            return {}
        return loaded if isinstance(loaded, dict) else {}
    return {}


def upgrade() -> None:
    conn = op.get_bind()
    with op.batch_alter_table("optico_jobs") as batch:
        batch.add_column(sa.Column("origin", sa.String(16), nullable=False, server_default="queue"))
        batch.add_column(sa.Column("started_at", sa.DateTime(timezone=True), nullable=True))
        batch.add_column(sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True))
        batch.add_column(sa.Column("lease_owner", sa.String(255), nullable=True))
        batch.add_column(sa.Column("lease_expires_at", sa.DateTime(timezone=True), nullable=True))
        batch.add_column(sa.Column("takeovers", sa.Integer(), nullable=False, server_default="0"))
        batch.add_column(sa.Column("max_trials", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("gpu_hours", sa.Float(), nullable=True))
        batch.add_column(sa.Column("idempotency_key", sa.String(255), nullable=True))
        batch.add_column(sa.Column("spec_hash", sa.String(64), nullable=False, server_default=""))
        batch.create_index(batch.f("ix_optico_jobs_lease_expires_at"), ["lease_expires_at"])
        batch.create_unique_constraint(batch.f("uq_optico_jobs_idempotency_key"), ["idempotency_key"])

    jobs = sa.table("optico_jobs", sa.column("id", sa.Integer), sa.column("spec", sa.JSON),
                    sa.column("status", sa.String), sa.column("max_trials", sa.Integer),
                    sa.column("gpu_hours", sa.Float))
    for job_id, spec in conn.execute(sa.select(jobs.c.id, jobs.c.spec)).all():
        budget = _as_dict(_as_dict(spec).get("budget"))
        conn.execute(jobs.update().where(jobs.c.id == job_id).values(
            max_trials=int(budget.get("max_trials") or 20), gpu_hours=budget.get("gpu_hours")))
    conn.execute(jobs.update().where(jobs.c.status == "completed").values(status="succeeded"))
    with op.batch_alter_table("optico_jobs") as batch:
        batch.alter_column("max_trials", existing_type=sa.Integer(), nullable=False)

    with op.batch_alter_table("optico_trials") as batch:
        batch.add_column(sa.Column("attempts", sa.Integer(), nullable=False, server_default="1"))
        batch.add_column(sa.Column("wall_seconds", sa.Float(), nullable=True))

    with op.batch_alter_table("optico_messages") as batch:
        batch.add_column(sa.Column("prompt_tokens", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("completion_tokens", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("cost_usd", sa.Float(), nullable=True))

    op.drop_index("ix_optico_events_job_id_id", table_name="optico_events")
    with op.batch_alter_table("optico_events") as batch:
        batch.add_column(sa.Column("seq", sa.Integer(), nullable=True))
    events = sa.table("optico_events", sa.column("id", sa.Integer), sa.column("job_id", sa.Integer),
                      sa.column("seq", sa.Integer))
    counters: dict[int, int] = {}
    for event_id, job_id in conn.execute(sa.select(events.c.id, events.c.job_id).order_by(events.c.id)).all():
        counters[job_id] = counters.get(job_id, 0) + 1
        conn.execute(events.update().where(events.c.id == event_id).values(seq=counters[job_id]))
    with op.batch_alter_table("optico_events") as batch:
        batch.alter_column("seq", existing_type=sa.Integer(), nullable=False)
        batch.create_unique_constraint(batch.f("uq_optico_events_job_id_seq"), ["job_id", "seq"])

    op.create_table(
        "optico_tokens",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("name", sa.String(128), nullable=False),
        sa.Column("scope", sa.String(16), nullable=False),
        sa.Column("token_hash", sa.String(64), nullable=False),
        sa.Column("prefix", sa.String(16), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
        sa.Column("last_used_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_optico_tokens")),
        sa.UniqueConstraint("name", name=op.f("uq_optico_tokens_name")),
        sa.UniqueConstraint("token_hash", name=op.f("uq_optico_tokens_token_hash")),
    )


def downgrade() -> None:
    op.drop_table("optico_tokens")
    with op.batch_alter_table("optico_events") as batch:
        batch.drop_constraint("uq_optico_events_job_id_seq", type_="unique")
        batch.drop_column("seq")
    op.create_index("ix_optico_events_job_id_id", "optico_events", ["job_id", "id"])
    with op.batch_alter_table("optico_messages") as batch:
        batch.drop_column("cost_usd")
        batch.drop_column("completion_tokens")
        batch.drop_column("prompt_tokens")
    with op.batch_alter_table("optico_trials") as batch:
        batch.drop_column("wall_seconds")
        batch.drop_column("attempts")
    jobs = sa.table("optico_jobs", sa.column("status", sa.String))
    op.get_bind().execute(jobs.update().where(jobs.c.status == "succeeded").values(status="completed"))
    with op.batch_alter_table("optico_jobs") as batch:
        batch.drop_constraint("uq_optico_jobs_idempotency_key", type_="unique")
        batch.drop_index("ix_optico_jobs_lease_expires_at")
        for column in ("spec_hash", "idempotency_key", "gpu_hours", "max_trials", "takeovers", "lease_expires_at",
                       "lease_owner", "finished_at", "started_at", "origin"):
            batch.drop_column(column)
