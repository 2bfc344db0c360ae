//! One HTTP/1.1 keep-alive connection of the load generator: writes a prepared request and
//! reads the whole answer (`Content-Length`, chunked, or until the server closes). An answer
//! of Server-Sent Events (`text/event-stream`, the generate extension's `generate_stream`)
//! counts each event as a response, the first event's arrival its first response.

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::{Exchange, Shared};

/// The most of an error answer's body kept as its text.
const ERROR_TEXT_LIMIT: usize = 400;

#[derive(Debug)]
pub struct Connection {
    stream: TcpStream,
    /// Bytes read and not yet consumed.
    buffer: Vec<u8>,
    reusable: bool,
}

/// An answer's head.
#[derive(Debug, PartialEq, Eq)]
struct Head {
    status: u16,
    length: usize,
    body: Body,
    close: bool,
    /// `Content-Type: text/event-stream`.
    events: bool,
}

/// Server-Sent Events seen in a body read piece by piece: an event ends with a blank line.
#[derive(Debug, Default)]
struct Events {
    count: u32,
    /// When the first one was complete.
    first: Option<u64>,
    /// The last byte seen was a line feed.
    after_newline: bool,
}

impl Events {
    /// Counts the events `bytes` complete; the first one's time is `now()`.
    fn feed(&mut self, bytes: &[u8], now: impl Fn() -> u64) {
        for &byte in bytes {
            if byte == b'\n' {
                if self.after_newline {
                    self.count += 1;
                    if self.first.is_none() {
                        self.first = Some(now());
                    }
                }
                self.after_newline = !self.after_newline;
            } else if byte != b'\r' {
                self.after_newline = false;
            }
        }
    }
}

#[derive(Debug, PartialEq, Eq)]
enum Body {
    Length(usize),
    Chunked,
    UntilClose,
}

impl Connection {
    pub async fn open(address: &str) -> std::io::Result<Connection> {
        let stream = TcpStream::connect(address).await?;
        stream.set_nodelay(true)?;
        Ok(Connection {
            stream,
            buffer: Vec::with_capacity(64 * 1024),
            reusable: true,
        })
    }

    /// Whether the connection can carry another request.
    pub fn reusable(&self) -> bool {
        self.reusable
    }

    pub async fn exchange(&mut self, request: &[u8], shared: &Shared) -> Exchange {
        match self.try_exchange(request, shared).await {
            Ok(exchange) => exchange,
            Err(e) => {
                self.reusable = false;
                Exchange::failed(shared, format!("HTTP connection failed: {e}"))
            }
        }
    }

    async fn try_exchange(&mut self, request: &[u8], shared: &Shared) -> std::io::Result<Exchange> {
        self.buffer.clear();
        self.stream.write_all(request).await?;
        let sent = shared.now();
        self.fill().await?;
        let first_byte = shared.now();
        let head = loop {
            if let Some(head) = parse_head(&self.buffer)? {
                break head;
            }
            self.fill().await?;
        };
        // Only an error's body is kept (its text is reported); a success's is read and dropped.
        let mut events = head.events.then(Events::default);
        let body = self
            .read_body(&head, head.status != 200, events.as_mut(), shared)
            .await?;
        if head.close {
            self.reusable = false;
        }
        let ok = head.status == 200;
        if !ok {
            let text = String::from_utf8_lossy(&body[..body.len().min(ERROR_TEXT_LIMIT)]);
            shared.error(format!("HTTP {}: {text}", head.status));
        }
        let (first_byte, responses) = match events {
            Some(events) => (events.first.unwrap_or(first_byte), events.count),
            None => (first_byte, 1),
        };
        Ok(Exchange {
            sent,
            first_byte,
            ok,
            responses,
        })
    }

    /// Reads more bytes; the server closing the connection here is an error.
    async fn fill(&mut self) -> std::io::Result<()> {
        self.buffer.reserve(64 * 1024);
        if self.stream.read_buf(&mut self.buffer).await? == 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "the server closed the connection",
            ));
        }
        Ok(())
    }

    /// Reads the body after `head`; returns it when `keep`, else nothing. A chunked body's
    /// bytes go through `events` as they arrive, when given.
    async fn read_body(
        &mut self,
        head: &Head,
        keep: bool,
        mut events: Option<&mut Events>,
        shared: &Shared,
    ) -> std::io::Result<Vec<u8>> {
        match head.body {
            Body::Length(length) => {
                let end = head.length + length;
                while self.buffer.len() < end {
                    self.buffer.reserve(end - self.buffer.len());
                    self.fill().await?;
                }
                Ok(if keep {
                    self.buffer[head.length..end].to_vec()
                } else {
                    Vec::new()
                })
            }
            Body::UntilClose => {
                self.reusable = false;
                loop {
                    self.buffer.reserve(64 * 1024);
                    if self.stream.read_buf(&mut self.buffer).await? == 0 {
                        return Ok(if keep {
                            self.buffer[head.length..].to_vec()
                        } else {
                            Vec::new()
                        });
                    }
                }
            }
            Body::Chunked => {
                let mut body = Vec::new();
                let mut at = head.length;
                loop {
                    let (size, line_end) = loop {
                        if let Some(found) = chunk_size(&self.buffer[at..])? {
                            break found;
                        }
                        self.fill().await?;
                    };
                    at += line_end;
                    // The chunk, then its CRLF (the last chunk: an empty line, no trailers
                    // expected from an inference server).
                    while self.buffer.len() < at + size + 2 {
                        self.fill().await?;
                    }
                    if keep {
                        body.extend_from_slice(&self.buffer[at..at + size]);
                    }
                    if let Some(events) = events.as_deref_mut() {
                        events.feed(&self.buffer[at..at + size], || shared.now());
                    }
                    at += size + 2;
                    if size == 0 {
                        return Ok(body);
                    }
                }
            }
        }
    }
}

