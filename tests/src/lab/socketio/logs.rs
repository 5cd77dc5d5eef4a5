//! The Socket.IO lab's own logs, parsed: the server's (`server.js`) and the fleet's
//! (`fleet.js`). Every timestamp is `CLOCK_MONOTONIC` ns (Node's `process.hrtime.bigint()`).
//! Pure: tested on sample lines below.

use std::collections::HashMap;

/// One authorisation, from the server's middleware.
#[derive(Clone, Debug, PartialEq)]
pub struct Auth {
    pub client: i64,
    /// The client's reconnect attempt (0: its first connection).
    pub attempt: i64,
    /// The client's port of the connection that opened the session (the websocket, or the
    /// polling handshake request).
    pub port: u16,
    pub transport: String,
    pub start: u64,
    /// Got a pool connection (I/O-bound) or began hashing (CPU-bound).
    pub run: Option<u64>,
    pub end: Option<u64>,
}

/// Every 50 ms: how busy the event loop was and the pool's longest queue meanwhile.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Tick {
    pub at: u64,
    pub active_ns: u64,
    pub elapsed_ns: u64,
    pub waiters: u32,
}

/// The server's log.
#[derive(Clone, Debug, Default)]
pub struct ServerLog {
    /// Its code began to run, and it listened.
    pub started: Option<u64>,
    pub listening: Option<u64>,
    /// `accept()` returned to JS: (ns, the client's port).
    pub accepts: Vec<(u64, u16)>,
    pub auths: Vec<Auth>,
    /// Sessions connected (after the middleware): (ns, client).
    pub connects: Vec<(u64, i64)>,
    /// (ns, client, reason).
    pub disconnects: Vec<(u64, i64, String)>,
    pub ticks: Vec<Tick>,
}

fn num<T: std::str::FromStr>(f: Option<&str>) -> Option<T> {
    f?.parse().ok()
}

impl ServerLog {
    pub fn parse(lines: &[String]) -> ServerLog {
        let mut log = ServerLog::default();
        // The open authorisation of each client (an index into `auths`).
        let mut open: HashMap<i64, usize> = HashMap::new();
        for l in lines {
            let mut f = l.split_whitespace();
            let (Some(kind), Some(at)) = (f.next(), num::<u64>(f.next())) else {
                continue;
            };
            match kind {
                "started" => {
                    log.started.get_or_insert(at);
                }
                "listening" => {
                    log.listening.get_or_insert(at);
                }
                "accept" => {
                    if let Some(port) = num(f.next()) {
                        log.accepts.push((at, port));
                    }
                }
                "auth-start" => {
                    let (Some(client), Some(attempt), Some(port)) =
                        (num(f.next()), num(f.next()), num(f.next()))
                    else {
                        continue;
                    };
                    open.insert(client, log.auths.len());
                    log.auths.push(Auth {
                        client,
                        attempt,
                        port,
                        transport: f.next().unwrap_or("").to_string(),
                        start: at,
                        run: None,
                        end: None,
                    });
                }
                "auth-run" | "auth-end" => {
                    let Some(i) = num::<i64>(f.next()).and_then(|c| open.get(&c).copied()) else {
                        continue;
                    };
                    if kind == "auth-run" {
                        log.auths[i].run = Some(at);
                    } else {
                        log.auths[i].end = Some(at);
                    }
                }
                "connect" => {
                    if let Some(c) = num(f.next()) {
                        log.connects.push((at, c));
                    }
                }
                "disconnect" => {
                    if let Some(c) = num(f.next()) {
                        log.disconnects
                            .push((at, c, f.next().unwrap_or("").to_string()));
                    }
                }
                "tick" => {
                    if let (Some(active_ns), Some(elapsed_ns), Some(waiters)) =
                        (num(f.next()), num(f.next()), num(f.next()))
                    {
                        log.ticks.push(Tick {
                            at,
                            active_ns,
                            elapsed_ns,
                            waiters,
                        });
                    }
                }
                _ => {}
            }
        }
        log
    }
}

/// One event of one client, as the fleet logged it.
#[derive(Clone, Debug, PartialEq)]
pub enum ClientEvent {
    /// Connected (the middleware passed), on this transport.
    Connect {
        at: u64,
        transport: String,
    },
    Disconnect {
        at: u64,
        reason: String,
    },
    /// Reconnect attempt `n` started.
    Attempt {
        at: u64,
        n: u32,
    },
    /// That attempt failed: ECONNREFUSED, EHOSTUNREACH, ...
    Error {
        at: u64,
        code: String,
    },
    /// Reconnected after `n` attempts.
    Reconnect {
        at: u64,
        n: u32,
    },
    ConnectError {
        at: u64,
        message: String,
    },
    /// The engine upgraded to `transport` (default transports: polling to websocket).
    Upgrade {
        at: u64,
        transport: String,
    },
    /// The server's ping arrived (the library answers it with a pong at once).
    Ping {
        at: u64,
    },
}

/// One TCP connection a client opened.
#[derive(Clone, Debug, PartialEq)]
pub struct Tcp {
    /// `connect()` called.
    pub start: u64,
    /// Connected (the SYN-ACK came), and the client's port.
    pub connected: Option<(u64, u16)>,
    /// Never connected: when, and why.
    pub failed: Option<(u64, String)>,
}

/// The fleet's own load from its first lost session to the last client back.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct FleetLoad {
    pub cut: u64,
    pub back: u64,
    pub cpu_us: u64,
    pub elu_active_ms: f64,
    pub elapsed_ms: f64,
    pub lag_p50_ms: f64,
    pub lag_p99_ms: f64,
    pub lag_max_ms: f64,
}

