"""Operations endpoints: /healthz (the process answers), /readyz (database reachable, schema current),
/metrics (Prometheus). Open by default, or behind a read token (OPTICO_OPEN_HEALTH, OPTICO_OPEN_METRICS)."""

from __future__ import annotations

import logging
from collections.abc import Iterator

from fastapi import APIRouter, Depends, Response, status
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from sqlalchemy import select

from optico.errors import first_line
from optico.pool.contract import Store
from optico.pool.lifecycle import JobStatus
from optico.pool.schema import SchemaError, ensure_current
from optico.redact import redact
from optico.service.deps import StoreDep, optional_token

router = APIRouter(tags=["operations"], dependencies=[Depends(optional_token)])
log = logging.getLogger("optico.service")


# Load balancers probe with HEAD too: an operation of its own in the schema (its own operation id).
@router.get("/healthz")
@router.head("/healthz", operation_id="healthz_head")
def healthz() -> dict[str, str]:
    """The process is up."""
    return {"status": "ok"}


@router.get("/readyz", responses={503: {"description": "The database is unreachable or its schema is behind."}})
@router.head("/readyz", operation_id="readyz_head")
def readyz(store: StoreDep, response: Response) -> dict[str, str]:
    """Ready to serve: the database answers and its schema is at this optico's head."""
    try:
        # The read engine: on SQLite a probe must not queue for the write lock behind a worker's
        # transaction (it waited 12-22 s, past any probe's timeout, while the database was fine).
        engine = store.read_engine  # type: ignore[attr-defined]
        with engine.connect() as conn:
            conn.execute(select(1))
        ensure_current(engine)
    except SchemaError as exc:
        response.status_code = status.HTTP_503_SERVICE_UNAVAILABLE
        return {"status": "unavailable", "reason": redact(str(exc).splitlines()[0])[:300]}
    except Exception as exc:  # noqa: BLE001 - any failure (a StoreError, a driver's) means not ready
        # The driver's message names hosts and ports; this endpoint may be open, so it goes to the log only.
        log.warning("readyz: database unreachable: %s", redact(first_line(exc)))
        response.status_code = status.HTTP_503_SERVICE_UNAVAILABLE
        return {"status": "unavailable", "reason": "the pool's database is unreachable (details in the server log)"}
    return {"status": "ready"}


class PoolCollector(Collector):
    """Reads the aggregates from the database at every scrape, so every replica reports the same."""

    def __init__(self, store: Store):
        self.store = store

    def collect(self) -> Iterator[Metric]:
        stats = self.store.service_stats()
        jobs = GaugeMetricFamily("optico_jobs", "Jobs by status.", labels=["status"])
        for state in JobStatus:
            jobs.add_metric([state.value], stats["jobs"].get(state.value, 0))
        yield jobs
        # Finished trials only ever grow (a counter); running ones come and go (a gauge: rate() of a
        # counter that falls reads as a reset).
        trials = CounterMetricFamily("optico_trials", "Finished trials by outcome.", labels=["status"])
        for outcome in ("ok", "failed", "lost"):
            trials.add_metric([outcome], stats["trials"].get(outcome, 0))
        yield trials
        yield GaugeMetricFamily("optico_trials_running", "Trials running now.", value=stats["trials"].get("running", 0))
        seconds = stats["trial_seconds"]
        buckets = [(str(b), n) for b, n in sorted(seconds["buckets"].items())] + [("+Inf", seconds["count"])]
        yield HistogramMetricFamily("optico_trial_duration_seconds", "Wall time of finished trials.",
                                    buckets=buckets, sum_value=seconds["sum"])
        tokens = CounterMetricFamily("optico_llm_tokens", "LLM tokens used by the reasoners.", labels=["kind"])
        tokens.add_metric(["prompt"], stats["llm"]["prompt_tokens"])
        tokens.add_metric(["completion"], stats["llm"]["completion_tokens"])
        yield tokens
        yield CounterMetricFamily("optico_llm_cost_usd", "LLM cost in USD (list prices).", value=stats["llm"]["cost_usd"])
        yield CounterMetricFamily("optico_lease_takeovers", "Jobs taken over from a dead worker.",
                                  value=stats["lease_takeovers"])


@router.get("/metrics", response_class=Response, responses={200: {"content": {"text/plain": {}}}})
def metrics(store: StoreDep) -> Response:
    """Prometheus text format: jobs by status, trials by outcome, trial duration, LLM tokens and cost,
    lease takeovers."""
    registry = CollectorRegistry(auto_describe=True)
    registry.register(PoolCollector(store))
    return Response(generate_latest(registry), media_type="text/plain; version=0.0.4; charset=utf-8")
