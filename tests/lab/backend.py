#!/usr/bin/env python3
"""drainwatch lab backend: a small threaded HTTP/1.1 server whose SIGTERM behaviour is chosen
by --mode, so end-to-end tests can reproduce each deploy-time failure mode on purpose.

Python 3 standard library only; runs inside a busybox container through the host's python
(read-only bind mounts of /usr, /lib, /lib64).

Endpoints
  GET /health          200 "ok", or 503 "draining" once readiness is withdrawn
  GET /work?ms=N&id=ID logs "start ID <ns>", sleeps N ms, logs "end ID <ns>", answers 200 "ID"
  POST /work?ms=N&id=ID the same; the body (Content-Length bytes) is read and ignored

Logs (in --log-dir, one line per record, flushed at once; <ns> is CLOCK_MONOTONIC in
nanoseconds, the host's clock too as containers get no time namespace)
  requests.log  start ID <ns> / end ID <ns>
  health.log    health <ns> <status> <user-agent, or - (HAProxy's checks send none)> <peer port>
  events.log    listening, sigterm, not-ready, listener-closed, idle-closed, drained, crash, exit;
                conn-open and conn-close <ns> <peer port> for every connection served

Modes
  no-handler      no SIGTERM handler: under `podman run --init` the forwarded SIGTERM kills the
                  process by its default action (exit 143)
  close-listener  SIGTERM: close the listening socket at once, finish in-flight, exit 0
  exit-zero       SIGTERM: exit 0 at once, the listener still open and in-flight work cut
  drain           SIGTERM: /health answers 503 and every response carries Connection: close,
                  keep serving --drain-delay seconds, close the listener and idle keep-alive
                  connections, finish in-flight, exit 0
  slow            SIGTERM: /health answers 503, keep serving --drain-delay seconds (default 0),
                  close the listener, then wait for in-flight work however long it takes
                  (work longer than the grace period gets the container SIGKILLed: exit 137)
  keep-alive      SIGTERM: /health answers 503, close the listener, keep serving the open
                  keep-alive connections and exit 0 only once every connection has ended, idle
                  ones too (Node's server.close() without closeIdleConnections): with clients
                  reusing their connections it never does and is SIGKILLed at the deadline
  crash           no handler; exits by itself with code 1 (no signal) --crash-after seconds
                  after start, or at the CLOCK_MONOTONIC nanosecond written to --crash-at-file
                  (--crash-code 0: its work done, a normal exit)
  stream          server-sent events: GET /events answers 200 text/event-stream and sends
                  "data: N" every --event-ms ms; at its lifetime after it opened, a final
                  "event: rotate" and the server closes the stream (a write timeout, a token's
                  expiry: each stream ends at its own deadline). Each stream's lifetime is
                  --rotation seconds, or drawn uniformly in [--lifetime-min x --rotation,
                  --rotation] (--seed). SIGTERM: /health 503, close the listener, then with
                  --stream-drain timers (the default) let open streams run to their deadlines
                  (the Mercure-style drain), with at-once end every open stream at once with its
                  final event; exit 0 once none is left. A --hold-port listener is closed with
                  the other (connections in its queue are reset then). events.log gets
                  stream-open <ns> <peer port> <lifetime ns> and
                  stream-end <ns> <peer port> <events> <deadline|sigterm|error>
  gate            not HTTP: a socket service with a bounded connect path, for reconnect
                  storms. --workers threads each accept() one connection, "authorise" it for
                  --auth-ms, send one greeting line "hello NAME ACCEPTED_NS SENT_NS" and keep the
                  connection open: at most workers / auth-ms connects per second (10 / 20 ms =
                  500/s). No SIGTERM handler: dies at once under --init (exit 143)
"""

import argparse
import os
import random
import signal
import socket
import sys
import threading
import time
from urllib.parse import parse_qs, urlsplit

MODES = (
    "no-handler",
    "close-listener",
    "exit-zero",
    "drain",
    "slow",
    "keep-alive",
    "crash",
    "gate",
    "stream",
)


def now_ns():
    return time.monotonic_ns()