fn bad(text: &str) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, text.to_string())
}

/// The answer's head, once `buffer` holds all of it.
fn parse_head(buffer: &[u8]) -> std::io::Result<Option<Head>> {
    let Some(end) = buffer.windows(4).position(|w| w == b"\r\n\r\n") else {
        return Ok(None);
    };
    let text = std::str::from_utf8(&buffer[..end]).map_err(|_| bad("a non-UTF-8 answer head"))?;
    let mut lines = text.split("\r\n");
    let status_line = lines.next().unwrap_or_default();
    let mut parts = status_line.splitn(3, ' ');
    let version = parts.next().unwrap_or_default();
    let status = parts
        .next()
        .and_then(|code| code.parse::<u16>().ok())
        .ok_or_else(|| bad("a malformed status line"))?;
    let mut body = Body::UntilClose;
    let mut close = version == "HTTP/1.0";
    let mut events = false;
    for line in lines {
        let Some((name, value)) = line.split_once(':') else {
            continue;
        };
        let value = value.trim();
        if name.eq_ignore_ascii_case("content-length") {
            let length = value
                .parse()
                .map_err(|_| bad("a malformed Content-Length"))?;
            body = Body::Length(length);
        } else if name.eq_ignore_ascii_case("transfer-encoding")
            && value.eq_ignore_ascii_case("chunked")
        {
            body = Body::Chunked;
        } else if name.eq_ignore_ascii_case("connection") {
            close = value.eq_ignore_ascii_case("close");
        } else if name.eq_ignore_ascii_case("content-type") {
            events = value.to_ascii_lowercase().starts_with("text/event-stream");
        }
    }
    Ok(Some(Head {
        status,
        length: end + 4,
        body,
        close,
        events,
    }))
}

/// A chunk's size and the length of its size line, once `buffer` holds the line.
fn chunk_size(buffer: &[u8]) -> std::io::Result<Option<(usize, usize)>> {
    let Some(end) = buffer.windows(2).position(|w| w == b"\r\n") else {
        return Ok(None);
    };
    let line = std::str::from_utf8(&buffer[..end]).map_err(|_| bad("a malformed chunk"))?;
    let digits = line.split(';').next().unwrap_or_default().trim();
    let size = usize::from_str_radix(digits, 16).map_err(|_| bad("a malformed chunk size"))?;
    Ok(Some((size, end + 2)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_head_is_read_once_complete() {
        let answer = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\ncontent-length: 12\r\n\r\n{\"a\":1}";
        assert_eq!(parse_head(&answer[..20]).unwrap(), None);
        let head = parse_head(answer).unwrap().unwrap();
        let length = answer.len() - b"{\"a\":1}".len();
        assert_eq!(
            head,
            Head {
                status: 200,
                length,
                body: Body::Length(12),
                close: false,
                events: false,
            }
        );
        let sse = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream; charset=utf-8\r\n\r\n";
        assert!(parse_head(sse).unwrap().unwrap().events);
    }

    #[test]
    fn events_end_with_a_blank_line_wherever_the_pieces_break() {
        let mut events = Events::default();
        events.feed(b"data: {\"OUT\": 0}\n", || 7);
        assert_eq!((events.count, events.first), (0, None));
        events.feed(b"\ndata: {\"OUT\": 1}\r\n\r", || 8);
        assert_eq!((events.count, events.first), (1, Some(8)));
        events.feed(b"\ndata: x\n\n", || 9);
        assert_eq!((events.count, events.first), (3, Some(8)));
    }

    #[test]
    fn chunked_and_closing_heads_are_told_apart() {
        let chunked = parse_head(b"HTTP/1.1 400 Bad Request\r\nTransfer-Encoding: chunked\r\n\r\n");
        let chunked = chunked.unwrap().unwrap();
        assert_eq!((chunked.status, chunked.body), (400, Body::Chunked));
        let closing = parse_head(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n")
            .unwrap()
            .unwrap();
        assert_eq!((closing.body, closing.close), (Body::UntilClose, true));
        assert!(parse_head(b"HTTP/1.1 abc\r\n\r\n").is_err());
    }

    #[test]
    fn chunk_sizes_are_hexadecimal_with_optional_extensions() {
        assert_eq!(chunk_size(b"1f\r\n").unwrap(), Some((31, 4)));
        assert_eq!(chunk_size(b"0;x=y\r\n").unwrap(), Some((0, 7)));
        assert_eq!(chunk_size(b"1f").unwrap(), None);
        assert!(chunk_size(b"zz\r\n").is_err());
    }
}
