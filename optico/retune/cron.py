"""Cron expressions, read by croniter (a well-kept library) rather than by us. Slots are in UTC."""

from __future__ import annotations

from datetime import datetime, timezone

from croniter import CroniterBadCronError, CroniterBadDateError, CroniterError, croniter

DEFAULT_CRON = "0 2 * * *"  # nightly, 02:00 UTC: after the day's upgrades, before people look


# Five fields with lists and ranges fit in far fewer; a longer one is not a schedule anyone wrote.
MAX_CRON_CHARS = 200


def check_cron(expr: str) -> str:
    """The expression, whitespace normalised; ValueError with a one-line reason if it is not a standard
    five-field cron (minute hour day-of-month month day-of-week) or an @-alias, or never fires."""
    text = " ".join(str(expr).split())
    fields = text.split(" ")
    if len(text) > MAX_CRON_CHARS:
        raise ValueError(f"cron: longer than {MAX_CRON_CHARS} characters")
    if not text:
        raise ValueError("cron: empty; e.g. '0 2 * * *' (02:00 UTC every night)")
    if not text.startswith("@") and len(fields) != 5:
        raise ValueError(f"cron: {text!r} has {len(fields)} fields; use five (minute hour day month weekday), "
                         f"e.g. '0 2 * * *'")
    try:
        next_fire(text, datetime(2000, 1, 1, tzinfo=timezone.utc))
    except CroniterBadDateError:
        raise ValueError(f"cron: {text!r} never fires") from None
    except (CroniterBadCronError, CroniterError, ValueError, KeyError) as exc:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ValueError(f"cron: {text!r} is not a valid cron expression ({reason})") from None
    return text


def next_fire(expr: str, after: datetime) -> datetime:
    """The first slot strictly after `after` (UTC, aware)."""
    start = after.astimezone(timezone.utc) if after.tzinfo else after.replace(tzinfo=timezone.utc)
    return croniter(expr, start).get_next(datetime).astimezone(timezone.utc)
