from __future__ import annotations

import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings.prod")
# A plain token submit skips the middleware that has nothing to do for it:
# queueing/api/lane.py; the rest is Django's application as usual.
django_application = get_wsgi_application()

from queueing.api.lane import submit_lane  # noqa: E402  (needs the apps loaded)

application = submit_lane(django_application)

from queueing.web.collector import collector_setup  # noqa: E402

collector_setup()  # queueing/web/collector.py: with the application loaded
