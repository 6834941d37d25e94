"""The systemd notify protocol (``Type=notify``), with the standard library only."""

import os
import socket


def notify(message: str) -> bool:
    """Send ``message`` (e.g. ``READY=1``) to ``$NOTIFY_SOCKET``; False if there is none."""
    address = os.environ.get("NOTIFY_SOCKET")
    if not address:
        return False
    if address.startswith("@"):
        address = "\0" + address[1:]  # an abstract socket
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
        try:
            sock.connect(address)
            sock.sendall(message.encode())
        except OSError:
            return False
    return True


def watchdog_interval() -> float | None:
    """Seconds between watchdog pings systemd expects from us, or None (no watchdog)."""
    usec = os.environ.get("WATCHDOG_USEC")
    pid = os.environ.get("WATCHDOG_PID")
    if not usec or (pid and pid != str(os.getpid())):
        return None
    try:
        return int(usec) / 1_000_000 / 2  # ping twice per period, as systemd advises
    except ValueError:
        return None
