"""Nightly retuning: schedules that re-check a tuned workload after a framework upgrade.

    cron slot ──► claim the tick (one replica per slot) ──► probe the framework fingerprint
        unchanged since the incumbent was measured ─────────────► "no-change", nothing started
        changed ──► re-measure the incumbent (warm-up + 3 runs, a noise band from their spread)
                     within the band ───────────────────────────► "within-noise" (incumbent re-stamped)
                     beyond it (or `always_retune`) ──► a retune job, warm-started from the pool
                                                        └─ when it ends: the new best, its flag diff,
                                                           the new incumbent, an event, a webhook

Modules, one job each: `cron` (slots), `probe` (a launcher kind's framework fingerprint), `remeasure`
(repeated runs and their noise band), `decide` (the verdict, pure), `retune` (the retune job: its
spec, and closing it), `tick` (one tick end to end), `fire` (what a scheduler does each poll, and
`run-now`), `webhook` (the notification).
"""
