"""optico_trials.interruptions: launches of a trial that its own worker interrupted cleanly (a
shutdown, a rolling restart, Ctrl-C), counted apart from `attempts`.

A trial is re-run under its index after its worker died, once; a second death records it lost. A
clean interruption is not a death: without this count, two rolling restarts during one long trial
recorded it lost. Added in place with a literal default, as 0005 explains.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-28
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("optico_trials", sa.Column("interruptions", sa.Integer(), nullable=False, server_default="0"))


def downgrade() -> None:
    op.execute("ALTER TABLE optico_trials DROP COLUMN interruptions")
