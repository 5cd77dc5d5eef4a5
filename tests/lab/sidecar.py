#!/usr/bin/env python3
"""A pilot-agent-like wrapper: PID 1 of the lab's mesh-sidecar container.

It runs nginx (master and one worker, `daemon off`) from the lab directory `--dir` (its prefix:
nginx.conf, error.log, access.log), as Istio's pilot-agent runs Envoy. On SIGTERM it keeps the
proxy serving `--drain` seconds (pilot-agent's terminationDrainDuration, Linkerd's
`waitBeforeExitSeconds`), then asks nginx to quit gracefully (SIGQUIT: it closes its
listener and finishes the requests it holds) and exits 0 once nginx has.

wrapper.log, one line each: `<CLOCK_MONOTONIC ns> <event> [detail]`, events `started <nginx
pid>`, `sigterm`, `quit`, `nginx-exit <code>`, `exit <code>`.
"""

import argparse
import os
import signal
import subprocess
import sys
import time


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", required=True)
    ap.add_argument("--drain", type=float, default=3.0)
    ap.add_argument("--nginx", default="/usr/sbin/nginx")
    args = ap.parse_args()

    log_file = open(os.path.join(args.dir, "wrapper.log"), "a", buffering=1)

    def log(event, detail=""):
        log_file.write(f"{time.monotonic_ns()} {event} {detail}".rstrip() + "\n")

    term = []
    # PID 1 of its container: the kernel delivers SIGTERM only because a handler is installed.
    signal.signal(signal.SIGTERM, lambda *_: term.append(time.monotonic_ns()))

    out = open(os.path.join(args.dir, "output.log"), "a")
    d = args.dir.rstrip("/")
    nginx = subprocess.Popen(
        [args.nginx, "-p", d + "/", "-c", d + "/nginx.conf", "-e", d + "/error.log",
         "-g", "daemon off;"],
        stdin=subprocess.DEVNULL, stdout=out, stderr=out,
    )
    log("started", str(nginx.pid))
    while not term:
        code = nginx.poll()
        if code is not None:
            # The proxy died by itself: the container ends with it, as pilot-agent's does.
            log("nginx-exit", str(code))
            log("exit", "1")
            sys.exit(1)
        time.sleep(0.01)
    log("sigterm")
    deadline = term[0] / 1e9 + args.drain
    while time.monotonic() < deadline and nginx.poll() is None:
        time.sleep(0.01)
    log("quit")
    if nginx.poll() is None:
        nginx.send_signal(signal.SIGQUIT)
    code = nginx.wait()
    log("nginx-exit", str(code))
    log("exit", "0")
    sys.exit(0)


if __name__ == "__main__":
    main()
