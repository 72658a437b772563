"""A row planted in LangGraph's checkpoint tables executes nothing when a job resumes.

The planted payload is the one LangGraph's default serializer turns into a call of `os.system`
(checked below, so the test would catch a serializer that went back to rebuilding objects).
"""

from __future__ import annotations

import json
from pathlib import Path

import ormsgpack
import pytest
from langgraph.checkpoint.serde.jsonplus import EXT_CONSTRUCTOR_POS_ARGS, JsonPlusSerializer
from sqlalchemy import text

from optico.checkpoint import PlainDataSerializer, UnsafeCheckpoint, thread_config
from optico.launchers.base import Launcher
from optico.launchers.factory import build_launcher
from optico.pool import IllegalTransition, JobStatus
from optico.pool.store import SqlStore
from optico.runner import run_job
from optico.spec import load_spec
from tests.conftest import EXAMPLES


def payload(marker: Path) -> bytes:
    return ormsgpack.packb(ormsgpack.Ext(EXT_CONSTRUCTOR_POS_ARGS,
                                         ormsgpack.packb(("os", "system", [f"touch {marker}"]))))


def test_the_planted_payload_is_code_for_the_default_serializer_and_refused_by_ours(tmp_path: Path):
    marker = tmp_path / "pwned"
    JsonPlusSerializer().loads_typed(("msgpack", payload(marker)))
    assert marker.exists()  # the default serializer ran the command
    marker.unlink()
    for kind, blob in (("msgpack", payload(marker)), ("pickle", b"cos\nsystem\n(S'true'\ntR.")):
        with pytest.raises(UnsafeCheckpoint):
            PlainDataSerializer().loads_typed((kind, blob))
    assert not marker.exists()
    serde = PlainDataSerializer()
    plain = {"job_id": 3, "candidate": {"tp": 2}, "flags": [True, None, 1.5]}
    assert serde.loads_typed(serde.dumps_typed(plain)) == plain
    assert serde.loads_typed(("msgpack", ormsgpack.packb(plain))) == plain  # legacy plain rows still read


class StopAt(Launcher):
    """Interrupts the job (Ctrl-C) when trial `index` starts."""

    kind = "sim"

    def __init__(self, inner: Launcher, index: int):
        self.inner, self.index = inner, index

    async def launch(self, workload, strategy, *, trial_key, progress=None):
        if trial_key.endswith(f"trial{self.index}"):
            raise KeyboardInterrupt
        return await self.inner.launch(workload, strategy, trial_key=trial_key, progress=progress)


def plant(store: SqlStore, job_id: int, marker: Path) -> None:
    """A pending write of the job's latest checkpoint whose value is code for the default serializer."""
    thread = thread_config(job_id)["configurable"]["thread_id"]
    postgres = store.engine.dialect.name == "postgresql"
    table, column = ("checkpoint_writes", "blob") if postgres else ("writes", "value")
    with store.engine.begin() as conn:
        latest = conn.execute(text("SELECT checkpoint_id FROM checkpoints WHERE thread_id = :t "
                                   "ORDER BY checkpoint_id DESC LIMIT 1"), {"t": thread}).scalar_one()
        conn.execute(text(f"INSERT INTO {table} (thread_id, checkpoint_ns, checkpoint_id, task_id, idx, channel, "
                          f"type, {column}) VALUES (:t, '', :c, 'planted', 0, 'candidate', 'msgpack', :v)"),
                     {"t": thread, "c": latest, "v": payload(marker)})


@pytest.mark.parametrize("backend", ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def test_a_planted_checkpoint_row_executes_nothing_on_resume(backend: str, request, tmp_path: Path):
    url = f"sqlite:///{tmp_path / 'pool.db'}" if backend == "sqlite" else request.getfixturevalue("postgres_db")
    spec = load_spec(EXAMPLES / "llama3-8b-a100.yaml")
    spec = spec.model_copy(update={"budget": spec.budget.model_copy(update={"max_trials": 4, "converge_tol": None})})
    store = SqlStore(url)
    marker = tmp_path / "pwned"
    try:
        job_id = store.create_job(spec)
        with pytest.raises(KeyboardInterrupt):
            run_job(store, url, job_id, launcher=StopAt(build_launcher(spec.launcher, spec.seed), 3))
        plant(store, job_id, marker)
        final = run_job(store, url, job_id)
        assert not marker.exists(), "a planted checkpoint row ran code"
        assert final.status is JobStatus.FAILED and "UnsafeCheckpoint" in (final.stop_reason or "")
        # A finished job is never resumed at all, so its checkpoints are never read again.
        done = store.create_job(spec)
        run_job(store, url, done)
        plant(store, done, marker)
        with pytest.raises(IllegalTransition, match="succeeded"):
            run_job(store, url, done)
        assert not marker.exists()
        assert json.dumps(store.get_job(done).status.value) == '"succeeded"'
    finally:
        store.close()
