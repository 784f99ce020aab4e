"""Booked GPUs (docs/reservations.md; the admission rules in docs/scheduling.md, "Booked
GPUs"): how far ahead the cycle sees bookings, the longest window, and whether the unused
booked time is charged."""

from __future__ import annotations

from datetime import timedelta

import environ

from .environment import env

# The cycle sees every booked window that overlaps [now, now + this]; a new booking must
# be guaranteed for each of its windows within it.
FAIRQ_BOOKING_HORIZON_HOURS = env.float("FAIRQ_BOOKING_HORIZON_HOURS", default=168.0)
# The longest one window of a booking.
FAIRQ_BOOKING_MAX_HOURS = env.float("FAIRQ_BOOKING_MAX_HOURS", default=72.0)
# On: after a window ends, the booked GPU-hours the team did not use are charged to it
# once (a usage record: fair share and cost). Off: only what its jobs ran is charged.
FAIRQ_BOOKING_CHARGE_UNUSED = env.bool("FAIRQ_BOOKING_CHARGE_UNUSED", default=False)
for _name, _value in (("FAIRQ_BOOKING_HORIZON_HOURS", FAIRQ_BOOKING_HORIZON_HOURS),
                      ("FAIRQ_BOOKING_MAX_HOURS", FAIRQ_BOOKING_MAX_HOURS)):
    if _value <= 0:
        raise environ.ImproperlyConfigured(f"{_name} must be > 0")

beat = {
    # docs/reservations.md, "Charging": the windows that ended, their unused GPU-hours
    # charged once when FAIRQ_BOOKING_CHARGE_UNUSED is on (a no-op when off).
    "reservations-charge-unused": {
        "task": "queueing.tasks.reservations_charge_task",
        "schedule": timedelta(minutes=5),
        "options": {"expires": 240},
    },
}
