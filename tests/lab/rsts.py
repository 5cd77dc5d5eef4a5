#!/usr/bin/env python3
"""Makes RSTs of three kinds in its own network namespace, N of each, and prints what it saw
from its own sockets as one JSON line:

- refused: connects to ports nothing listens on, half to 127.0.0.1 and half to ::1 (the
  namespace answers each SYN with a socket-less RST; the connect fails ECONNREFUSED);
- aborts: SO_LINGER 0 closes of connected sockets (the accepted end's recv fails ECONNRESET);
- peer_closed: sends to a connection whose other end had closed (the closed end answers the
  data with a RST; the next send fails EPIPE or ECONNRESET).
"""

import errno
import json
import socket
import struct
import sys
import time

N = int(sys.argv[1]) if len(sys.argv) > 1 else 40
seen = {"refused": 0, "aborts": 0, "peer_closed": 0, "unexpected": []}


def closed_port(family, host):
    """A port bound once and released without listen(): nothing answers it."""
    s = socket.socket(family, socket.SOCK_STREAM)
    s.bind((host, 0))
    port = s.getsockname()[1]
    s.close()
    return port


def refused(family, host):
    s = socket.socket(family, socket.SOCK_STREAM)
    try:
        s.connect((host, closed_port(family, host)))
        seen["unexpected"].append("a connect to a closed port succeeded")
    except ConnectionRefusedError:
        seen["refused"] += 1
    finally:
        s.close()


def pair(listener):
    c = socket.create_connection(listener.getsockname()[:2])
    a, _ = listener.accept()
    return c, a


def abort(listener):
    c, a = pair(listener)
    c.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    c.close()
    try:
        if a.recv(16) == b"":
            seen["unexpected"].append("an aborted connection read EOF")
    except ConnectionResetError:
        seen["aborts"] += 1
    a.close()


def peer_closed(listener):
    c, a = pair(listener)
    a.close()
    time.sleep(0.005)  # the FIN arrives
    try:
        c.send(b"x")  # answered with a RST by the closed end
        time.sleep(0.005)
        c.send(b"y")
        seen["unexpected"].append("a send after the peer's RST succeeded")
    except (BrokenPipeError, ConnectionResetError):
        seen["peer_closed"] += 1
    except OSError as e:
        seen["unexpected"].append(errno.errorcode.get(e.errno, str(e)))
    c.close()


def main():
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    for i in range(N):
        if i % 2 == 0:
            refused(socket.AF_INET, "127.0.0.1")
        else:
            refused(socket.AF_INET6, "::1")
    for _ in range(N):
        abort(listener)
    for _ in range(N):
        peer_closed(listener)
    listener.close()
    print(json.dumps(seen), flush=True)


if __name__ == "__main__":
    main()
