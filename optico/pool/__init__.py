"""The global message pool: SQLAlchemy models, the store API, Alembic migrations, the job lifecycle.

Import from here: `from optico.pool import open_store, Store, JobStatus`.
"""

from optico.pool.contract import IdempotencyConflict, Store, StoreError
from optico.pool.db import default_database_url, langgraph_url, make_engine
from optico.pool.lifecycle import IllegalTransition, JobStatus, LeaseHeld, LeaseLost, LifecycleError
from optico.pool.records import AgentMessage, JobRecord, StoredEvent, TokenRecord
from optico.pool.schema import SchemaError, current_revision, ensure_current, head_revision, upgrade
from optico.pool.store import SqlStore, open_store

__all__ = [
    "AgentMessage", "IdempotencyConflict", "IllegalTransition", "JobRecord", "JobStatus", "LeaseHeld", "LeaseLost",
    "LifecycleError", "SchemaError", "SqlStore", "Store", "StoreError", "StoredEvent", "TokenRecord",
    "current_revision", "default_database_url", "ensure_current", "head_revision", "langgraph_url", "make_engine",
    "open_store", "upgrade",
]
