//! A stand-in for the Kubernetes API server for the export side's tests (`report --cluster`,
//! the Events): a local hyper server that answers each request with what a closure says and
//! records every request (method, path with query, headers, body).

use std::{
    convert::Infallible,
    net::SocketAddr,
    sync::{Arc, Mutex},
};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{Request, Response, server::conn::http1, service::service_fn};
use hyper_util::rt::TokioIo;

#[derive(Debug, Clone)]
pub struct Asked {
    pub method: String,
    pub path: String,
    pub headers: hyper::HeaderMap,
    pub body: Vec<u8>,
}

/// Status and body; status [`HANG`] never answers.
pub type Answer = (u16, String);

pub const HANG: u16 = 0;

pub struct Double {
    pub addr: SocketAddr,
    pub asked: Arc<Mutex<Vec<Asked>>>,
}

impl Double {
    pub async fn start(answer: impl Fn(&Asked) -> Answer + Send + Sync + 'static) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let asked = Arc::new(Mutex::new(Vec::new()));
        let answer = Arc::new(answer);
        let log = asked.clone();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let (answer, log) = (answer.clone(), log.clone());
                tokio::spawn(async move {
                    let svc = service_fn(move |req: Request<hyper::body::Incoming>| {
                        let (answer, log) = (answer.clone(), log.clone());
                        async move {
                            let (parts, body) = req.into_parts();
                            let body = body.collect().await.map(|b| b.to_bytes().to_vec());
                            let asked = Asked {
                                method: parts.method.to_string(),
                                path: parts.uri.to_string(),
                                headers: parts.headers,
                                body: body.unwrap_or_default(),
                            };
                            let (status, text) = answer(&asked);
                            log.lock().unwrap().push(asked);
                            if status == HANG {
                                futures::future::pending::<()>().await;
                            }
                            Ok::<_, Infallible>(
                                Response::builder()
                                    .status(status)
                                    .header("content-type", "application/json")
                                    .body(Full::new(Bytes::from(text)))
                                    .unwrap(),
                            )
                        }
                    });
                    let _ = http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), svc)
                        .await;
                });
            }
        });
        Self { addr, asked }
    }

    pub fn config(&self) -> kube::Config {
        let url: hyper::Uri = format!("http://{}", self.addr).parse().unwrap();
        kube::Config::new(url)
    }

    pub fn asked(&self) -> Vec<Asked> {
        self.asked.lock().unwrap().clone()
    }
}
