// A fleet of Socket.IO clients (socket.io-client 4.8) in one Node process, each with the
// library's default reconnection (1 s ± 50%, doubling to 5 s), run by the Socket.IO lab
// (tests/src/lab/socketio) in a podman container with the host's Node.
//
//   node fleet.js --url http://IP:8080 --clients N --transports websocket|default
//                 --in-flight 100 --dir DIR --bound SECONDS
//
// The first connections are paced (at most `--in-flight` pending at once, as a fleet that
// grew over time); then each client stays connected, and reconnects on its own when its
// session is lost. Every timestamp is `process.hrtime.bigint()` (CLOCK_MONOTONIC on Linux).
//
// Files in DIR: `status` (rewritten every 100 ms: clients up, lost, back), and on request (the
// lab creates `dump`) `clients.log`, then `dumped`:
//   C connect NS ATTEMPT TRANSPORT   connected (the server's middleware passed)
//   C disconnect NS REASON           lost the session
//   C attempt NS N                   reconnect attempt N started (the manager's event)
//   C error NS CODE                  that attempt failed (ECONNREFUSED, EHOSTUNREACH, ...)
//   C reconnect NS N                 reconnected after N attempts
//   C connect_error NS MESSAGE       the middleware refused it
//   C upgrade NS TRANSPORT           the engine upgraded (default transports: to websocket)
//   C ping NS                        the server's ping arrived (the client answers a pong)
//   tcp START CONNECTED LOCAL_PORT   one TCP connection of any client (Node's diagnostics
//                                    channel `net.client.socket`): connect() called, connected
//   tcp-fail START AT CODE           one that never connected
//   fleet NS_CUT NS_BACK CPU_US ELU_ACTIVE_MS ELAPSED_MS LAG_P50_MS LAG_P99_MS LAG_MAX_MS
// The `fleet` line is this process's own load from the first lost session to the last
// client back: CPU time, event-loop utilisation and delay. A busy loop stamps events late.
// The fleet exits after `--bound` seconds whatever happens.

"use strict";

const dc = require("diagnostics_channel");
const fs = require("fs");
const path = require("path");
const { monitorEventLoopDelay, performance } = require("perf_hooks");
const { io } = require("socket.io-client");

function arg(name, dflt) {
  const i = process.argv.indexOf(`--${name}`);
  return i > 0 && i + 1 < process.argv.length ? process.argv[i + 1] : dflt;
}

const url = arg("url");
const n = Number(arg("clients", "500"));
const transports = arg("transports", "websocket") === "websocket" ? ["websocket"] : ["polling", "websocket"];
const inFlight = Number(arg("in-flight", "100"));
const dir = arg("dir", "/lab/log");
const bound = Number(arg("bound", "120"));

const now = () => process.hrtime.bigint();
const events = Array.from({ length: n }, () => []);
const state = Array.from({ length: n }, () => ({ up: false, lost: false, back: false, upgraded: false }));
const counts = { up: 0, lost: 0, back: 0, upgraded: 0 };

// Every TCP connection the clients open (websocket, each polling request): the lab joins them
// to the server's accepts by port.
const tcp = [];
dc.subscribe("net.client.socket", ({ socket }) => {
  const start = now();
  let connected = false;
  socket.once("connect", () => {
    connected = true;
    tcp.push(`tcp ${start} ${now()} ${socket.localPort}`);
  });
  socket.once("error", (e) => {
    if (!connected) tcp.push(`tcp-fail ${start} ${now()} ${e.code || "error"}`);
  });
});

let cut = null; // first lost session: [ns, cpu, elu]
let allBack = null;
const lag = monitorEventLoopDelay({ resolution: 10 });

// The errno behind a failed attempt: ws's ErrorEvent (websocket), the xhr's Error (polling).
function errorCode(err) {
  const d = err && err.description;
  const c = err && err.context;
  return (
    (d && d.error && d.error.code) ||
    (c && c.statusText && c.statusText.code) ||
    (d && d.code) ||
    String((err && err.message) || err).replace(/ /g, "_")
  );
}

let pending = 0;
let next = 0;

function startOne() {
  const i = next++;
  pending++;
  const ev = events[i];
  const st = state[i];
  const socket = io(url, {
    forceNew: true, // one manager (one connection) per client: io() would share one per URL
    transports,
    auth: (cb) => cb({ client: i, attempt: socket.io.backoff.attempts }),
  });
  socket.on("connect", () => {
    ev.push(`connect ${now()} ${socket.io.backoff.attempts} ${socket.io.engine.transport.name}`);
    if (!st.up) {
      st.up = true;
      counts.up++;
      pending--;
      fill();
    } else if (st.lost && !st.back) {
      st.back = true;
      counts.back++;
      if (counts.back === counts.lost && counts.lost === n) {
        allBack = [now(), process.cpuUsage(), performance.eventLoopUtilization()];
        lag.disable();
      }
    }
  });
  socket.on("disconnect", (reason) => {
    const t = now();
    ev.push(`disconnect ${t} ${reason.replace(/ /g, "_")}`);
    if (!cut) {
      cut = [t, process.cpuUsage(), performance.eventLoopUtilization()];
      lag.reset();
      lag.enable();
    }
    if (!st.lost) {
      st.lost = true;
      counts.lost++;
    }
  });
  socket.io.on("open", () => {
    socket.io.engine.once("upgrade", (t) => {
      ev.push(`upgrade ${now()} ${t.name}`);
      if (!st.upgraded) {
        st.upgraded = true;
        counts.upgraded++;
      }
    });
  });
  socket.io.on("ping", () => ev.push(`ping ${now()}`));
  socket.on("connect_error", (err) => ev.push(`connect_error ${now()} ${String(err.message).replace(/ /g, "_")}`));
  socket.io.on("reconnect_attempt", (k) => ev.push(`attempt ${now()} ${k}`));
  socket.io.on("reconnect_error", (err) => ev.push(`error ${now()} ${errorCode(err)}`));
  socket.io.on("reconnect", (k) => ev.push(`reconnect ${now()} ${k}`));
}

function fill() {
  while (next < n && pending < inFlight) startOne();
}

function writeAtomic(name, text) {
  const tmp = path.join(dir, `.${name}.tmp`);
  fs.writeFileSync(tmp, text);
  fs.renameSync(tmp, path.join(dir, name));
}

function dump() {
  const lines = [];
  events.forEach((ev, i) => ev.forEach((e) => lines.push(`${i} ${e}`)));
  lines.push(...tcp);
  if (cut) {
    const end = allBack || [now(), process.cpuUsage(), performance.eventLoopUtilization()];
    const cpu = end[1].user - cut[1].user + end[1].system - cut[1].system;
    const elu = performance.eventLoopUtilization(end[2], cut[2]);
    const ms = (v) => (v / 1e6).toFixed(3);
    lines.push(
      `fleet ${cut[0]} ${end[0]} ${cpu} ${elu.active.toFixed(3)} ${ms(Number(end[0] - cut[0]))} ` +
        `${ms(lag.percentile(50))} ${ms(lag.percentile(99))} ${ms(lag.max)}`,
    );
  }
  writeAtomic("clients.log", lines.join("\n") + "\n");
  writeAtomic("dumped", "");
}

let dumped = false;
setInterval(() => {
  writeAtomic("status", JSON.stringify(counts) + "\n");
  if (!dumped && fs.existsSync(path.join(dir, "dump"))) {
    dumped = true;
    dump();
  }
}, 100);

setTimeout(() => process.exit(0), bound * 1000);
fill();
