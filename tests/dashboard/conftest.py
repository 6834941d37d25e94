from collections.abc import Callable

import pytest
from django.contrib.auth.models import Permission, User
from django.test import Client

from stalwart.dashboard.permissions import ACTIONS, VIEW

ADMIN = "/admin/stalwart/dashboard/default"


def staff(username: str, *permissions: str) -> User:
    user = User.objects.create_user(username, password="pw", is_staff=True)  # noqa: S106 - a test user
    for permission in permissions:
        app_label, codename = permission.split(".")
        user.user_permissions.add(
            Permission.objects.get(content_type__app_label=app_label, codename=codename)
        )
    return user


@pytest.fixture
def login() -> Callable[..., Client]:
    """A client logged in as a staff user with these permissions (CSRF checks on)."""

    def make(*permissions: str, username: str = "operator") -> Client:
        client = Client(enforce_csrf_checks=True)
        client.force_login(staff(username, *permissions))
        return client

    return make


@pytest.fixture
def operator(login) -> Client:
    """Everything: view and every action."""
    return login(VIEW, *sorted(set(ACTIONS.values())))


@pytest.fixture
def viewer(login) -> Client:
    """The view permission only."""
    return login(VIEW, username="viewer")


def csrf(client: Client, page: str) -> str:
    """The CSRF token a page gives its forms."""
    response = client.get(page)
    assert response.status_code == 200, response.content[:500]
    return response.context["csrf_token"]
