"""What the escape tests of the bwrap and podman runtimes share: the clients they run inside
the sandbox (the fake gateway they reach is the ``gateway`` fixture of tests/sandbox)."""

from __future__ import annotations

#: a Python client run inside the sandbox: prints one line per URL, "OK <body>" or "ERR <why>".
FETCH = """
import sys, urllib.request
for url in sys.argv[1:]:
    try:
        print("OK", urllib.request.urlopen(url, timeout=3).read().decode())
    except Exception as e:
        print("ERR", type(e).__name__, getattr(e, "code", ""))
"""

#: connects to (host, port) pairs; prints "OK" or "ERR <errno name>" per pair.
CONNECT = """
import errno, socket, sys
for target in sys.argv[1:]:
    host, port = target.rsplit(":", 1)
    host = host.strip("[]")
    try:
        socket.create_connection((host, int(port)), timeout=2).close()
        print("OK")
    except OSError as e:
        print("ERR", errno.errorcode.get(e.errno, type(e).__name__))
"""
