"""The dashboard: the queue seen and steered from the Django admin, with no extra server.

``admin.py`` gives it its URLs under the admin (``/admin/stalwart/dashboard/``) and its
permissions; ``pages.py`` shows, ``actions.py`` changes, and both read and write through
``stalwart.browsing`` and ``stalwart.control``, like the ``queue`` command.
"""
