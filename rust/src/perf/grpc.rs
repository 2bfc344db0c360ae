//! One HTTP/2 connection of the load generator carrying unary gRPC calls (h2, driven on the
//! thread's event loop), each answer's status read from its trailers.

use bytes::Bytes;
use h2::client::SendRequest;
use tokio::net::TcpStream;

use super::stream::{STREAM_INFER_PATH, StreamCall};
use super::{Exchange, Shared};

/// Flow-control windows large enough that a 4 MiB answer never waits for a window update.
const STREAM_WINDOW: u32 = 16 * 1024 * 1024;
const CONNECTION_WINDOW: u32 = 64 * 1024 * 1024;

#[derive(Debug)]
pub struct Connection {
    sender: SendRequest<Bytes>,
    authority: String,
    /// The unary method's URI, parsed once: every call on the connection names it.
    unary: http::Uri,
}

/// `message` with gRPC's length-prefixed frame header (not compressed).
pub fn framed(message: &[u8]) -> Bytes {
    let length = u32::try_from(message.len()).unwrap_or(u32::MAX);
    let mut framed = Vec::with_capacity(5 + message.len());
    framed.push(0);
    framed.extend_from_slice(&length.to_be_bytes());
    framed.extend_from_slice(message);
    Bytes::from(framed)
}

impl Connection {
    /// A connection to `address` whose unary calls go to the method `path`.
    pub async fn open(address: &str, path: &str) -> Result<Connection, String> {
        let failed = |e: &dyn std::fmt::Display| format!("cannot connect to {address}: {e}");
        let unary = uri(address, path)?;
        let tcp = TcpStream::connect(address).await.map_err(|e| failed(&e))?;
        tcp.set_nodelay(true).map_err(|e| failed(&e))?;
        let (sender, connection) = h2::client::Builder::new()
            .initial_window_size(STREAM_WINDOW)
            .initial_connection_window_size(CONNECTION_WINDOW)
            .handshake::<_, Bytes>(tcp)
            .await
            .map_err(|e| failed(&e))?;
        // The connection's frames are read and written by a task of its own on this thread.
        tokio::task::spawn_local(async move {
            let _ = connection.await;
        });
        Ok(Connection {
            sender,
            authority: address.to_string(),
            unary,
        })
    }

    pub async fn exchange(&self, message: &Bytes, shared: &Shared) -> Exchange {
        match self.call(message, shared).await {
            Ok(exchange) => exchange,
            Err(text) => Exchange::failed(shared, text),
        }
    }

    async fn call(&self, message: &Bytes, shared: &Shared) -> Result<Exchange, String> {
        let h2_failed = |e: h2::Error| format!("gRPC call failed: {e}");
        let request = request(self.unary.clone())?;
        let mut sender = self.sender.clone().ready().await.map_err(h2_failed)?;
        let (answer, mut stream) = sender.send_request(request, false).map_err(h2_failed)?;
        stream.send_data(message.clone(), true).map_err(h2_failed)?;
        let sent = shared.now();
        let answer = answer.await.map_err(h2_failed)?;
        let first_byte = shared.now();
        let (head, mut body) = answer.into_parts();
        // A call that fails at once answers with its status in the headers ("trailers-only").
        let mut status = Status::of(&head.headers);
        while let Some(chunk) = body.data().await {
            let chunk = chunk.map_err(h2_failed)?;
            let _ = body.flow_control().release_capacity(chunk.len());
        }
        if let Some(trailers) = body.trailers().await.map_err(h2_failed)? {
            status = status.or(Status::of(&trailers));
        }
        let ok = match status {
            Some(Status { code: 0, .. }) => true,
            Some(Status { code, message }) => {
                shared.error(format!("gRPC status {code}: {message}"));
                false
            }
            None if head.status != http::StatusCode::OK => {
                shared.error(format!("HTTP/2 status {} on a gRPC call", head.status));
                false
            }
            None => {
                shared.error("a gRPC answer without grpc-status".to_string());
                false
            }
        };
        Ok(Exchange {
            sent,
            first_byte,
            ok,
            responses: 1,
        })
    }

    /// Opens a `ModelStreamInfer` call on this connection.
    pub async fn open_stream(&self, decoupled: bool) -> Result<StreamCall, String> {
        let h2_failed = |e: h2::Error| format!("cannot open a gRPC stream: {e}");
        let request = request(uri(&self.authority, STREAM_INFER_PATH)?)?;
        let mut sender = self.sender.clone().ready().await.map_err(h2_failed)?;
        let (answer, send) = sender.send_request(request, false).map_err(h2_failed)?;
        Ok(StreamCall::new(send, answer, decoupled))
    }
}

fn uri(address: &str, path: &str) -> Result<http::Uri, String> {
    format!("http://{address}{path}")
        .parse()
        .map_err(|e| format!("not a gRPC address and method: {address}{path}: {e}"))
}

fn request(uri: http::Uri) -> Result<http::Request<()>, String> {
    http::Request::builder()
        .method(http::Method::POST)
        .uri(uri)
        .header(http::header::CONTENT_TYPE, "application/grpc")
        .header(http::header::TE, "trailers")
        .body(())
        .map_err(|e| format!("cannot build a gRPC request: {e}"))
}

/// "gRPC status N: message" from a call's trailers, if they carry a status.
pub fn status_text(trailers: &http::HeaderMap) -> Option<String> {
    Status::of(trailers).map(|s| format!("gRPC status {}: {}", s.code, s.message))
}

/// A call's `grpc-status` and `grpc-message`.
#[derive(Debug, PartialEq, Eq)]
struct Status {
    code: u32,
    message: String,
}

impl Status {
    fn of(headers: &http::HeaderMap) -> Option<Status> {
        let code = headers.get("grpc-status")?.to_str().ok()?.parse().ok()?;
        let message = headers
            .get("grpc-message")
            .map(|value| percent_decoded(value.as_bytes()))
            .unwrap_or_default();
        Some(Status { code, message })
    }
}

/// `grpc-message` is percent-encoded.
fn percent_decoded(value: &[u8]) -> String {
    let mut out = Vec::with_capacity(value.len());
    let mut at = 0;
    while at < value.len() {
        let hex = value
            .get(at + 1..at + 3)
            .and_then(|h| std::str::from_utf8(h).ok());
        match (value[at], hex.and_then(|h| u8::from_str_radix(h, 16).ok())) {
            (b'%', Some(byte)) => {
                out.push(byte);
                at += 3;
            }
            (byte, _) => {
                out.push(byte);
                at += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_message_is_framed_with_its_length() {
        assert_eq!(&framed(b"abc")[..], b"\x00\x00\x00\x00\x03abc");
    }

    #[test]
    fn grpc_messages_are_percent_decoded() {
        assert_eq!(
            percent_decoded(b"unexpected%20shape%3A %5B1%5D"),
            "unexpected shape: [1]"
        );
        assert_eq!(percent_decoded(b"100%"), "100%");
    }
}
