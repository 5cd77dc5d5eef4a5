"""A client in a network namespace of its own (a podman container) whose connects to a stopped
container's address fail late, as a node's proxy's did (issue 42): its neighbour cache still
holds the server's link-layer address, so its SYNs go out to a port that is no longer on the
bridge, nothing answers, and the kernel gives up only after its SYN retries, or when ARP gives
up on the old neighbour.

    late_client.py ADDR PORT BEAT_MS COUNT

1. warm: connects to ADDR:PORT (each closed at once) every 100 ms until the file `hold` appears
   in /lab/log (the neighbour entry stays confirmed up to the stop), then writes `held`;
2. waits for the file `go` (the test has stopped the server);
3. makes COUNT attempts BEAT_MS apart, each a blocking connect() with no timeout of its own (the
   kernel decides), each in its own thread, and logs every one:
   `attempt <connect() start ns> <end ns> <connected|ERRNO name>` (CLOCK_MONOTONIC);
4. `done` once all have ended.

Everything is bounded: 60 s of warming or waiting at most, COUNT attempts.
"""

import errno
import os
import socket
import sys
import threading
import time

LOG = "/lab/log"


def log(line):
    with open(os.path.join(LOG, "client.log"), "a") as f:
        f.write(line + "\n")
        f.flush()


def wait_file(name, deadline, each=None):
    while not os.path.exists(os.path.join(LOG, name)):
        if time.monotonic() > deadline:
            log("timeout waiting for " + name)
            sys.exit(2)
        if each:
            each()
        time.sleep(0.01 if each is None else 0.1)


def main():
    addr, port, beat_ms, count = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])

    def warm():
        s = socket.socket()
        try:
            s.settimeout(1)
            s.connect((addr, port))
            log("warm ok")
        except OSError as e:
            log("warm " + errno.errorcode.get(e.errno or 0, str(e)))
        finally:
            s.close()

    warm()
    wait_file("hold", time.monotonic() + 60, warm)
    log("held")
    wait_file("go", time.monotonic() + 60)

    def attempt():
        s = socket.socket()
        start = time.monotonic_ns()
        try:
            s.connect((addr, port))
            result = "connected"
        except OSError as e:
            result = errno.errorcode.get(e.errno or 0, "unknown")
        end = time.monotonic_ns()
        s.close()
        log("attempt %d %d %s" % (start, end, result))

    threads = []
    next_at = time.monotonic()
    for _ in range(count):
        delay = next_at - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        t = threading.Thread(target=attempt)
        t.start()
        threads.append(t)
        next_at += beat_ms / 1000.0
    for t in threads:
        t.join()
    log("done")


main()
