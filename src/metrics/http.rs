//! A tiny HTTP/1.1 responder: `GET /metrics` (and `HEAD`) answers with the exposition
//! text, anything else with 404/405/400. One request per connection (`Connection: close`);
//! Prometheus scrapes that way without trouble.
//!
//! Hostile or broken clients cannot hold resources: at most [`Limits::max_connections`] are
//! served at once (further ones wait in the kernel's accept queue), a request head larger
//! than [`Limits::max_head_bytes`] is refused with 431, and a connection that has not sent
//! a complete head and read its answer within [`Limits::connection_timeout`] is dropped.
//! A request body is never read.
//!
//! Format: OpenMetrics 1.0 when the client's `Accept` names `application/openmetrics-text`
//! (Prometheus does), else the Prometheus text format 0.0.4.

use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;

/// How long and how much unread input is drained after answering.
const LINGER_TIME: Duration = Duration::from_millis(500);
const LINGER_MAX_BYTES: usize = 64 << 10;

/// The exposition format a client gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// Prometheus text format 0.0.4.
    Prometheus,
    /// OpenMetrics 1.0 text (ends with `# EOF`).
    OpenMetrics,
}

impl Format {
    pub fn content_type(self) -> &'static str {
        match self {
            Format::Prometheus => "text/plain; version=0.0.4; charset=utf-8",
            Format::OpenMetrics => "application/openmetrics-text; version=1.0.0; charset=utf-8",
        }
    }

    fn from_accept(accept: Option<&str>) -> Format {
        match accept {
            Some(a) if a.to_ascii_lowercase().contains("application/openmetrics-text") => Format::OpenMetrics,
            _ => Format::Prometheus,
        }
    }
}

/// Renders the metrics in a format.
pub type Render = Arc<dyn Fn(Format) -> String + Send + Sync>;

#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub max_connections: usize,
    pub max_head_bytes: usize,
    pub connection_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Self { max_connections: 8, max_head_bytes: 8 << 10, connection_timeout: Duration::from_secs(10) }
    }
}

/// A parsed request head: what the responder needs of it.
#[derive(Debug, PartialEq, Eq)]
pub struct Request {
    pub head_only: bool,
    pub path: String,
    pub format: Format,
}

/// Why a request head is refused, as an HTTP status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    BadRequest,
    MethodNotAllowed,
    HeadTooLarge,
    VersionNotSupported,
}

impl Refusal {
    fn status(self) -> &'static str {
        match self {
            Refusal::BadRequest => "400 Bad Request",
            Refusal::MethodNotAllowed => "405 Method Not Allowed",
            Refusal::HeadTooLarge => "431 Request Header Fields Too Large",
            Refusal::VersionNotSupported => "505 HTTP Version Not Supported",
        }
    }
}

/// Parses a request head (request line and headers, without the blank line).
pub fn parse_head(head: &[u8]) -> Result<Request, Refusal> {
    let text = std::str::from_utf8(head).map_err(|_| Refusal::BadRequest)?;
    let mut lines = text.split('\n').map(|l| l.strip_suffix('\r').unwrap_or(l));
    let request_line = lines.next().ok_or(Refusal::BadRequest)?;
    let mut parts = request_line.split(' ');
    let (Some(method), Some(target), Some(version), None) = (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(Refusal::BadRequest);
    };
    if method.is_empty() || !method.bytes().all(|b| b.is_ascii_uppercase()) || !target.starts_with('/') {
        return Err(Refusal::BadRequest);
    }
    match version {
        "HTTP/1.1" | "HTTP/1.0" => {}
        v if v.starts_with("HTTP/") => return Err(Refusal::VersionNotSupported),
        _ => return Err(Refusal::BadRequest),
    }
    let mut accept = None;
    for line in lines {
        if line.is_empty() {
            break;
        }
        let (name, value) = line.split_once(':').ok_or(Refusal::BadRequest)?;
        if name.is_empty() || name.contains([' ', '\t']) {
            return Err(Refusal::BadRequest);
        }
        if name.eq_ignore_ascii_case("accept") {
            accept = Some(value.trim());
        }
    }
    let head_only = match method {
        "GET" => false,
        "HEAD" => true,
        _ => return Err(Refusal::MethodNotAllowed),
    };
    let path = target.split_once('?').map_or(target, |(p, _)| p).to_string();
    Ok(Request { head_only, path, format: Format::from_accept(accept) })
}

