"""The ASGI entry point: Django for HTTP, the notebook proxy for WebSockets.

`uvicorn config.asgi:application` serves it; the ingress sends `/sessions/` to it
(platform/k8s, docs/deployment.md, "Notebook sessions"), so a session's JupyterLab
is reached through fairq with its kernels' and terminals' WebSockets. Everything else
may be served by gunicorn (config/wsgi.py) as before, or by this app too.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings.prod")
# WhiteNoise's static files are file iterators; Django under ASGI reads them in its thread
# pool and warns once per process that it does so. Small files, served that way by
# design: not a warning for the console (`make demo`) or the web pod's log.
warnings.filterwarnings("ignore", message="StreamingHttpResponse must consume synchronous "
                        "iterators", category=Warning)
django_application = get_asgi_application()  # sets Django up before the imports below

from queueing.web.notebook_proxy import notebook_websocket  # noqa: E402

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[Mapping[str, Any]], Awaitable[None]]


async def application(scope: Scope, receive: Receive, send: Send) -> None:
    """HTTP to Django; a WebSocket to the notebook proxy (which refuses any path but a
    session's); the lifespan protocol answered (nothing to start or stop)."""
    if scope["type"] == "websocket":
        await notebook_websocket(scope, receive, send)
    elif scope["type"] == "lifespan":
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return
    else:
        await django_application(scope, receive, send)
