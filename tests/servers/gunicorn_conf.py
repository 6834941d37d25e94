"""Gunicorn's configuration for the embedded-mode tests: the documented line, two workers."""

from stalwart.embedded.gunicorn import *  # noqa: F403 - when_ready, on_reload, on_exit

workers = 2
graceful_timeout = 10
# Gunicorn 25.1's control socket lives at one path per user: runs side by side would share
# it. (An older Gunicorn ignores the name.)
control_socket_disable = True
