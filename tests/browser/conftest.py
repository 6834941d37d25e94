"""A real browser for the dashboard: Debian's headless Chromium, driven by Selenium.

``scripts/test`` installs ``chromium`` and ``chromium-driver`` when they are missing. Without
them these tests are skipped, except under ``CI=true``, where that is a failure. Each page a
test opens is checked (no server error, no error in the browser's console) and saved as a
screenshot under ``.test-artifacts/screenshots/`` (or ``$STALWART_SCREENSHOTS``).
"""

import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from django.contrib.auth.models import User

from tests.helpers import ROOT

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
DRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
SCREENSHOTS = Path(os.environ.get("STALWART_SCREENSHOTS", ROOT / ".test-artifacts" / "screenshots"))
# Per the machine's notes: no sandbox (root in a container), no GPU, no network of its own.
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--window-size=1440,1000",
)


@pytest.fixture(scope="session")
def browser_binaries() -> tuple[str, str]:
    missing = [path for path in (CHROMIUM, DRIVER) if not os.access(path, os.X_OK)]
    if missing:
        message = (
            f"{' and '.join(missing)} not found: install Debian's chromium and chromium-driver "
            "(scripts/test does, as root)"
        )
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    return CHROMIUM, DRIVER


@pytest.fixture
def browser(browser_binaries, tmp_path) -> Iterator[object]:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    chromium, driver_path = browser_binaries
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={tmp_path / 'chromium-profile'}")
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(options=options, service=Service(executable_path=driver_path))
    driver.implicitly_wait(0)
    try:
        yield driver
    finally:
        driver.quit()


class Visitor:
    """What a person does: open pages, click, type; each page checked and photographed."""

    def __init__(self, driver: object, base: str) -> None:
        self.driver = driver
        self.base = base
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)

    def open(self, path: str, shot: str | None = None) -> None:
        self.driver.get(self.base + path)
        self.check(shot)

    def check(self, shot: str | None = None) -> None:
        """The page is not a server error and logged no error in the console."""
        from selenium.webdriver.common.by import By

        bodies = self.driver.find_elements(By.TAG_NAME, "body")
        assert bodies, f"{self.driver.current_url} is no page: {self.driver.page_source[:2000]}"
        body = bodies[0].text
        title = self.driver.title
        assert "Server Error" not in title, body[:2000]
        assert "Server Error (500)" not in body, body[:2000]
        errors = [entry for entry in self.driver.get_log("browser") if entry["level"] == "SEVERE"]
        assert not errors, f"console errors on {self.driver.current_url}: {errors}"
        if shot:
            self.driver.save_screenshot(str(SCREENSHOTS / f"{shot}.png"))

    def find(self, selector: str) -> object:
        from selenium.webdriver.common.by import By

        return self.driver.find_element(By.CSS_SELECTOR, selector)

    def all(self, selector: str) -> list:
        from selenium.webdriver.common.by import By

        return self.driver.find_elements(By.CSS_SELECTOR, selector)

    def click(self, selector: str, shot: str | None = None, *, navigates: bool = True) -> None:
        self._press(self.find(selector), shot, navigates=navigates)

    def button(self, text: str, shot: str | None = None) -> None:
        """Click the button that says ``text`` (it leads to another page)."""
        from selenium.webdriver.common.by import By

        buttons = [b for b in self.driver.find_elements(By.TAG_NAME, "button") if b.text == text]
        assert buttons, f"no button says {text!r} on {self.driver.current_url}"
        self._press(buttons[0], shot, navigates=True)

    def _press(self, element: object, shot: str | None, *, navigates: bool) -> None:
        """Click; if that leads to another page, wait (bounded) until it has loaded."""
        from selenium.webdriver.common.by import By
        from selenium.webdriver.support import expected_conditions
        from selenium.webdriver.support.ui import WebDriverWait

        page = self.driver.find_element(By.TAG_NAME, "html")
        element.click()
        if navigates:
            wait = WebDriverWait(self.driver, 15)
            wait.until(expected_conditions.staleness_of(page))
            wait.until(
                lambda driver: driver.execute_script("return document.readyState") == "complete"
            )
        self.check(shot)

    def text(self) -> str:
        from selenium.webdriver.common.by import By

        return self.driver.find_element(By.TAG_NAME, "body").text


@pytest.fixture
def visit(browser, live_server) -> Callable[..., Visitor]:
    """Log in to the admin as an operator and return a Visitor."""

    def login(username: str = "operator", *, superuser: bool = True) -> Visitor:
        password = "a-password"  # noqa: S105 - a test user's
        User.objects.create_user(username, password=password, is_staff=True, is_superuser=superuser)
        visitor = Visitor(browser, live_server.url)
        visitor.open("/admin/login/", "login")
        visitor.find("#id_username").send_keys(username)
        visitor.find("#id_password").send_keys(password)
        visitor.click("input[type=submit]")
        assert "Log out" in visitor.text() or "LOG OUT" in visitor.text().upper()
        return visitor

    return login
