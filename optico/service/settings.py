"""The service's settings: `OPTICO_*` environment variables (docs/deploy.md lists every one)."""

from __future__ import annotations

from pydantic import AliasChoices, Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from optico.runner import LeasePolicy


class ServiceSettings(BaseSettings):
    """What `optico serve` and `optico worker` read. Each field is `OPTICO_<FIELD>` unless noted."""

    model_config = SettingsConfigDict(env_prefix="OPTICO_", extra="ignore", frozen=True)

    database_url: str | None = Field(None, description="The pool (SQLAlchemy URL); None = the per-user SQLite "
                                                       "file. PostgreSQL for several replicas or workers.")
    workers: int = Field(1, ge=0, le=64, description="Job workers embedded in `optico serve` (0 = API only). "
                                                     "Each runs one job at a time.")
    lease_s: float = Field(60.0, gt=1, le=86_400, description="A worker's lease on a job; a dead worker's job "
                                                              "is taken over this long after its last renewal.")
    lease_renew_s: float | None = Field(None, gt=0, description="How often the lease is renewed; None = "
                                                                "lease_s / 4.")
    worker_poll_s: float = Field(1.0, gt=0, le=300, description="How often an idle worker looks for a job.")
    open_health: bool = Field(True, description="/healthz and /readyz answer without a token.")
    open_metrics: bool = Field(True, description="/metrics answers without a token (for a Prometheus scraper "
                                                 "inside the cluster); false = it needs a read token.")
    max_body_bytes: int = Field(1_048_576, ge=1024, le=64 * 1_048_576,
                                description="Largest request body accepted; larger ones get 413.")
    sse_poll_s: float = Field(0.5, gt=0, le=60, description="How often an event stream looks for new events.")
    sse_keepalive_s: float = Field(15.0, gt=0, le=300, description="A comment line at least this often keeps "
                                                                   "proxies from closing an idle stream.")
    sse_recheck_s: float = Field(5.0, gt=0, le=300, description="How often an open event stream checks that its "
                                                              "token (or dashboard session) still stands: a "
                                                              "revoked one's streams end within this.")
    max_event_streams: int = Field(100, ge=1, le=10_000, description="Event streams (API and dashboard) open at "
                                   "once; more get 503 with Retry-After (each polls the pool).")
    head_timeout_s: float = Field(15.0, gt=0, le=600, description="A connection that has not sent a whole "
                                  "request head this long after opening (or after its last response), or the "
                                  "body its head announced this long after the head, is closed.")
    allow_commands: bool = Field(False, description="Accept specs whose launcher runs the submitter's own "
                                                    "command (`program: {kind: megatron-lm, command: [...]}`). "
                                                    "Off by default: a write token could then run any command "
                                                    "on the workers.")
    file_roots: list[str] = Field(default_factory=list, description="Directories a submitted spec may read files "
                                  "from (replay `launcher.data`, `calibration`), besides the package's own data. "
                                  "JSON list, e.g. '[\"/data/optico\"]'.")
    secure_cookies: bool = Field(False, description="Mark the dashboard's session cookie Secure even when a "
                                 "request arrives over http: set it behind a proxy that terminates TLS (the "
                                 "cookie is Secure on https requests anyway).")
    page_max: int = Field(500, ge=10, le=10_000, description="Largest page of the job list (GET /api/v1/jobs).")
    scheduler: bool = Field(True, validation_alias=AliasChoices("OPTICO_SCHEDULER", "scheduler"),
                            description="Fire due retuning schedules from this process (every replica may; a "
                                        "database lock lets one fire each tick).")
    scheduler_poll_s: float = Field(30.0, gt=0, le=3600, description="How often due schedules are looked for.")
    # Read from the environment where a hook is sent (optico.retune.webhook); declared here so that a
    # value that is not a boolean stops the server at start instead of meaning false.
    webhook_allow_local: bool = Field(False, description="Let a schedule's webhook reach a loopback, link-local "
                                      "or cloud metadata address.")

    @model_validator(mode="after")
    def _renew_inside_lease(self) -> ServiceSettings:
        if self.lease_renew_s is not None and self.lease_renew_s >= self.lease_s:
            raise ValueError(f"OPTICO_LEASE_RENEW_S: must be shorter than OPTICO_LEASE_S "
                             f"({self.lease_renew_s:g} s is not below {self.lease_s:g} s)")
        return self

    @property
    def lease(self) -> LeasePolicy:
        return LeasePolicy(lease_s=self.lease_s, renew_s=self.lease_renew_s)