/// Accepts connections on `listener` forever, answering each with `render`.
pub async fn serve(listener: TcpListener, render: Render, limits: Limits) {
    let permits = Arc::new(Semaphore::new(limits.max_connections));
    loop {
        let permit = permits.clone().acquire_owned().await.expect("the semaphore is never closed");
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(e) => {
                // EMFILE and friends: back off instead of spinning.
                tracing::warn!("metrics: accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let render = render.clone();
        tokio::spawn(async move {
            let _permit = permit;
            match tokio::time::timeout(limits.connection_timeout, handle(stream, &render, limits)).await {
                Ok(Err(e)) => tracing::debug!("metrics connection: {e}"),
                Err(_) => tracing::debug!("metrics connection timed out"),
                Ok(Ok(())) => {}
            }
        });
    }
}

/// Reads until the blank line ending the head; `Ok(None)` when the client left first.
async fn read_head(stream: &mut TcpStream, max_head_bytes: usize) -> std::io::Result<Result<Option<Vec<u8>>, Refusal>> {
    let mut head = Vec::with_capacity(1024);
    let mut chunk = [0u8; 1024];
    loop {
        let n = stream.read(&mut chunk).await?;
        if n == 0 {
            return Ok(Ok(None));
        }
        let searched_from = head.len().saturating_sub(3);
        head.extend_from_slice(&chunk[..n]);
        let window = &head[searched_from..];
        let end = window
            .windows(4)
            .position(|w| w == b"\r\n\r\n")
            .map(|i| searched_from + i)
            .or_else(|| window.windows(2).position(|w| w == b"\n\n").map(|i| searched_from + i));
        if let Some(end) = end {
            if end > max_head_bytes {
                return Ok(Err(Refusal::HeadTooLarge));
            }
            head.truncate(end);
            return Ok(Ok(Some(head)));
        }
        if head.len() > max_head_bytes {
            return Ok(Err(Refusal::HeadTooLarge));
        }
    }
}

async fn handle(mut stream: TcpStream, render: &Render, limits: Limits) -> std::io::Result<()> {
    let response = match read_head(&mut stream, limits.max_head_bytes).await? {
        Ok(None) => return Ok(()),
        Ok(Some(head)) => match parse_head(&head) {
            Ok(request) if request.path == "/metrics" => {
                let body = render(request.format);
                response("200 OK", request.format.content_type(), &body, request.head_only)
            }
            Ok(request) => {
                response("404 Not Found", "text/plain; charset=utf-8", "not found: try /metrics\n", request.head_only)
            }
            Err(refusal) => refuse(refusal),
        },
        Err(refusal) => refuse(refusal),
    };
    stream.write_all(&response).await?;
    stream.shutdown().await?;
    linger(&mut stream).await;
    Ok(())
}

/// Reads and drops what the client still sends (a body, the rest of an oversized head) for
/// a moment: closing with unread input would reset the connection and could destroy the
/// answer before the client reads it.
async fn linger(stream: &mut TcpStream) {
    let mut sink = [0u8; 4096];
    let mut left = LINGER_MAX_BYTES;
    let drain = async {
        while left > 0 {
            match stream.read(&mut sink).await {
                Ok(0) | Err(_) => break,
                Ok(n) => left = left.saturating_sub(n),
            }
        }
    };
    let _ = tokio::time::timeout(LINGER_TIME, drain).await;
}

fn refuse(refusal: Refusal) -> Vec<u8> {
    let body = format!("{}\n", refusal.status());
    response(refusal.status(), "text/plain; charset=utf-8", &body, false)
}

fn response(status: &str, content_type: &str, body: &str, head_only: bool) -> Vec<u8> {
    let allow = if status.starts_with("405") { "Allow: GET, HEAD\r\n" } else { "" };
    let mut out = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\n{allow}Connection: close\r\n\r\n",
        body.len()
    )
    .into_bytes();
    if !head_only {
        out.extend_from_slice(body.as_bytes());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::net::{SocketAddr, TcpStream as StdStream};

    #[test]
    fn parses_what_scrapers_send() {
        let r = parse_head(b"GET /metrics HTTP/1.1\r\nHost: x\r\nAccept: text/plain;version=0.0.4").unwrap();
        assert_eq!(r, Request { head_only: false, path: "/metrics".into(), format: Format::Prometheus });
        let accept = "application/openmetrics-text;version=1.0.0;q=0.5,text/plain;version=0.0.4;q=0.4";
        let r = parse_head(format!("GET /metrics?x=1 HTTP/1.1\r\nACCEPT: {accept}").as_bytes()).unwrap();
        assert_eq!((r.path.as_str(), r.format), ("/metrics", Format::OpenMetrics));
        let r = parse_head(b"HEAD / HTTP/1.0\n").unwrap();
        assert!(r.head_only);
        assert_eq!(r.path, "/");
    }

    #[test]
    fn refuses_malformed_heads() {
        let cases: [(&[u8], Refusal); 10] = [
            (b"", Refusal::BadRequest),
            (b"GET /metrics", Refusal::BadRequest),
            (b"GET  /metrics HTTP/1.1", Refusal::BadRequest),
            (b"GET /metrics HTTP/1.1 extra", Refusal::BadRequest),
            (b"GET metrics HTTP/1.1", Refusal::BadRequest),
            (b"get /metrics HTTP/1.1", Refusal::BadRequest),
            (b"GET /metrics HTTP/2.0", Refusal::VersionNotSupported),
            (b"GET /metrics HTTP/1.1\r\nno colon here", Refusal::BadRequest),
            (b"GET /metrics HTTP/1.1\r\nAccept: \xff\xfe", Refusal::BadRequest),
            (b"POST /metrics HTTP/1.1\r\nContent-Length: 3", Refusal::MethodNotAllowed),
        ];
        for (head, expected) in cases {
            assert_eq!(parse_head(head), Err(expected), "{:?}", String::from_utf8_lossy(head));
        }
    }

    async fn start(limits: Limits) -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let render: Render = Arc::new(|format| format!("metric_a 1\n# format {format:?}\n"));
        tokio::spawn(serve(listener, render, limits));
        addr
    }

    /// Sends `request` and reads the whole answer (the server closes the connection).
    fn exchange(addr: SocketAddr, request: &[u8]) -> String {
        let mut s = StdStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s.write_all(request).unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        out
    }

    fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> tokio::task::JoinHandle<T> {
        tokio::task::spawn_blocking(f)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn answers_metrics_and_refuses_the_rest() {
        let addr = start(Limits::default()).await;
        let answers = blocking(move || {
            [
                exchange(addr, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"),
                exchange(addr, b"GET /metrics HTTP/1.1\r\nAccept: application/openmetrics-text\r\n\r\n"),
                exchange(addr, b"HEAD /metrics HTTP/1.1\r\n\r\n"),
                exchange(addr, b"GET /other HTTP/1.1\r\n\r\n"),
                exchange(addr, b"DELETE /metrics HTTP/1.1\r\n\r\n"),
                exchange(addr, b"\x16\x03\x01 binary junk\r\n\r\n"),
            ]
        })
        .await
        .unwrap();
        let [get, open, head, other, delete, junk] = answers;
        assert!(get.starts_with("HTTP/1.1 200 OK\r\n"), "{get}");
        assert!(get.contains("Content-Type: text/plain; version=0.0.4"), "{get}");
        assert!(
            get.contains("Content-Length: 31\r\n") && get.ends_with("\r\n\r\nmetric_a 1\n# format Prometheus\n"),
            "{get}"
        );
        assert!(open.contains("Content-Type: application/openmetrics-text; version=1.0.0"), "{open}");
        assert!(open.ends_with("# format OpenMetrics\n"), "{open}");
        assert!(head.starts_with("HTTP/1.1 200 OK\r\n") && head.ends_with("\r\n\r\n"), "{head}");
        assert!(head.contains("Content-Length: 31\r\n"), "{head}");
        assert!(other.starts_with("HTTP/1.1 404 Not Found\r\n"), "{other}");
        assert!(
            delete.starts_with("HTTP/1.1 405 Method Not Allowed\r\n") && delete.contains("Allow: GET, HEAD\r\n"),
            "{delete}"
        );
        assert!(junk.starts_with("HTTP/1.1 400 Bad Request\r\n"), "{junk}");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn refuses_an_oversized_head() {
        let addr = start(Limits::default()).await;
        let answer = blocking(move || {
            let mut s = StdStream::connect(addr).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            s.write_all(b"GET /metrics HTTP/1.1\r\n").unwrap();
            // Headers without end: the server answers once it holds more than 8 KiB.
            let filler = format!("X-Filler: {}\r\n", "a".repeat(1000));
            for _ in 0..9 {
                if s.write_all(filler.as_bytes()).is_err() {
                    break;
                }
            }
            let mut out = Vec::new();
            let _ = s.read_to_end(&mut out);
            String::from_utf8_lossy(&out).into_owned()
        })
        .await
        .unwrap();
        assert!(answer.starts_with("HTTP/1.1 431 "), "{answer}");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn idle_clients_are_dropped_and_cannot_starve_others() {
        let limits =
            Limits { max_connections: 2, connection_timeout: Duration::from_millis(1500), ..Limits::default() };
        let addr = start(limits).await;
        blocking(move || {
            // Two clients connect and say nothing: they hold both connection slots.
            let idle: Vec<StdStream> = (0..2).map(|_| StdStream::connect(addr).unwrap()).collect();
            std::thread::sleep(Duration::from_millis(200));
            let mut third = StdStream::connect(addr).unwrap();
            third.write_all(b"GET /metrics HTTP/1.1\r\n\r\n").unwrap();
            third.set_read_timeout(Some(Duration::from_millis(300))).unwrap();
            let mut byte = [0u8; 1];
            let early = third.read(&mut byte);
            assert!(early.is_err(), "answered beyond the connection limit: {early:?}");
            // The idle ones are dropped at the timeout; then the third is answered.
            for mut s in idle {
                s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
                let mut rest = Vec::new();
                assert_eq!(s.read_to_end(&mut rest).unwrap(), 0, "an idle client gets nothing and is closed");
            }
            third.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            let mut out = String::new();
            third.read_to_string(&mut out).unwrap();
            assert!(out.starts_with("HTTP/1.1 200 OK\r\n"), "{out}");
        })
        .await
        .unwrap();
    }
}
