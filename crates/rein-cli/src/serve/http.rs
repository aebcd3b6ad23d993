//! The HTTP/1.1 front of `rein serve`: connections are accepted and read on an async runtime
//! (hyper on tokio), so a slow or silent client holds one cheap task and one of
//! `--max-connections` slots for at most `--read-timeout`, never a worker. A request's head and
//! body are read in full, within their size limits and deadline, before any work; then
//! [`Handler::route`] answers it on one of `--workers` blocking threads (where the engine batches
//! the generation requests). The API key, when one is set, is checked before the body is read.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use http_body_util::{BodyExt, Full, Limited};
use hyper::body::{Bytes, Incoming};
use hyper::header::{AUTHORIZATION, CONTENT_LENGTH, CONTENT_TYPE, HeaderValue};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::sync::Semaphore;

use super::{Answer, Handler, error};

/// Most bytes of a request's line and headers (431 past them).
const MAX_HEAD_BYTES: usize = 64 * 1024;

/// What the HTTP front allows a client.
#[derive(Clone, Debug)]
pub(crate) struct HttpLimits {
    /// Largest request body; past it, 413.
    pub max_body_bytes: usize,
    /// How long a client may take to send a request's head, and then its body (each), and how
    /// long an idle kept-alive connection stays open.
    pub read_timeout: Duration,
    /// Connections open at once; more wait in the listen queue.
    pub max_connections: usize,
    /// Requests being answered at once (threads that parse, tokenize and wait on the engine).
    pub workers: usize,
    /// The key every endpoint but `/health` requires as `Authorization: Bearer …`.
    pub api_key: Option<String>,
}

/// Answers the connections `listener` accepts with `handler` until the process ends.
pub(crate) fn serve(
    listener: std::net::TcpListener,
    handler: Arc<dyn Handler>,
    limits: HttpLimits,
) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .max_blocking_threads(limits.workers.max(1))
        .thread_name("rein-serve-http")
        .enable_all()
        .build()?;
    runtime.block_on(accept(listener, handler, Arc::new(limits)))
}

async fn accept(
    listener: std::net::TcpListener,
    handler: Arc<dyn Handler>,
    limits: Arc<HttpLimits>,
) -> anyhow::Result<()> {
    listener.set_nonblocking(true)?;
    let listener = tokio::net::TcpListener::from_std(listener)?;
    let slots = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    loop {
        let slot = slots.clone().acquire_owned().await?;
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(e) => {
                // Out of file descriptors, or a connection reset before it was accepted: the
                // listener itself is fine.
                eprintln!("rein serve: accepting a connection: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let (handler, limits) = (handler.clone(), limits.clone());
        tokio::spawn(async move {
            let timeout = limits.read_timeout;
            let service = service_fn(move |request| answer(request, handler.clone(), limits.clone()));
            let connection = http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(timeout)
                .max_header_size(MAX_HEAD_BYTES)
                .serve_connection(TokioIo::new(stream), service);
            // A client that goes away mid-request ends only its own connection.
            let _ = connection.await;
            drop(slot);
        });
    }
}

/// One request: checked, read within the limits, routed on a blocking thread.
async fn answer(
    request: Request<Incoming>,
    handler: Arc<dyn Handler>,
    limits: Arc<HttpLimits>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let (parts, body) = request.into_parts();
    let path = parts.uri.path().to_string();
    if let Some(refusal) = unauthorized(&parts.headers, &path, limits.api_key.as_deref()) {
        return Ok(json_response(refusal));
    }
    let too_large = || {
        error(
            413,
            format!(
                "the request body is larger than {} bytes (--max-body-bytes)",
                limits.max_body_bytes
            ),
        )
    };
    let declared = (parts.headers.get(CONTENT_LENGTH))
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limits.max_body_bytes as u64) {
        return Ok(json_response(too_large()));
    }
    let read = Limited::new(body, limits.max_body_bytes).collect();
    let bytes = match tokio::time::timeout(limits.read_timeout, read).await {
        Err(_) => {
            return Ok(json_response(error(
                408,
                format!(
                    "the request body did not arrive within {} s (--read-timeout)",
                    limits.read_timeout.as_secs_f64()
                ),
            )));
        }
        Ok(Err(e)) if e.downcast_ref::<http_body_util::LengthLimitError>().is_some() => {
            return Ok(json_response(too_large()));
        }
        Ok(Err(e)) => return Ok(json_response(error(400, format!("cannot read the request body: {e}")))),
        Ok(Ok(collected)) => collected.to_bytes(),
    };
    let method = parts.method;
    let routed = tokio::task::spawn_blocking(move || match std::str::from_utf8(&bytes) {
        Ok(body) => handler.route(&method, &path, body),
        Err(e) => error(400, format!("the request body is not UTF-8: {e}")),
    })
    .await;
    let answer = routed.unwrap_or_else(|e| error(500, format!("the request failed inside the server: {e}")));
    Ok(json_response(answer))
}

/// 401 unless the request carries the API key (every path but `/health` needs it).
fn unauthorized(headers: &hyper::HeaderMap, path: &str, key: Option<&str>) -> Option<Answer> {
    let key = key?;
    if path == "/health" {
        return None;
    }
    let given = (headers.get(AUTHORIZATION))
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    match given.is_some_and(|given| same_secret(given.as_bytes(), key.as_bytes())) {
        true => None,
        false => Some(error(
            401,
            "this server needs `Authorization: Bearer <key>` (--api-key)",
        )),
    }
}

/// Compares two secrets in a time that depends only on their lengths.
fn same_secret(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |diff, (x, y)| diff | (x ^ y)) == 0
}

fn json_response((status, value): Answer) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(value.to_string())));
    *response.status_mut() = hyper::StatusCode::from_u16(status).unwrap_or(hyper::StatusCode::INTERNAL_SERVER_ERROR);
    (response.headers_mut()).insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_api_key_guards_every_path_but_health() {
        let mut headers = hyper::HeaderMap::new();
        assert!(unauthorized(&headers, "/v1/completions", None).is_none());
        assert!(unauthorized(&headers, "/health", Some("k3y")).is_none());
        assert_eq!(unauthorized(&headers, "/v1/models", Some("k3y")).unwrap().0, 401);
        headers.insert(AUTHORIZATION, HeaderValue::from_static("Bearer k3"));
        assert_eq!(unauthorized(&headers, "/generate", Some("k3y")).unwrap().0, 401);
        headers.insert(AUTHORIZATION, HeaderValue::from_static("k3y"));
        assert_eq!(unauthorized(&headers, "/generate", Some("k3y")).unwrap().0, 401);
        headers.insert(AUTHORIZATION, HeaderValue::from_static("Bearer k3y"));
        assert!(unauthorized(&headers, "/generate", Some("k3y")).is_none());
    }
}
