"""The global message pool: SQLAlchemy models, the store API, Alembic migrations.

Import from here: `from optico.pool import open_store, Store, JobStatus`.
"""

from optico.pool.db import default_database_url, langgraph_url, make_engine
from optico.pool.records import AgentMessage, Event, JobRecord, JobStatus
from optico.pool.schema import SchemaError, current_revision, ensure_current, head_revision, upgrade
from optico.pool.store import SqlStore, Store, StoreError, open_store

__all__ = [
    "AgentMessage", "Event", "JobRecord", "JobStatus", "SchemaError", "SqlStore", "Store", "StoreError",
    "current_revision", "default_database_url", "ensure_current", "head_revision", "langgraph_url",
    "make_engine", "open_store", "upgrade",
]