class Log:
    """An append-only line log, flushed after every line, safe across threads."""

    def __init__(self, path):
        self.f = open(path, "a", buffering=1)
        self.lock = threading.Lock()

    def line(self, *parts):
        text = " ".join(str(p) for p in parts) + "\n"
        with self.lock:
            self.f.write(text)
            self.f.flush()


class Terminate(Exception):
    pass


class Server:
    def __init__(self, args):
        self.args = args
        self.mode = args.mode
        self.requests = Log(os.path.join(args.log_dir, "requests.log"))
        self.health = Log(os.path.join(args.log_dir, "health.log"))
        self.events = Log(os.path.join(args.log_dir, "events.log"))
        self.ready = True
        self.closing = False  # answer with Connection: close (drain)
        # Busy = connections accepted and not yet idle between keep-alive requests.
        self.busy = 0
        self.idle = set()
        self.cv = threading.Condition()
        # stream: lifetimes drawn per stream; set on SIGTERM with --stream-drain at-once.
        self.rng = random.Random(args.seed)
        self.end_streams = threading.Event()
        self.lsock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.lsock.bind((args.bind, args.port))
        self.lsock.listen(args.backlog)
        # gate: the connections it greeted, kept open until the process exits.
        self.held = []
        # A second listener that never accepts (--hold-port): its queue fills and overflows.
        self.hold = None
        if args.hold_port:
            self.hold = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            self.hold.bind((args.bind, args.hold_port))
            self.hold.listen(args.hold_backlog)

    # -- connection handling -------------------------------------------------------------

    def accept_loop(self):
        while True:
            try:
                conn, peer = self.lsock.accept()
            except OSError:
                return  # listener shut down
            self.events.line("conn-open", now_ns(), peer[1])
            with self.cv:
                self.busy += 1
            threading.Thread(target=self.serve_conn, args=(conn, peer[1]), daemon=True).start()

    def set_idle(self, conn, idle):
        with self.cv:
            if idle:
                self.busy -= 1
                self.idle.add(conn)
                self.cv.notify_all()
            else:
                self.idle.discard(conn)
                self.busy += 1

    def serve_conn(self, conn, port):
        buf = b""
        busy = True
        try:
            while True:
                while b"\r\n\r\n" not in buf:
                    try:
                        data = conn.recv(65536)
                    except OSError:
                        return
                    if not data:
                        return
                    if not busy:
                        self.set_idle(conn, False)
                        busy = True
                    buf += data
                head, buf = buf.split(b"\r\n\r\n", 1)
                lines = head.decode("latin-1").split("\r\n")
                try:
                    method, target, version = lines[0].split(" ", 2)
                except ValueError:
                    return
                headers = {}
                for raw in lines[1:]:
                    if ":" in raw:
                        k, v = raw.split(":", 1)
                        headers[k.strip().lower()] = v.strip().lower()
                keep = version == "HTTP/1.1" and headers.get("connection") != "close"
                # A request body (POST) is read in full and ignored; GETs carry none.
                try:
                    length = int(headers.get("content-length", "0"))
                except ValueError:
                    return
                if length < 0:
                    return
                while len(buf) < length:
                    try:
                        data = conn.recv(65536)
                    except OSError:
                        return
                    if not data:
                        return
                    buf += data
                buf = buf[length:]
                if self.mode == "stream" and urlsplit(target).path == "/events":
                    self.stream(conn, port)
                    return
                status, body = self.handle(method, target, headers, port)
                if self.closing:
                    keep = False
                reason = {200: "OK", 404: "Not Found", 405: "Method Not Allowed"}.get(
                    status, "Service Unavailable"
                )
                resp = (
                    f"HTTP/1.1 {status} {reason}\r\n"
                    f"Content-Type: text/plain\r\n"
                    f"Content-Length: {len(body)}\r\n"
                    f"X-Backend: {self.args.name}\r\n"
                    f"Connection: {'keep-alive' if keep else 'close'}\r\n\r\n"
                ).encode("latin-1") + body
                try:
                    conn.sendall(resp)
                except OSError:
                    return
                if not keep:
                    return
                if not buf:
                    self.set_idle(conn, True)
                    busy = False
        finally:
            try:
                conn.close()
            except OSError:
                pass
            self.events.line("conn-close", now_ns(), port)
            with self.cv:
                if busy:
                    self.busy -= 1
                self.idle.discard(conn)
                self.cv.notify_all()

    def handle(self, method, target, headers, port):
        url = urlsplit(target)
        if method != "GET" and not (method == "POST" and url.path == "/work"):
            return 405, b"GET only\n"
        if url.path == "/health":
            status = 200 if self.ready else 503
            agent = headers.get("user-agent", "-").replace(" ", "_") or "-"
            self.health.line("health", now_ns(), status, agent, port)
            return status, (b"ok\n" if status == 200 else b"draining\n")
        if url.path == "/work":
            q = parse_qs(url.query)
            ms = int(q.get("ms", ["0"])[0])
            rid = q.get("id", ["-"])[0]
            self.requests.line("start", rid, now_ns())
            time.sleep(ms / 1000.0)
            self.requests.line("end", rid, now_ns())
            return 200, rid.encode("latin-1")
        return 404, b"not found\n"

    def stream(self, conn, port):
        """One event stream, to its own deadline (then a final event and the close)."""
        opened = now_ns()
        rot = self.args.rotation
        with self.cv:
            lifetime = self.rng.uniform(self.args.lifetime_min * rot, rot)
        deadline = opened + int(lifetime * 1e9)
        period = self.args.event_ms / 1000.0
        self.events.line("stream-open", opened, port, deadline - opened)
        head = (
            "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
            f"X-Backend: {self.args.name}\r\nConnection: close\r\n\r\n"
        )
        sent = 0
        why = "deadline"
        try:
            conn.sendall(head.encode("latin-1"))
            while True:
                left = (deadline - now_ns()) / 1e9
                if left <= 0:
                    break
                # An at-once drain wakes every stream at once.
                if self.end_streams.wait(min(period, left)):
                    why = "sigterm"
                    break
                if now_ns() >= deadline:
                    break
                sent += 1
                conn.sendall(f"data: {sent}\n\n".encode())
            conn.sendall(b"event: rotate\ndata: bye\n\n")
        except OSError:
            why = "error"
        self.events.line("stream-end", now_ns(), port, sent, why)

    def gate_worker(self):
        """One "authorisation" at a time: accept, work --auth-ms, greet, keep the connection."""
        auth = self.args.auth_ms / 1000.0
        while True:
            try:
                conn, _ = self.lsock.accept()
            except OSError:
                return
            accepted = now_ns()
            time.sleep(auth)
            try:
                conn.sendall(f"hello {self.args.name} {accepted} {now_ns()}\n".encode())
            except OSError:
                conn.close()
                continue
            with self.cv:
                self.held.append(conn)

    # -- shutdown ------------------------------------------------------------------------

    def close_listener(self):
        # shutdown() wakes the blocked accept() and moves the socket out of LISTEN, so new
        # SYNs are answered with RST from here on; close() alone would not wake accept().
        try:
            self.lsock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.lsock.close()
        self.events.line("listener-closed", now_ns())

    def close_idle(self):
        with self.cv:
            idle = list(self.idle)
        for conn in idle:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self.events.line("idle-closed", now_ns(), len(idle))

    def wait_drained(self):
        with self.cv:
            while self.busy > 0:
                self.cv.wait()
        self.events.line("drained", now_ns())

    def wait_closed(self):
        """Until no connection is left, busy or idle."""
        with self.cv:
            while self.busy > 0 or self.idle:
                self.cv.wait()
        self.events.line("drained", now_ns())

    def exit(self, code):
        self.events.line("exit", now_ns(), code)
        sys.stdout.flush()
        os._exit(code)

    def on_sigterm(self):
        self.events.line("sigterm", now_ns())
        if self.mode == "close-listener":
            self.close_listener()
            self.wait_drained()
            self.exit(0)
        elif self.mode == "exit-zero":
            self.exit(0)
        elif self.mode == "stream":
            self.ready = False
            self.close_listener()
            if self.hold:
                # Its other listener too: what waits in its queue is reset by the close.
                self.hold.close()
                self.events.line("hold-closed", now_ns())
            if self.args.stream_drain == "at-once":
                self.end_streams.set()
            self.wait_drained()
            self.exit(0)
        elif self.mode == "keep-alive":
            self.ready = False
            self.events.line("not-ready", now_ns())
            self.close_listener()
            self.wait_closed()
            self.exit(0)
        elif self.mode in ("drain", "slow"):
            self.ready = False
            if self.mode == "drain":
                self.closing = True
            self.events.line("not-ready", now_ns())
            time.sleep(self.args.drain_delay)
            self.close_listener()
            if self.mode == "drain":
                self.close_idle()
            self.wait_drained()
            self.exit(0)

    def crash_at(self):
        """The deadline written to --crash-at-file, once it is there in full."""
        try:
            with open(self.args.crash_at_file) as f:
                return int(f.read().strip())
        except (OSError, ValueError):
            return None

    def crash_later(self, started):
        deadline = None
        if self.args.crash_after is not None:
            deadline = started + int(self.args.crash_after * 1e9)
        while self.args.crash_at_file:
            at = self.crash_at()
            if at is not None:
                deadline = at if deadline is None else min(deadline, at)
                break
            if deadline is not None and now_ns() >= deadline:
                break
            time.sleep(0.01)
        left = deadline - now_ns()
        if left > 0:
            time.sleep(left / 1e9)
        self.events.line("crash", now_ns())
        self.exit(self.args.crash_code)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mode", required=True, choices=MODES)
    ap.add_argument("--bind", default="0.0.0.0")
    ap.add_argument("--port", type=int, default=8080)
    ap.add_argument("--name", default="backend")
    ap.add_argument("--log-dir", required=True)
    ap.add_argument("--drain-delay", type=float, default=None)
    ap.add_argument("--crash-after", type=float, default=None)
    ap.add_argument("--crash-at-file", default=None)
    ap.add_argument("--crash-code", type=int, default=1)
    ap.add_argument("--backlog", type=int, default=256)
    ap.add_argument("--workers", type=int, default=10, help="gate: concurrent authorisations")
    ap.add_argument("--auth-ms", type=float, default=20.0, help="gate: work per connect")
    ap.add_argument("--hold-port", type=int, default=None)
    ap.add_argument("--hold-backlog", type=int, default=2)
    ap.add_argument("--rotation", type=float, default=6.0, help="stream: seconds per stream")
    ap.add_argument("--event-ms", type=float, default=200.0, help="stream: event period")
    ap.add_argument(
        "--lifetime-min", type=float, default=1.0, help="stream: shortest lifetime / --rotation"
    )
    ap.add_argument("--seed", type=int, default=None, help="stream: lifetimes' random seed")
    ap.add_argument(
        "--stream-drain",
        choices=("timers", "at-once"),
        default="timers",
        help="stream: on SIGTERM let streams run to their deadlines, or end them all at once",
    )
    ap.add_argument("--listen-delay", type=float, default=0.0, help="seconds before listen()")
    args = ap.parse_args()
    if args.mode == "crash" and args.crash_after is None and args.crash_at_file is None:
        ap.error("crash needs --crash-after or --crash-at-file")
    if args.drain_delay is None:
        args.drain_delay = 5.0 if args.mode == "drain" else 0.0

    if args.listen_delay > 0:
        # A slow start: connects before the listen are refused.
        time.sleep(args.listen_delay)
    srv = Server(args)
    handled = args.mode in ("close-listener", "exit-zero", "drain", "slow", "keep-alive", "stream")
    if handled:

        def on_term(signum, frame):
            # Later SIGTERMs are absorbed: the shutdown already runs.
            signal.signal(signal.SIGTERM, lambda s, f: None)
            raise Terminate()

        signal.signal(signal.SIGTERM, on_term)

    started = now_ns()
    if args.mode == "gate":
        for _ in range(args.workers):
            threading.Thread(target=srv.gate_worker, daemon=True).start()
    else:
        threading.Thread(target=srv.accept_loop, daemon=True).start()
    srv.events.line("listening", started, os.getpid(), args.mode)
    if args.mode == "crash":
        threading.Thread(target=srv.crash_later, args=(started,), daemon=True).start()
    try:
        while True:
            time.sleep(3600)
    except Terminate:
        srv.on_sigterm()


if __name__ == "__main__":
    main()
