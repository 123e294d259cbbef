"""When a scheduled function (`modal.Period` / `modal.Cron`) runs next.

Period: every `years/months/weeks/days/hours/minutes/seconds` from the deploy (months as 30
days and years as 365: the emulator does not do calendar arithmetic for periods). Cron: the
standard five fields (minute hour day-of-month month day-of-week, with `*`, `a-b`, `*/n`,
`a-b/n` and lists; day-of-week 0 or 7 is Sunday; when both day fields are restricted either
may match, as in cron), in the schedule's timezone (UTC by default), checked minute by minute.
"""

from __future__ import annotations

import datetime as dt
from zoneinfo import ZoneInfo

from modal_proto import api_pb2

_RANGES = [(0, 59), (0, 23), (1, 31), (1, 12), (0, 7)]


def _field(text: str, lo: int, hi: int) -> set[int]:
    out: set[int] = set()
    for part in text.split(","):
        base, _, step_s = part.partition("/")
        step = int(step_s) if step_s else 1
        if base == "*":
            a, b = lo, hi
        elif "-" in base:
            a_s, b_s = base.split("-", 1)
            a, b = int(a_s), int(b_s)
        else:
            a = int(base)
            b = hi if step_s else a
        if not (lo <= a <= hi and lo <= b <= hi) or step < 1:
            raise ValueError(f"cron field {text!r} out of range {lo}-{hi}")
        out.update(range(a, b + 1, step))
    return out


class Cron:
    def __init__(self, expression: str, timezone: str = "") -> None:
        fields = expression.split()
        if len(fields) != 5:
            raise ValueError(f"cron expression {expression!r} needs 5 fields")
        self.minute, self.hour, self.dom, self.month, dow = (
            _field(f, lo, hi) for f, (lo, hi) in zip(fields, _RANGES, strict=True)
        )
        self.dow = {d % 7 for d in dow}
        self.dom_any = fields[2] == "*"
        self.dow_any = fields[4] == "*"
        self.tz = ZoneInfo(timezone) if timezone else dt.UTC

    def matches(self, t: dt.datetime) -> bool:
        if t.minute not in self.minute or t.hour not in self.hour or t.month not in self.month:
            return False
        dom_ok = t.day in self.dom
        dow_ok = (t.isoweekday() % 7) in self.dow
        if self.dom_any or self.dow_any:
            return dom_ok and dow_ok
        return dom_ok or dow_ok

    def next_after(self, ts: float) -> float:
        t = dt.datetime.fromtimestamp(ts, self.tz).replace(second=0, microsecond=0)
        for _ in range(366 * 24 * 60):
            t += dt.timedelta(minutes=1)
            if self.matches(t):
                return t.timestamp()
        raise ValueError("cron expression never fires within a year")


def period_seconds(p: api_pb2.Schedule.Period) -> float:
    return (
        p.years * 365 * 86400
        + p.months * 30 * 86400
        + p.weeks * 7 * 86400
        + p.days * 86400
        + p.hours * 3600
        + p.minutes * 60
        + p.seconds
    )


def next_run(schedule: api_pb2.Schedule, after: float) -> float | None:
    """Epoch seconds of the next run after `after`; None when the schedule is empty."""
    if schedule.HasField("cron"):
        return Cron(schedule.cron.cron_string, schedule.cron.timezone).next_after(after)
    if schedule.HasField("period"):
        seconds = period_seconds(schedule.period)
        return after + seconds if seconds > 0 else None
    return None
