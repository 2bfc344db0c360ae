//! One HTTP/1.1 keep-alive connection of the load generator: writes a prepared request and
//! reads the whole answer (`Content-Length`, chunked, or until the server closes).

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
        let body = self.read_body(&head, head.status != 200).await?;
        if head.close {
            self.reusable = false;
        }
        let ok = head.status == 200;
        if !ok {
            let text = String::from_utf8_lossy(&body[..body.len().min(ERROR_TEXT_LIMIT)]);
            shared.error(format!("HTTP {}: {text}", head.status));
        }
        Ok(Exchange {
            sent,
            first_byte,
            ok,
            responses: 1,
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

    /// Reads the body after `head`; returns it when `keep`, else nothing.
    async fn read_body(&mut self, head: &Head, keep: bool) -> std::io::Result<Vec<u8>> {
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
        }
    }
    Ok(Some(Head {
        status,
        length: end + 4,
        body,
        close,
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
                close: false
            }
        );
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
