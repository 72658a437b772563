"""The global message pool: SQLAlchemy models, the store API, Alembic migrations, the job lifecycle.

Import from here: `from optico.pool import open_store, Store, JobStatus`.
"""

from optico.pool.contract import IdempotencyConflict, Store, StoreError, TickBusy, TickLost
from optico.pool.db import default_database_url, langgraph_url, make_engine
from optico.pool.lifecycle import IllegalTransition, JobStatus, LeaseHeld, LeaseLost, LifecycleError
from optico.pool.records import (
    AgentMessage,
    Incumbent,
    JobRecord,
    ScheduleRecord,
    StoredEvent,
    StoredScheduleEvent,
    TickRecord,
    TokenRecord,
)
from optico.pool.schema import SchemaError, current_revision, ensure_current, head_revision, upgrade
from optico.pool.store import SqlStore, open_store

__all__ = [
    "AgentMessage", "IdempotencyConflict", "IllegalTransition", "JobRecord", "JobStatus", "LeaseHeld", "LeaseLost",
    "Incumbent", "LifecycleError", "ScheduleRecord", "SchemaError", "SqlStore", "Store", "StoreError", "StoredEvent",
    "StoredScheduleEvent", "TickBusy", "TickLost", "TickRecord", "TokenRecord",
    "current_revision", "default_database_url", "ensure_current", "head_revision", "langgraph_url", "make_engine",
    "open_store", "upgrade",
]
