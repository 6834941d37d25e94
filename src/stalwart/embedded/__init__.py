"""Embedded mode: the supervisor started and stopped with the web server, for small
deployments (one dyno, one container).

``launcher.py`` starts ``queue supervise`` as a process of its own and stops it;
``gunicorn.py`` does so from Gunicorn's master (server hooks), ``asgi.py`` from an ASGI
server's lifespan (uvicorn). See docs/how-to/embedded-mode.md.
"""
