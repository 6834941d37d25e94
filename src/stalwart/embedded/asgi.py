"""An ASGI wrapper that runs Stalwart's supervisor for as long as the server's lifespan.

In ``asgi.py``::

    from django.core.asgi import get_asgi_application

    from stalwart.embedded.asgi import with_supervisor

    application = with_supervisor(get_asgi_application())

On the lifespan's startup the supervisor starts (a process of its own, a child of the
server's process; the event loop waits for it in a thread); on its shutdown it is stopped,
``TERM`` then a wait for its drain. Django's application has no lifespan of its own: the
wrapper answers the lifespan's messages, and passes every other scope on. Under a Gunicorn
whose hooks started a supervisor already (``stalwart.embedded.gunicorn``, with Uvicorn's
workers), it starts none.
"""

import asyncio
import os
from collections.abc import Awaitable, Callable

from stalwart import events
from stalwart.embedded.launcher import MARK, EmbeddedError, EmbeddedSupervisor

Receive = Callable[[], Awaitable[dict]]
Send = Callable[[dict], Awaitable[None]]
Application = Callable[[dict, Receive, Send], Awaitable[None]]


def with_supervisor(application: Application, *, backend: str = "default") -> Application:
    """``application``, with the supervisor of the Stalwart backend ``backend`` started and
    stopped by the ASGI lifespan."""

    async def wrapped(scope: dict, receive: Receive, send: Send) -> None:
        if scope["type"] != "lifespan":
            await application(scope, receive, send)
            return
        await _lifespan(EmbeddedSupervisor(backend), receive, send)

    return wrapped


async def _lifespan(supervisor: EmbeddedSupervisor, receive: Receive, send: Send) -> None:
    started = False
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            shared = os.environ.get(MARK)
            if shared:
                events.emit("embedded_supervisor_shared", pid=shared)
            else:
                try:
                    await asyncio.to_thread(supervisor.start)
                except EmbeddedError as error:
                    await send({"type": "lifespan.startup.failed", "message": str(error)})
                    return
                started = True
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            if started:
                await asyncio.to_thread(supervisor.stop)
            await send({"type": "lifespan.shutdown.complete"})
            return
