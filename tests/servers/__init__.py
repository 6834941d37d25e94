"""Web servers that embed the supervisor (tests/acceptance/test_embedded.py): a WSGI
application with its Gunicorn configuration, and an ASGI application for uvicorn."""
