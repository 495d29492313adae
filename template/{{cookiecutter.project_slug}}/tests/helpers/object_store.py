"""A real S3 API server for the tests (moto's server mode, from PyPI: the S3 API that s3fs and botocore speak, with
conditional writes, in one process that keeps its objects in memory), and a TCP proxy in front of it that can be
slowed to a bandwidth, or stopped, to inject the faults of a network. The tests start both and stop them by PID."""

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def wait_for_port(port: int, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while True:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"nothing listens on port {port}")
        time.sleep(0.1)


class S3Server:
    """moto's S3 server on a free port of 127.0.0.1, in a session of its own, until `stop`."""

    def __init__(self) -> None:
        self.port = free_port()
        executable = shutil.which("moto_server", path=os.path.dirname(sys.executable)) or shutil.which("moto_server")
        self.process = subprocess.Popen(
            [executable, "-H", "127.0.0.1", "-p", str(self.port)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
        )  # fmt: skip
        wait_for_port(self.port)
        self.endpoint = f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()


def client_env(endpoint: str) -> dict[str, str]:
    """The standard settings every AWS client reads (s3fs's botocore, boto3): the endpoint and test credentials."""
    return {"AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test",
            "AWS_DEFAULT_REGION": "us-east-1"}  # fmt: skip


class TcpProxy:
    """Forwards 127.0.0.1:`port` to `target_port`, in threads of this process. `rate` (bytes a second, None: no
    limit) slows what it forwards in both directions; `stop()` resets every connection and refuses new ones until
    `start()`; `stalled = True` holds everything back, a store that takes requests and never answers. `sent` counts
    the bytes forwarded to the server; `requests` lists the requests begun ("PUT /bucket/key"), in order."""

    REQUEST = re.compile(rb"([A-Z]+ /\S*) HTTP/1\.1\r\n")  # (a request starts a read: the client awaits each answer)

    def __init__(self, target_port: int) -> None:
        self.target_port, self.port = target_port, free_port()
        self.rate: float | None = None
        self.stalled = False
        self.sent = 0
        self.requests: list[str] = []
        self._connections: list[socket.socket] = []
        self._listener: socket.socket | None = None
        self._lock = threading.Lock()
        self.start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def stop(self) -> None:
        """The network is down: what is in flight is cut, and new connections are refused."""
        listener, self._listener = self._listener, None
        if listener is not None:
            with contextlib.suppress(OSError):
                listener.shutdown(socket.SHUT_RDWR)
            listener.close()
        with self._lock:
            for connection in self._connections:
                with contextlib.suppress(OSError):
                    connection.shutdown(socket.SHUT_RDWR)
                connection.close()
            self._connections.clear()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(("127.0.0.1", self.target_port))
            except OSError:
                client.close()
                continue
            with self._lock:
                self._connections += [client, server]
            threading.Thread(target=self._pump, args=(client, server, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, False), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket, upstream: bool) -> None:
        try:
            while data := source.recv(4096 if self.rate is None else max(256, int(self.rate / 20))):
                if upstream and (request := self.REQUEST.match(data)):
                    self.requests.append(request.group(1).decode())
                while self.stalled:
                    time.sleep(0.05)
                if self.rate is not None:
                    time.sleep(len(data) / self.rate)
                sink.sendall(data)
                if upstream:
                    self.sent += len(data)
        except OSError:
            pass
        finally:
            for end in (source, sink):
                with contextlib.suppress(OSError):
                    end.shutdown(socket.SHUT_RDWR)
