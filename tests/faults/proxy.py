"""A TCP proxy of our own between the Stalwart processes and PostgreSQL, steered by the test.

- ``cut()``: close every open connection at once, both sides (a failover, a NAT reset).
- ``stall()`` / ``unstall()``: stop forwarding bytes, connections kept open (a hung link);
  with ``requests_only``, what the server sends still arrives (answers already on their way).
- ``latency(seconds)``: hold every chunk that long before forwarding it (a slow network);
  with ``answers_only``, only what the server sends (a slow answer to a quick statement).
- ``refuse()`` / ``accept()``: refuse new connections (nothing listens), then listen again.
- One connection, named by its client's port (what the client's ``getsockname()`` says):
  ``hold_answers(port)`` forwards its requests but holds what the server sends back (a
  statement that reached the server, whose answer is lost in transit), and ``cut(port=)``
  closes it alone.

Threads and sockets only. Every thread is a daemon and every socket is closed by ``close()``.
"""

import contextlib
import select
import socket
import threading
import time


class _Link:
    """One client connection and its connection upstream."""

    def __init__(self, client: socket.socket, server: socket.socket) -> None:
        self.client = client
        self.server = server
        try:
            self.client_port = client.getpeername()[1]
        except OSError:
            self.client_port = 0  # the client left already
        self.closed = threading.Event()
        self.answering = threading.Event()  # cleared: what the server sends is held here
        self.answering.set()

    def close(self) -> None:
        if self.closed.is_set():
            return
        self.closed.set()
        for side in (self.client, self.server):
            with contextlib.suppress(OSError):
                side.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                side.close()


class Proxy:
    def __init__(self, upstream_host: str, upstream_port: int) -> None:
        self.upstream = (upstream_host, upstream_port)
        self._links: set[_Link] = set()
        self._lock = threading.Lock()
        # Bytes flow while these are set: towards the server (requests), back (answers).
        self._flowing = {False: threading.Event(), True: threading.Event()}
        self.unstall()
        self._delay = 0.0
        self._answers_only = False
        self._closed = threading.Event()
        self._listener: socket.socket | None = None
        self.port = 0
        self.accepted = 0
        self._listen()

    # -- steering -----------------------------------------------------------------------------

    def cut(self, *, port: int | None = None) -> int:
        """Close every open connection (or the one whose client is at ``port``), both sides;
        return how many were cut."""
        with self._lock:
            links = [link for link in self._links if port is None or link.client_port == port]
            self._links.difference_update(links)
        for link in links:
            link.close()
        return len(links)

    def stall(self, *, requests_only: bool = False) -> None:
        self._flowing[False].clear()
        if not requests_only:
            self._flowing[True].clear()

    def unstall(self) -> None:
        for flowing in self._flowing.values():
            flowing.set()

    def hold_answers(self, port: int) -> int:
        """Hold what the server sends to the client at ``port`` (its requests still go);
        return how many connections that is (0 or 1)."""
        with self._lock:
            links = [link for link in self._links if link.client_port == port]
        for link in links:
            link.answering.clear()
        return len(links)

    def latency(self, seconds: float, *, answers_only: bool = False) -> None:
        self._answers_only = answers_only
        self._delay = seconds

    def refuse(self) -> None:
        """Stop listening: new connections are refused; open ones go on."""
        listener, self._listener = self._listener, None
        if listener is not None:
            # Shut down first: a close alone leaves the accept() under way in the kernel,
            # and it takes one more connection.
            with contextlib.suppress(OSError):
                listener.shutdown(socket.SHUT_RDWR)
            listener.close()

    def accept(self) -> None:
        """Listen again, on the same port."""
        if self._listener is None:
            self._listen(self.port)

    def close(self) -> None:
        self._closed.set()
        self.refuse()
        self.unstall()
        self.cut()

    # -- forwarding ---------------------------------------------------------------------------

    def _listen(self, port: int = 0) -> None:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", port))
        listener.listen(128)
        self.port = listener.getsockname()[1]
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def _accept(self, listener: socket.socket) -> None:
        while not self._closed.is_set():
            try:
                client, _ = listener.accept()
            except OSError:
                return  # refused or closed
            try:
                server = socket.create_connection(self.upstream, timeout=5)
            except OSError:
                client.close()  # upstream down: the client sees the connection closed
                continue
            server.settimeout(None)
            link = _Link(client, server)
            with self._lock:
                self._links.add(link)
                self.accepted += 1
            for source, target, answers in ((client, server, False), (server, client, True)):
                threading.Thread(
                    target=self._pump, args=(link, source, target, answers), daemon=True
                ).start()

    def _pump(
        self, link: _Link, source: socket.socket, target: socket.socket, answers: bool
    ) -> None:
        flowing = self._flowing[answers]
        try:
            while not link.closed.is_set():
                if not flowing.wait(0.05):
                    continue  # stalled: read nothing, forward nothing
                readable, _, _ = select.select([source], [], [], 0.05)
                if not readable:
                    continue
                data = source.recv(65536)
                if not data:
                    break
                delay = self._delay if answers or not self._answers_only else 0.0
                if delay:
                    time.sleep(delay)  # the injected latency
                while not (flowing.wait(0.05) and (not answers or link.answering.wait(0.05))):
                    if link.closed.is_set():
                        return
                target.sendall(data)
        except (OSError, ValueError):
            pass
        finally:
            link.close()
            with self._lock:
                self._links.discard(link)
