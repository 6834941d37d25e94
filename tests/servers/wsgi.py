"""The test project's WSGI application, for Gunicorn (its hooks: gunicorn_conf.py)."""

from django.core.wsgi import get_wsgi_application

application = get_wsgi_application()
