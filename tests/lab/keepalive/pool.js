#!/usr/bin/env node
// drainwatch lab: keep-alive clients sharing one connection pool that checks a connection
// before reuse: Node's own http.Agent ({keepAlive: true}), the pool behind Node's http.request
// (and of most Node HTTP clients). While a socket waits in the pool, Node keeps reading it: a
// FIN from the server closes it and the Agent drops it, so the next request opens a new
// connection. The race remains: a FIN that arrives after the request was written.
//
// Node core only (no npm package). Runs on the host; talks only to the address it is given.
//
// Usage: node pool.js --host H --port P --clients N --seed S --gap-min MS --gap-max MS
//                     --work-min MS --work-max MS --for-ms MS --log FILE
//
// N loops share one Agent (maxSockets N, so each loop has a connection when it asks): each
// sends GET /work?ms=W&id=ID, waits 0-gap ms, and again, until a request fails, the server
// answers `Connection: close` (the client is told to move on) or --for-ms has passed. No retry:
// Node's http client never re-sends a request by itself.
//
// Log (JSON lines, CLOCK_MONOTONIC nanoseconds as strings, the clock of the backend's logs):
//   {"req": ID, "sent": NS, "ended": NS, "reused": BOOL, "port": LOCAL_PORT, "ok": BOOL,
//    "status": N, "close": BOOL, "code": ERRNO_OR_NULL}
//   {"idle_fin": LOCAL_PORT, "at": NS}   a pooled (idle) connection the server closed: dropped
// stdout: "ready" once every loop has had its first answer.

"use strict";
const http = require("http");
const fs = require("fs");

function args() {
  const a = {};
  const v = process.argv.slice(2);
  for (let i = 0; i < v.length; i += 2) a[v[i].replace(/^--/, "")] = v[i + 1];
  for (const k of ["port", "clients", "seed", "gap-min", "gap-max", "work-min", "work-max", "for-ms"])
    a[k] = Number(a[k]);
  return a;
}

// mulberry32: a small seeded PRNG, one per loop.
function rng(seed) {
  let s = seed >>> 0;
  return (lo, hi) => {
    s = (s + 0x6d2b79f5) >>> 0;
    let t = s;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    const u = ((t ^ (t >>> 14)) >>> 0) / 4294967296;
    return lo + Math.floor(u * (hi - lo + 1));
  };
}

const now = () => process.hrtime.bigint().toString();
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

const a = args();
const fd = fs.openSync(a.log, "a");
const log = (o) => fs.writeSync(fd, JSON.stringify(o) + "\n");
const agent = new http.Agent({ keepAlive: true, maxSockets: a.clients, scheduling: "lifo" });
const until = Date.now() + a["for-ms"];

function request(id, ms) {
  return new Promise((resolve) => {
    const sent = now();
    let port = null;
    let done = false;
    const req = http.request({
      host: a.host,
      port: a.port,
      path: `/work?ms=${ms}&id=${id}`,
      agent,
      headers: { "User-Agent": "keepalive-pool" },
      timeout: 10000,
    });
    const finish = (r) => {
      if (done) return;
      done = true;
      const rec = { req: id, sent, ended: now(), reused: !!req.reusedSocket, port, ...r };
      log(rec);
      resolve(rec);
    };
    req.on("socket", (s) => {
      if (!s.poolWatched) {
        // Seen once per connection: a FIN while it waits in the pool (no request on it).
        s.poolWatched = true;
        s.on("end", () => {
          if (!s._httpMessage) log({ idle_fin: s.localPort ?? null, at: now() });
        });
      }
      if (s.localPort) port = s.localPort;
      else s.once("connect", () => (port = s.localPort));
    });
    req.on("response", (res) => {
      let body = "";
      res.setEncoding("latin1");
      res.on("data", (c) => (body += c));
      res.on("end", () =>
        finish({
          ok: res.statusCode === 200 && body === id,
          status: res.statusCode,
          close: (res.headers.connection || "").toLowerCase() === "close",
          code: null,
        }),
      );
      res.on("aborted", () => finish({ ok: false, status: res.statusCode, close: true, code: "aborted" }));
      res.on("error", (e) => finish({ ok: false, status: res.statusCode, close: true, code: e.code || String(e) }));
    });
    req.on("error", (e) => finish({ ok: false, status: 0, close: true, code: e.code || String(e) }));
    req.on("timeout", () => req.destroy(Object.assign(new Error("timeout"), { code: "ETIMEDOUT" })));
    req.end();
  });
}

let first = 0;
async function loop(n) {
  const draw = rng(a.seed * 1000 + n);
  for (let k = 0; Date.now() < until; k++) {
    const r = await request(`p${n}-${k}`, draw(a["work-min"], a["work-max"]));
    if (k === 0 && ++first === a.clients) process.stdout.write("ready\n");
    if (!r.ok || r.close) return;
    await sleep(draw(a["gap-min"], a["gap-max"]));
  }
}

Promise.all(Array.from({ length: a.clients }, (_, n) => loop(n))).then(() => {
  agent.destroy();
  fs.closeSync(fd);
  process.exit(0);
});
