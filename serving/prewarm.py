"""Scheduled pre-warm windows: cron-started windows that raise a service's `min_containers`.

A service's `warm_schedule` is a list of windows:

    {"cron": "30 8 * * 1-5", "duration_minutes": 570, "min_containers": 2,
     "timezone": "America/New_York"}

Each window opens when its cron expression (5 fields: minute hour day-of-month month
day-of-week, in the window's `timezone`, an IANA name, default UTC) matches and stays open
`duration_minutes`. While any window is open the service keeps at least that window's
`min_containers` (the largest of the open ones, never below the deployed base); when none is,
the base comes back.
`serving/prewarm_app.py` applies it every 5 minutes on Modal (the autoscaler update the
client's `Server.autoscaler.update` sends); `components/cost.py` prices the extra warm
container-hours with `extra_container_hours_per_month`.

Cron syntax: `*`, numbers, ranges `a-b`, steps `*/n` and `a-b/n`, lists `a,b`; day-of-week 0-7
(0 and 7 are Sunday) or `sun`..`sat`; month 1-12 or `jan`..`dec`. When both day fields are
restricted, either may match (standard cron). Stdlib only: the Pulumi side imports it too.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

_NAMES = {
    4: {d: i for i, d in enumerate(["sun", "mon", "tue", "wed", "thu", "fri", "sat"])},
    3: {
        m: i + 1
        for i, m in enumerate(
            ["jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"]
        )
    },
}
_RANGES = [(0, 59), (0, 23), (1, 31), (1, 12), (0, 7)]
_FIELD_NAMES = ["minute", "hour", "day of month", "month", "day of week"]
MAX_DURATION_MINUTES = 7 * 24 * 60
WINDOW_KEYS = ("cron", "duration_minutes", "min_containers", "timezone")
#: Cost simulation span: four weeks from a fixed Monday, scaled to 730 h a month.
SIM_START = dt.datetime(2026, 1, 5)
SIM_MINUTES = 28 * 24 * 60
HOURS_PER_MONTH = 730.0


class ScheduleError(ValueError):
    """A warm_schedule is invalid; the message names the window and the field."""


@dataclass(frozen=True)
class Cron:
    expr: str
    fields: tuple[frozenset[int], ...]
    dom_any: bool
    dow_any: bool

    def matches(self, t: dt.datetime) -> bool:
        minute, hour, dom, month, dow = self.fields
        if t.minute not in minute or t.hour not in hour or t.month not in month:
            return False
        cron_dow = (t.weekday() + 1) % 7  # Monday = 1 ... Sunday = 0
        day_ok = t.day in dom
        dow_ok = cron_dow in dow or (cron_dow == 0 and 7 in dow)
        if self.dom_any and self.dow_any:
            return True
        if self.dom_any:
            return dow_ok
        if self.dow_any:
            return day_ok
        return day_ok or dow_ok


def _value(token: str, index: int) -> int:
    names = _NAMES.get(index, {})
    if token.lower() in names:
        return names[token.lower()]
    if not token.isdigit():
        raise ValueError(f"{token!r} is not a number")
    return int(token)


def parse_cron(expr: str) -> Cron:
    parts = expr.split()
    if len(parts) != 5:
        raise ValueError(f"cron {expr!r} must have 5 fields (minute hour day month weekday)")
    fields: list[frozenset[int]] = []
    for i, part in enumerate(parts):
        lo, hi = _RANGES[i]
        values: set[int] = set()
        for item in part.split(","):
            m = re.fullmatch(r"(\*|[A-Za-z0-9]+(?:-[A-Za-z0-9]+)?)(?:/(\d+))?", item)
            if m is None:
                raise ValueError(f"cron {expr!r}: {_FIELD_NAMES[i]} {item!r} is not valid")
            span, step = m.group(1), int(m.group(2) or 1)
            if span == "*":
                a, b = lo, hi
            elif "-" in span:
                a, b = (_value(x, i) for x in span.split("-", 1))
            else:
                a = b = _value(span, i)
            if not (lo <= a <= hi and lo <= b <= hi and a <= b and step >= 1):
                raise ValueError(f"cron {expr!r}: {_FIELD_NAMES[i]} {item!r} is outside {lo}-{hi}")
            values.update(range(a, b + 1, step))
        fields.append(frozenset(values))
    return Cron(expr, tuple(fields), parts[2] == "*", parts[4] == "*")


@dataclass(frozen=True)
class Window:
    cron: Cron
    duration_minutes: int
    min_containers: int
    timezone: str = "UTC"


def parse_windows(raw: Any, *, max_containers: int | None = None) -> list[Window]:
    """Validate a warm_schedule (list of maps); ScheduleError names what is wrong."""
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise ScheduleError(
            "warm_schedule must be a list of windows {cron, duration_minutes, min_containers}"
        )
    windows = []
    for i, item in enumerate(raw):
        where = f"warm_schedule[{i}]"
        if not isinstance(item, Mapping) or set(item) - set(WINDOW_KEYS):
            raise ScheduleError(
                f"{where} must be a map with cron, duration_minutes, min_containers"
                " and timezone only"
            )
        try:
            cron = parse_cron(str(item.get("cron", "")))
        except ValueError as exc:
            raise ScheduleError(f"{where}.cron: {exc}") from None
        duration, count = item.get("duration_minutes"), item.get("min_containers")
        if (
            not isinstance(duration, int)
            or isinstance(duration, bool)
            or not 1 <= duration <= MAX_DURATION_MINUTES
        ):
            raise ScheduleError(
                f"{where}.duration_minutes must be a whole number of minutes, "
                f"1-{MAX_DURATION_MINUTES}"
            )
        if not isinstance(count, int) or isinstance(count, bool) or count < 0:
            raise ScheduleError(f"{where}.min_containers must be a whole number >= 0")
        if max_containers is not None and count > max_containers:
            raise ScheduleError(
                f"{where}.min_containers ({count}) is above scaling.max_containers "
                f"({max_containers}): raise max_containers or lower the window's minimum"
            )
        tz = str(item.get("timezone") or "UTC")
        try:
            timezone(tz)
        except ScheduleError as exc:
            raise ScheduleError(f"{where}.{exc}") from None
        windows.append(Window(cron, duration, count, tz))
    return windows


def timezone(name: str | None) -> dt.tzinfo:
    try:
        return ZoneInfo(name or "UTC")
    except (ZoneInfoNotFoundError, ValueError):
        raise ScheduleError(
            f"timezone {name!r} is not an IANA time zone (e.g. Europe/Paris)"
        ) from None


def desired_min(windows: Sequence[Window], base: int, now: dt.datetime) -> int:
    """`min_containers` the service should have at `now` (an aware datetime; each window's
    cron is read in its own timezone)."""
    want = base
    for w in windows:
        if w.min_containers <= want:
            continue
        t = now.astimezone(timezone(w.timezone)).replace(second=0, microsecond=0, tzinfo=None)
        for k in range(w.duration_minutes):
            if w.cron.matches(t - dt.timedelta(minutes=k)):
                want = w.min_containers
                break
    return want


def _fires(cron: Cron, start: dt.datetime, minutes: int) -> Iterable[int]:
    for k in range(minutes):
        if cron.matches(start + dt.timedelta(minutes=k)):
            yield k


def extra_container_hours_per_month(windows: Sequence[Window], base: int) -> float:
    """Container-hours a month the windows keep warm above `base` (4 simulated weeks from
    a Monday, scaled to 730 h; windows tied to days of the month are approximated)."""
    if not windows:
        return 0.0
    lead = max(w.duration_minutes for w in windows)
    start = SIM_START - dt.timedelta(minutes=lead)
    level = [base] * SIM_MINUTES
    for w in windows:
        if w.min_containers <= base:
            continue
        for k in _fires(w.cron, start, SIM_MINUTES + lead):
            lo, hi = max(k - lead, 0), min(k - lead + w.duration_minutes, SIM_MINUTES)
            for m in range(lo, hi):
                if level[m] < w.min_containers:
                    level[m] = w.min_containers
    extra_minutes = sum(level) - base * SIM_MINUTES
    return extra_minutes / 60 * HOURS_PER_MONTH / (SIM_MINUTES / 60)
