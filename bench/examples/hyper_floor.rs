//! The floor of a hyper-based proxy on this machine: what `headroom serve` would cost
//! per request with nothing of its own — no parsing, routing, metrics, records or SSE
//! observation — only hyper's server, hyper-util's pooled client and tokio.
//!
//! It takes `headroom serve`'s arguments as `headroom-bench proxy-overhead` passes them
//! (`--listen ADDR`, `--replica URL,...`; the rest is ignored), answers `/ready`, and
//! forwards every other request round-robin, streaming the answer back unchanged. Run
//! it in the bench's place of `headroom` (`--bin-dir` pointing at a directory where
//! `headroom` is this binary) to split Headroom's CPU per request into the framework's
//! floor and its own work (bench/PROXY_OVERHEAD.md).

use std::{
    net::SocketAddr,
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
};

use bytes::Bytes;
use http_body_util::{BodyExt, Full, combinators::BoxBody};
use hyper::{Request, Response, body::Incoming, service::service_fn};
use hyper_util::{
    client::legacy::{Client, connect::HttpConnector},
    rt::{TokioExecutor, TokioIo},
};

type Body = BoxBody<Bytes, hyper::Error>;

struct Floor {
    client: Client<HttpConnector, Incoming>,
    upstreams: Vec<String>,
    next: AtomicUsize,
}

fn args() -> Result<(SocketAddr, Vec<String>, Option<usize>), String> {
    let mut listen = None;
    let mut threads = None;
    let mut upstreams = Vec::new();
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        match a.as_str() {
            "--listen" => listen = it.next(),
            "--worker-threads" => {
                let n = it.next().ok_or("--worker-threads needs a value")?;
                threads = Some(n.parse().map_err(|e| format!("--worker-threads: {e}"))?);
            }
            "--replica" => {
                let r = it.next().ok_or("--replica needs a value")?;
                let url = r.split(',').next().unwrap_or_default();
                upstreams.push(url.trim_end_matches('/').to_string());
            }
            _ => {}
        }
    }
    let listen = listen
        .ok_or("--listen is required")?
        .parse()
        .map_err(|e| format!("--listen: {e}"))?;
    if upstreams.is_empty() {
        return Err("at least one --replica".into());
    }
    Ok((listen, upstreams, threads))
}

async fn handle(f: Arc<Floor>, req: Request<Incoming>) -> Result<Response<Body>, hyper::Error> {
    if req.uri().path() == "/ready" {
        return Ok(Response::new(
            Full::new(Bytes::from_static(b"ready"))
                .map_err(|never| match never {})
                .boxed(),
        ));
    }
    let i = f.next.fetch_add(1, Ordering::Relaxed) % f.upstreams.len();
    let (mut parts, body) = req.into_parts();
    let path = parts.uri.path_and_query().map_or("/", |p| p.as_str());
    parts.uri = match format!("{}{path}", f.upstreams[i]).parse() {
        Ok(u) => u,
        Err(_) => return Ok(bad_gateway()),
    };
    parts.headers.remove(hyper::header::HOST);
    match f.client.request(Request::from_parts(parts, body)).await {
        Ok(resp) => Ok(resp.map(BodyExt::boxed)),
        Err(_) => Ok(bad_gateway()),
    }
}

fn bad_gateway() -> Response<Body> {
    let mut r = Response::new(
        Full::new(Bytes::from_static(b"bad gateway"))
            .map_err(|never| match never {})
            .boxed(),
    );
    *r.status_mut() = hyper::StatusCode::BAD_GATEWAY;
    r
}

fn main() -> Result<(), String> {
    let (listen, upstreams, threads) = args()?;
    let mut rt = tokio::runtime::Builder::new_multi_thread();
    if let Some(n) = threads {
        rt.worker_threads(n);
    }
    let rt = rt.enable_all().build().map_err(|e| e.to_string())?;
    rt.block_on(async move {
        let f = Arc::new(Floor {
            client: Client::builder(TokioExecutor::new()).build_http(),
            upstreams,
            next: AtomicUsize::new(0),
        });
        let l = tokio::net::TcpListener::bind(listen)
            .await
            .map_err(|e| e.to_string())?;
        loop {
            let Ok((s, _)) = l.accept().await else {
                continue;
            };
            let _ = s.set_nodelay(true);
            let f = f.clone();
            tokio::spawn(async move {
                let svc = service_fn(move |req| handle(f.clone(), req));
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(s), svc)
                    .await;
            });
        }
    })
}
