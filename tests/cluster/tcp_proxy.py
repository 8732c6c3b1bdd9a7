"""A fault-injecting TCP proxy for cluster tests: it forwards a loopback port to another, and `cut()`
drops every connection through it and refuses new ones until `heal()`, as a network partition between
the two sides would (both directions at once)."""

from __future__ import annotations

import selectors
import socket
import threading


class TcpProxy:
    def __init__(self, target_port: int, host: str = "127.0.0.1") -> None:
        self.target = (host, target_port)
        self.server = socket.create_server((host, 0))
        self.server.setblocking(False)
        self.port = self.server.getsockname()[1]
        self.cut_off = False
        self._pairs: dict[socket.socket, socket.socket] = {}
        self._lock = threading.Lock()
        self._selector = selectors.DefaultSelector()
        self._selector.register(self.server, selectors.EVENT_READ)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name=f"tcp-proxy-{self.port}")
        self._thread.start()

    def cut(self) -> None:
        with self._lock:
            self.cut_off = True
            for s in list(self._pairs):
                self._drop(s)

    def heal(self) -> None:
        with self._lock:
            self.cut_off = False

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        with self._lock:
            for s in list(self._pairs):
                self._drop(s)
        self.server.close()

    def _drop(self, s: socket.socket) -> None:
        other = self._pairs.pop(s, None)
        for sock in (s, other):
            if sock is None:
                continue
            self._pairs.pop(sock, None)
            try:
                self._selector.unregister(sock)
            except (KeyError, ValueError):
                pass
            sock.close()

    def _run(self) -> None:
        while not self._stop.is_set():
            for key, _ in self._selector.select(timeout=0.1):
                sock = key.fileobj
                with self._lock:
                    if sock is self.server:
                        self._accept()
                    elif sock in self._pairs:
                        self._forward(sock)  # type: ignore[arg-type]

    def _accept(self) -> None:
        try:
            client, _ = self.server.accept()
        except BlockingIOError:
            return
        if self.cut_off:
            client.close()
            return
        try:
            upstream = socket.create_connection(self.target, timeout=2)
        except OSError:
            client.close()
            return
        for s in (client, upstream):
            s.setblocking(False)
            self._selector.register(s, selectors.EVENT_READ)
        self._pairs[client] = upstream
        self._pairs[upstream] = client

    def _forward(self, sock: socket.socket) -> None:
        try:
            data = sock.recv(65536)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self._drop(sock)
            return
        try:
            self._pairs[sock].sendall(data)
        except (BlockingIOError, OSError):
            # A slow reader: block briefly rather than lose bytes (tests move little data).
            try:
                peer = self._pairs[sock]
                peer.setblocking(True)
                peer.settimeout(5)
                peer.sendall(data)
                peer.setblocking(False)
            except OSError:
                self._drop(sock)