impl FleetLoad {
    /// The fleet's CPU use meanwhile, in CPUs (1.0: one core all the time).
    pub fn cpus(&self) -> f64 {
        self.cpu_us as f64 / 1e3 / self.elapsed_ms.max(1e-9)
    }
}

/// The fleet's log.
#[derive(Clone, Debug, Default)]
pub struct FleetLog {
    /// Each client's events, in order.
    pub clients: Vec<Vec<ClientEvent>>,
    pub tcp: Vec<Tcp>,
    pub load: Option<FleetLoad>,
}

impl FleetLog {
    pub fn parse(lines: &[String], n: usize) -> FleetLog {
        let mut log = FleetLog {
            clients: vec![Vec::new(); n],
            ..FleetLog::default()
        };
        for l in lines {
            let f: Vec<&str> = l.split_whitespace().collect();
            let g = |i: usize| f.get(i).copied();
            match g(0) {
                Some("tcp") => {
                    if let (Some(start), Some(at), Some(port)) = (num(g(1)), num(g(2)), num(g(3))) {
                        log.tcp.push(Tcp {
                            start,
                            connected: Some((at, port)),
                            failed: None,
                        });
                    }
                }
                Some("tcp-fail") => {
                    if let (Some(start), Some(at)) = (num(g(1)), num(g(2))) {
                        log.tcp.push(Tcp {
                            start,
                            connected: None,
                            failed: Some((at, g(3).unwrap_or("").to_string())),
                        });
                    }
                }
                Some("fleet") => {
                    let v: Vec<f64> = f[1..].iter().filter_map(|x| x.parse().ok()).collect();
                    if let [cut, back, cpu, elu, elapsed, p50, p99, max] = v[..] {
                        log.load = Some(FleetLoad {
                            cut: cut as u64,
                            back: back as u64,
                            cpu_us: cpu as u64,
                            elu_active_ms: elu,
                            elapsed_ms: elapsed,
                            lag_p50_ms: p50,
                            lag_p99_ms: p99,
                            lag_max_ms: max,
                        });
                    }
                }
                Some(c) => {
                    let (Ok(c), Some(kind), Some(at)) =
                        (c.parse::<usize>(), g(1), num::<u64>(g(2)))
                    else {
                        continue;
                    };
                    let rest = g(3).unwrap_or("").to_string();
                    let ev = match kind {
                        "connect" => ClientEvent::Connect {
                            at,
                            transport: g(4).unwrap_or("").to_string(),
                        },
                        "disconnect" => ClientEvent::Disconnect { at, reason: rest },
                        "attempt" => ClientEvent::Attempt {
                            at,
                            n: num(g(3)).unwrap_or(0),
                        },
                        "error" => ClientEvent::Error { at, code: rest },
                        "reconnect" => ClientEvent::Reconnect {
                            at,
                            n: num(g(3)).unwrap_or(0),
                        },
                        "connect_error" => ClientEvent::ConnectError { at, message: rest },
                        "upgrade" => ClientEvent::Upgrade {
                            at,
                            transport: rest,
                        },
                        "ping" => ClientEvent::Ping { at },
                        _ => continue,
                    };
                    if let Some(events) = log.clients.get_mut(c) {
                        events.push(ev);
                    }
                }
                None => {}
            }
        }
        log
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(s: &str) -> Vec<String> {
        s.lines().map(str::to_string).collect()
    }

    #[test]
    fn the_servers_log_joins_each_authorisation_by_client() {
        let log = ServerLog::parse(&lines(
            "started 90 6\n\
             listening 100 6 io\n\
             accept 110 40000\n\
             auth-start 120 7 1 40000 websocket\n\
             auth-run 130 7\n\
             auth-end 150 7\n\
             connect 151 7\n\
             tick 160 5000000 50000000 3\n\
             disconnect 170 7 transport_close\n\
             garbage\n",
        ));
        assert_eq!((log.started, log.listening), (Some(90), Some(100)));
        assert_eq!(log.accepts, vec![(110, 40000)]);
        assert_eq!(
            log.auths,
            vec![Auth {
                client: 7,
                attempt: 1,
                port: 40000,
                transport: "websocket".into(),
                start: 120,
                run: Some(130),
                end: Some(150),
            }]
        );
        assert_eq!(log.connects, vec![(151, 7)]);
        assert_eq!(log.disconnects, vec![(170, 7, "transport_close".into())]);
        assert_eq!(log.ticks[0].waiters, 3);
    }

    #[test]
    fn the_fleets_log_keeps_each_clients_events_and_every_tcp_connection() {
        let log = FleetLog::parse(
            &lines(
                "1 connect 10 0 websocket\n\
                 1 disconnect 20 transport_close\n\
                 1 attempt 30 1\n\
                 1 error 31 ECONNREFUSED\n\
                 1 attempt 40 2\n\
                 1 reconnect 45 2\n\
                 1 connect 46 0 websocket\n\
                 tcp 40 41 50000\n\
                 tcp-fail 30 31 ECONNREFUSED\n\
                 fleet 20 46 250000 300.5 1000.0 10.1 24.2 30.0\n",
            ),
            2,
        );
        assert!(log.clients[0].is_empty());
        assert_eq!(log.clients[1].len(), 7);
        assert_eq!(
            log.clients[1][3],
            ClientEvent::Error {
                at: 31,
                code: "ECONNREFUSED".into()
            }
        );
        assert_eq!(log.tcp.len(), 2);
        assert_eq!(log.tcp[0].connected, Some((41, 50000)));
        let load = log.load.expect("fleet line");
        assert_eq!(load.cpu_us, 250_000);
        assert!((load.cpus() - 0.25).abs() < 1e-9);
    }
}
