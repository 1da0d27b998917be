"""Sandbox side of ``network: gateway``: loopback TCP port -> unix socket, byte for byte.

Run as a script by the runtime's network holder (standard library only, ``python3 -S -I``)::

    python3 -S -I relay_inside.py PORT SOCKET

It listens on ``127.0.0.1:PORT`` in the sandbox's network namespace, prints ``ready`` on
stdout once listening, and relays every connection to the unix socket ``SOCKET``, where the
host side (:mod:`rolloutd.sandbox.runtimes.gateway_relay`) checks each request. It does no
filtering itself: it runs inside the sandbox's namespace and is not trusted.
"""

from __future__ import annotations

import socket
import sys
import threading


def pipe(src: socket.socket, dst: socket.socket) -> None:
    """Copy ``src`` to ``dst`` until EOF or an error, then half-close ``dst``."""
    try:
        while data := src.recv(65536):
            dst.sendall(data)
    except OSError:
        pass  # the other side went away: the connection ends either way
    finally:
        try:
            dst.shutdown(socket.SHUT_WR)
        except OSError:
            pass  # already closed


def serve(client: socket.socket, socket_path: str) -> None:
    """Relay one accepted connection to the unix socket."""
    upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        upstream.connect(socket_path)
    except OSError:
        client.close()
        upstream.close()
        return
    back = threading.Thread(target=pipe, args=(upstream, client), daemon=True)
    back.start()
    pipe(client, upstream)
    back.join()
    client.close()
    upstream.close()


def main(argv: list[str]) -> int:
    """Listen and relay for ever (until killed with the sandbox)."""
    port, socket_path = int(argv[1]), argv[2]
    listener = socket.create_server(("127.0.0.1", port), backlog=128)
    print("ready", flush=True)
    while True:
        client, _ = listener.accept()
        threading.Thread(target=serve, args=(client, socket_path), daemon=True).start()


if __name__ == "__main__":
    sys.exit(main(sys.argv))
