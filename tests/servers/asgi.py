"""The test project's ASGI application, with the embedded supervisor, for uvicorn."""

from django.core.asgi import get_asgi_application

from stalwart.embedded.asgi import with_supervisor

application = with_supervisor(get_asgi_application())
