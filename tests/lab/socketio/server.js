// A Socket.IO server as a new user writes it (socket.io 4.8, default options): no SIGTERM
// handler, an `io.use` middleware authorising each connection, and nothing else. Run by the
// Socket.IO lab (tests/src/lab/socketio) in a podman container with the host's Node.
//
// The authorisation is I/O-bound (`--auth io`: a pool of `--pool` connections in front of an
// indexed query taking `--io-ms`: at most 10 concurrent 20 ms waits by default) or CPU-bound
// (`--auth cpu`: PBKDF2-SHA256 of `--cpu-iterations`, synchronous, on the event loop).
//
// `--listen-delay-ms`: what it does before it listens (connecting to its database, loading
// configuration): a replacement routed to before then refuses connections.
//
// The lab's additions are only its log (`--log FILE`), one line per event, every timestamp
// `process.hrtime.bigint()` (CLOCK_MONOTONIC on Linux, the clock of the agent and the lab),
// written synchronously so that a process killed by SIGTERM's default action loses nothing:
//   started NS PID                   the server's code runs
//   listening NS PID AUTH            it listens
//   accept NS PORT                   the http server's 'connection' (accept() returned to JS)
//   auth-start NS CLIENT ATTEMPT PORT TRANSPORT   the middleware ran for a connection
//   auth-run NS CLIENT               it got a pool connection (io) / began hashing (cpu)
//   auth-end NS CLIENT               authorised
//   connect NS CLIENT                the socket connected (after the middleware)
//   disconnect NS CLIENT REASON      it disconnected
//   tick NS ACTIVE_NS ELAPSED_NS WAITERS   every 50 ms: event-loop busy time, pool waiters max

"use strict";

const crypto = require("crypto");
const fs = require("fs");
const http = require("http");
const { performance } = require("perf_hooks");
const { Server } = require("socket.io");

function arg(name, dflt) {
  const i = process.argv.indexOf(`--${name}`);
  return i > 0 && i + 1 < process.argv.length ? process.argv[i + 1] : dflt;
}

const port = Number(arg("port", "8080"));
const auth = arg("auth", "io");
const poolSize = Number(arg("pool", "10"));
const ioMs = Number(arg("io-ms", "20"));
const cpuIterations = Number(arg("cpu-iterations", "20000"));
const listenDelayMs = Number(arg("listen-delay-ms", "0"));
// The engine's ping period (the library's default 25 s when absent).
const pingIntervalMs = arg("ping-interval-ms");
const logFd = fs.openSync(arg("log", "/lab/log/server.log"), "a");

const now = () => process.hrtime.bigint();
function log(...fields) {
  fs.writeSync(logFd, fields.join(" ") + "\n");
}

// A connection pool in front of the authorisation query: `size` at a time, the rest queue.
class Pool {
  constructor(size) {
    this.free = size;
    this.waiting = [];
    this.maxWaiting = 0;
  }
  acquire() {
    if (this.free > 0) {
      this.free--;
      return Promise.resolve();
    }
    return new Promise((resolve) => {
      this.waiting.push(resolve);
      this.maxWaiting = Math.max(this.maxWaiting, this.waiting.length);
    });
  }
  release() {
    const next = this.waiting.shift();
    if (next) next();
    else this.free++;
  }
}

const pool = new Pool(poolSize);
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

async function authorise(client, token) {
  if (auth === "cpu") {
    log("auth-run", now(), client);
    // A password-hash check done the simple way: synchronously.
    crypto.pbkdf2Sync(String(token), "drainwatch-lab", cpuIterations, 32, "sha256");
    return;
  }
  await pool.acquire();
  log("auth-run", now(), client);
  try {
    await sleep(ioMs); // the indexed query
  } finally {
    pool.release();
  }
}

const httpServer = http.createServer();
httpServer.on("connection", (s) => log("accept", now(), s.remotePort));

const io = new Server(httpServer, pingIntervalMs ? { pingInterval: Number(pingIntervalMs) } : {});

io.use(async (socket, next) => {
  const a = socket.handshake.auth || {};
  const client = a.client ?? -1;
  const req = socket.conn.request;
  const remotePort = req && req.socket ? req.socket.remotePort : 0;
  log("auth-start", now(), client, a.attempt ?? -1, remotePort, socket.conn.transport.name);
  socket.data.client = client;
  try {
    await authorise(client, a.token ?? client);
  } catch (e) {
    return next(e);
  }
  log("auth-end", now(), client);
  next();
});

io.on("connection", (socket) => {
  const client = socket.data.client;
  log("connect", now(), client);
  socket.on("disconnect", (reason) => log("disconnect", now(), client, reason.replace(/ /g, "_")));
});

// How busy the event loop was, and the pool's queue, every 50 ms.
let elu = performance.eventLoopUtilization();
let last = now();
setInterval(() => {
  const cur = performance.eventLoopUtilization();
  const e = performance.eventLoopUtilization(cur, elu);
  elu = cur;
  const t = now();
  log("tick", t, Math.round(e.active * 1e6), t - last, pool.maxWaiting);
  pool.maxWaiting = pool.waiting.length;
  last = t;
}, 50);

log("started", now(), process.pid);
setTimeout(() => httpServer.listen(port, () => log("listening", now(), process.pid, auth)), listenDelayMs);
