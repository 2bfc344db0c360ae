//! Server-Sent Events of a `generate_stream` request, written by the core.
//!
//! A decoupled model's responses to a `generate_stream` request over a keep-alive HTTP/1.1
//! connection are written on the connection's writer stream by the thread that reads them from
//! the worker ([`super::Lane::drive`]), with no Python: the answer's head with the first event,
//! then each response as one event in one chunk. A response is encoded as the generate
//! extension writes one (a flat JSON object, its members sorted by name: `id` when the response
//! has one, `model_name`, `model_version`, the response's parameters, each output by name, one
//! element as a scalar and more as a flat array); an error response as `{"error": ...}`. The
//! server's Python hears only of the request's end, and writes the body's last chunk.
//!
//! A first response that is an error makes the answer a 400, and a stream that ends with no
//! response a 200 with no event: the writer declines both, and the server's Python (the
//! reference encoder) takes that response and every later one.
//!
//! A writer made [`EventWriter::whole`] answers the request all by itself (a request the
//! connection handed to the core whole, whose Python handler never runs): it declines nothing
//! (a first error makes the head a 400, an empty stream a 200 with no event, as the reference
//! path answers them), writes the body's last chunk after the final response and then hands
//! the request's token to the completions the event loop watches.
//!
//! Backpressure: once more than [`UNSENT_BOUND`] bytes of the connection wait unsent (a client
//! that reads slowly, or not at all), the reader thread waits ([`EventWriter::hold`]) until
//! half of them are sent, the client is gone or the lane closes, as it waits for a stream the
//! server's Python holds.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::time::Duration;

use super::completions::Completions;
use super::response::{error_json, json_data, json_string};
use super::{Answer, OwnedResponse, monotonic_ns};
use crate::error::CoreError;
use crate::outbox::Stream;

/// The head of a `generate_stream` answer on a keep-alive HTTP/1.1 connection, as the server's
/// Python writes it.
const HEAD: &[u8] = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream; charset=utf-8\r\n\
Transfer-Encoding: chunked\r\n\r\n";
/// The same with a first response that is an error.
const ERROR_HEAD: &[u8] = b"HTTP/1.1 400 Bad Request\r\n\
Content-Type: text/event-stream; charset=utf-8\r\nTransfer-Encoding: chunked\r\n\r\n";
/// A chunked body's end.
const LAST_CHUNK: &[u8] = b"0\r\n\r\n";

/// What a writer lets wait unsent on its connection before the reader thread waits.
pub const UNSENT_BOUND: usize = 1 << 20;
/// How often a held reader thread looks again, at first and at the most (only a client that
/// stops reading makes it wait).
const HOLD_POLL_FIRST: Duration = Duration::from_millis(1);
const HOLD_POLL_MOST: Duration = Duration::from_millis(50);

/// (Never: a generate request's responses are never serialized for gRPC.)
const NOT_WRITABLE: &str = "a response the generate extension cannot write";

const FRESH: u8 = 0;
const STARTED: u8 = 1;
const DECLINED: u8 = 2;
const FINISHED: u8 = 3;

/// Writes one `generate_stream` request's events on its connection (see the module's doc).
#[derive(Debug)]
pub struct EventWriter {
    stream: Arc<Stream>,
    state: AtomicU8,
    /// When the first event was written (`CLOCK_MONOTONIC` nanoseconds; 0 before).
    first_at: AtomicU64,
    /// A whole answer's completions and token (see the module's doc).
    whole: Option<(Arc<Completions>, u64)>,
}

impl EventWriter {
    pub fn new(stream: Arc<Stream>) -> Self {
        EventWriter {
            stream,
            state: AtomicU8::new(FRESH),
            first_at: AtomicU64::new(0),
            whole: None,
        }
    }

    /// A writer that answers the request all by itself, `token` handed to `completions`
    /// once the answer is written.
    pub fn whole(stream: Arc<Stream>, completions: Arc<Completions>, token: u64) -> Self {
        EventWriter {
            whole: Some((completions, token)),
            ..EventWriter::new(stream)
        }
    }

    pub fn is_whole(&self) -> bool {
        self.whole.is_some()
    }

    /// Whether the answer's head (and first event) was written.
    pub fn started(&self) -> bool {
        self.state.load(Ordering::Acquire) == STARTED
    }

    pub fn first_at(&self) -> u64 {
        self.first_at.load(Ordering::Acquire)
    }

    /// Writes one response (None: a bare final flag) as its event, `last` the request's
    /// final one. True when it is written (or, for a bare final flag after the first event,
    /// when nothing is left to write but the body's end); false when the writer declines it,
    /// and from then on every response (a whole writer declines nothing).
    pub fn write(&self, answer: Option<&Result<Answer, CoreError>>, last: bool) -> bool {
        let written = if self.whole.is_some() {
            self.write_whole(answer)
        } else {
            self.write_event(answer)
        };
        if last && self.whole.is_some() {
            self.finish();
        }
        written
    }

    /// A whole answer's next part: the head with the first, whatever it is.
    fn write_whole(&self, answer: Option<&Result<Answer, CoreError>>) -> bool {
        if self.state.load(Ordering::Acquire) != FRESH {
            return self.write_event(answer);
        }
        let (head, json) = match answer {
            None => (HEAD, None),
            Some(Ok(Answer::Response(response))) => match response_json(response) {
                Ok(json) => (HEAD, Some(json)),
                Err(error) => (ERROR_HEAD, Some(error_json(&error.message))),
            },
            Some(Ok(Answer::Encoded(_))) => (ERROR_HEAD, Some(error_json(NOT_WRITABLE))),
            Some(Err(error)) => (ERROR_HEAD, Some(error_json(&error.message))),
        };
        let mut bytes = head.to_vec();
        if let Some(json) = json {
            push_event(&mut bytes, &json);
        }
        let _ = self.stream.write_now(&bytes);
        self.first_at.store(monotonic_ns(), Ordering::Release);
        self.state.store(STARTED, Ordering::Release);
        true
    }

    /// The body's last chunk, then the token to the completions (once).
    fn finish(&self) {
        if self.state.swap(FINISHED, Ordering::AcqRel) == FINISHED {
            return;
        }
        let _ = self.stream.write(LAST_CHUNK);
        if let Some((completions, token)) = &self.whole {
            completions.add(&[*token]);
        }
    }

    fn write_event(&self, answer: Option<&Result<Answer, CoreError>>) -> bool {
        match self.state.load(Ordering::Acquire) {
            DECLINED => false,
            FINISHED => true,
            FRESH => {
                let encoded = match answer {
                    Some(Ok(Answer::Response(response))) => response_json(response).ok(),
                    _ => None,
                };
                let Some(json) = encoded else {
                    self.state.store(DECLINED, Ordering::Release);
                    return false;
                };
                let mut bytes = HEAD.to_vec();
                push_event(&mut bytes, &json);
                // (A client gone: the event loop sees its connection end.)
                let _ = self.stream.write_now(&bytes);
                self.first_at.store(monotonic_ns(), Ordering::Release);
                self.state.store(STARTED, Ordering::Release);
                true
            }
            _ => {
                let json = match answer {
                    None => return true,
                    Some(Ok(Answer::Response(response))) => {
                        response_json(response).unwrap_or_else(|error| error_json(&error.message))
                    }
                    Some(Ok(Answer::Encoded(_))) => error_json(NOT_WRITABLE),
                    Some(Err(error)) => error_json(&error.message),
                };
                let mut bytes = Vec::with_capacity(json.len() + 16);
                push_event(&mut bytes, &json);
                let _ = self.stream.write(&bytes);
                true
            }
        }
    }

    /// Whether the reader thread should wait before it writes more ([`Self::hold`]).
    pub fn over_bound(&self) -> bool {
        self.stream.unsent() > UNSENT_BOUND
    }

    /// Waits until at most half of [`UNSENT_BOUND`] waits unsent, the connection is gone, or
    /// `stop()` (the lane closing: its requests must be able to end).
    pub fn hold(&self, stop: impl Fn() -> bool) {
        let mut pause = HOLD_POLL_FIRST;
        while self.stream.unsent() > UNSENT_BOUND / 2 && self.stream.is_open() && !stop() {
            std::thread::sleep(pause);
            pause = (pause * 2).min(HOLD_POLL_MOST);
        }
    }
}

/// `json` as one Server-Sent Event in one chunk of a chunked body, added to `out`.
fn push_event(out: &mut Vec<u8>, json: &[u8]) {
    let length = json.len() + b"data: \n\n".len();
    out.extend_from_slice(format!("{length:x}\r\ndata: ").as_bytes());
    out.extend_from_slice(json);
    out.extend_from_slice(b"\n\n\r\n");
}

/// A response as the generate extension's flat JSON object: members sorted by name; a
/// parameter overrides the model's name, version or the id, and an output any of them, as in
/// the reference encoder, which fills one object in that order.
pub(crate) fn response_json(response: &OwnedResponse) -> Result<Vec<u8>, CoreError> {
    let quoted = |text: &str| {
        let mut out = Vec::with_capacity(text.len() + 2);
        json_string(&mut out, text.as_bytes());
        out
    };
    let mut members: BTreeMap<String, Vec<u8>> = BTreeMap::new();
    if !response.id.is_empty() {
        members.insert("id".to_owned(), quoted(&response.id));
    }
    members.insert("model_name".to_owned(), quoted(&response.model_name));
    members.insert("model_version".to_owned(), quoted(&response.model_version));
    for (name, value) in object_members(response.parameters.as_bytes())? {
        members.insert(name, value.to_vec());
    }
    for output in &response.outputs {
        if output.in_place {
            return Err(CoreError::internal("an output in a client's shared memory"));
        }
        let mut value = Vec::with_capacity(output.data.len() * 4 + 2);
        json_data(&mut value, &output.datatype, &output.data)?;
        if element_count(&output.shape) == Some(1) && value.len() > 2 {
            value = value[1..value.len() - 1].to_vec(); // one element: the scalar
        }
        members.insert(output.name.clone(), value);
    }
    let mut out = Vec::with_capacity(64 + members.values().map(Vec::len).sum::<usize>());
    out.push(b'{');
    for (index, (name, value)) in members.iter().enumerate() {
        if index > 0 {
            out.push(b',');
        }
        json_string(&mut out, name.as_bytes());
        out.push(b':');
        out.extend_from_slice(value);
    }
    out.push(b'}');
    Ok(out)
}

fn element_count(shape: &[i64]) -> Option<u64> {
    shape
        .iter()
        .try_fold(1u64, |n, &d| n.checked_mul(u64::try_from(d).ok()?))
}

fn not_an_object() -> CoreError {
    CoreError::internal("a response's parameters are not a JSON object")
}

/// The members of a JSON object's text (empty: none), each name decoded and each value as
/// its text. The worker writes the text (orjson, as the reference encoder writes), so each
/// value's text is what the reference encoder would write for it.
fn object_members(text: &[u8]) -> Result<Vec<(String, &[u8])>, CoreError> {
    let mut members = Vec::new();
    if text.is_empty() {
        return Ok(members);
    }
    let mut i = skip_blank(text, 0);
    if text.get(i) != Some(&b'{') {
        return Err(not_an_object());
    }
    i = skip_blank(text, i + 1);
    if text.get(i) == Some(&b'}') {
        return Ok(members);
    }
    loop {
        let end = string_end(text, i).ok_or_else(not_an_object)?;
        let name = unescape(&text[i + 1..end - 1]).ok_or_else(not_an_object)?;
        i = skip_blank(text, end);
        if text.get(i) != Some(&b':') {
            return Err(not_an_object());
        }
        let start = skip_blank(text, i + 1);
        let end = value_end(text, start).ok_or_else(not_an_object)?;
        members.push((name, &text[start..end]));
        i = skip_blank(text, end);
        match text.get(i) {
            Some(b',') => i = skip_blank(text, i + 1),
            Some(b'}') => return Ok(members),
            _ => return Err(not_an_object()),
        }
    }
}

fn skip_blank(text: &[u8], mut i: usize) -> usize {
    while matches!(text.get(i), Some(b' ' | b'\t' | b'\n' | b'\r')) {
        i += 1;
    }
    i
}

/// Where the string starting at `i` (its opening quote) ends, past its closing quote.
fn string_end(text: &[u8], i: usize) -> Option<usize> {
    if text.get(i) != Some(&b'"') {
        return None;
    }
    let mut k = i + 1;
    loop {
        match text.get(k)? {
            b'"' => return Some(k + 1),
            b'\\' => k += 2,
            _ => k += 1,
        }
    }
}

/// Where the value starting at `i` ends.
fn value_end(text: &[u8], i: usize) -> Option<usize> {
    match text.get(i)? {
        b'"' => string_end(text, i),
        b'{' | b'[' => {
            let mut depth = 0usize;
            let mut k = i;
            loop {
                match text.get(k)? {
                    b'"' => {
                        k = string_end(text, k)?;
                        continue;
                    }
                    b'{' | b'[' => depth += 1,
                    b'}' | b']' => {
                        depth -= 1;
                        if depth == 0 {
                            return Some(k + 1);
                        }
                    }
                    _ => {}
                }
                k += 1;
            }
        }
        _ => {
            let length = text[i..]
                .iter()
                .position(|c| matches!(c, b',' | b'}' | b']' | b' ' | b'\t' | b'\n' | b'\r'))
                .unwrap_or(text.len() - i);
            (length > 0).then_some(i + length)
        }
    }
}

/// A JSON string's contents (between its quotes) decoded.
fn unescape(raw: &[u8]) -> Option<String> {
    if !raw.contains(&b'\\') {
        return String::from_utf8(raw.to_vec()).ok();
    }
    let mut out = Vec::with_capacity(raw.len());
    let mut k = 0;
    while k < raw.len() {
        if raw[k] != b'\\' {
            out.push(raw[k]);
            k += 1;
            continue;
        }
        let escaped = *raw.get(k + 1)?;
        k += 2;
        let plain = match escaped {
            b'"' => b'"',
            b'\\' => b'\\',
            b'/' => b'/',
            b'b' => 0x08,
            b'f' => 0x0c,
            b'n' => b'\n',
            b'r' => b'\r',
            b't' => b'\t',
            b'u' => {
                let unit = hex4(raw.get(k..k + 4)?)?;
                k += 4;
                let code = if (0xd800..0xdc00).contains(&unit) {
                    // A high surrogate: its low half follows as another escape.
                    if raw.get(k..k + 2)? != b"\\u" {
                        return None;
                    }
                    let low = hex4(raw.get(k + 2..k + 6)?)?;
                    k += 6;
                    if !(0xdc00..0xe000).contains(&low) {
                        return None;
                    }
                    0x10000 + ((unit - 0xd800) << 10) + (low - 0xdc00)
                } else {
                    unit
                };
                let mut buffer = [0u8; 4];
                out.extend_from_slice(char::from_u32(code)?.encode_utf8(&mut buffer).as_bytes());
                continue;
            }
            _ => return None,
        };
        out.push(plain);
    }
    String::from_utf8(out).ok()
}

fn hex4(digits: &[u8]) -> Option<u32> {
    u32::from_str_radix(std::str::from_utf8(digits).ok()?, 16).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lane::OwnedOutput;

    fn response(parameters: &str, outputs: Vec<OwnedOutput>) -> OwnedResponse {
        OwnedResponse {
            model_name: "m".to_owned(),
            model_version: "1".to_owned(),
            id: String::new(),
            parameters: parameters.to_owned(),
            outputs,
        }
    }

    fn output(name: &str, datatype: &str, shape: Vec<i64>, data: Vec<u8>) -> OwnedOutput {
        OwnedOutput {
            name: name.to_owned(),
            datatype: datatype.to_owned(),
            shape,
            data,
            in_place: false,
        }
    }

    fn text(bytes: &[u8]) -> &str {
        std::str::from_utf8(bytes).unwrap()
    }

    #[test]
    fn a_response_is_one_flat_object_sorted_by_name() {
        let ints: Vec<u8> = [3i32, -4].iter().flat_map(|v| v.to_le_bytes()).collect();
        let one = 0.5f32.to_le_bytes().to_vec();
        let mut words = Vec::new();
        for word in ["a\"b", "é"] {
            words.extend_from_slice(&u32::try_from(word.len()).unwrap().to_le_bytes());
            words.extend_from_slice(word.as_bytes());
        }
        let mut answer = response(
            r#"{"zeta":1.5,"alpha":"x","nested":{"k":[1,"]"]}}"#,
            vec![
                output("OUT", "INT32", vec![2], ints),
                output("ONE", "FP32", vec![1, 1], one),
                output("TEXT", "BYTES", vec![2], words),
            ],
        );
        answer.id = "7".to_owned();
        assert_eq!(
            text(&response_json(&answer).unwrap()),
            r#"{"ONE":0.5,"OUT":[3,-4],"TEXT":["a\"b","é"],"alpha":"x","id":"7","model_name":"m","model_version":"1","nested":{"k":[1,"]"]},"zeta":1.5}"#
        );
    }

    #[test]
    fn parameters_and_outputs_override_in_the_reference_order() {
        let answer = response(
            r#"{"model_name":"renamed","id":"p"}"#,
            vec![output("id", "BOOL", vec![1], vec![1])],
        );
        assert_eq!(
            text(&response_json(&answer).unwrap()),
            r#"{"id":true,"model_name":"renamed","model_version":"1"}"#
        );
    }

    #[test]
    fn escaped_names_are_decoded_for_their_order() {
        let members = object_members(br#"{"\u00e9":1,"a\"b":true,"\ud83d\ude00":null}"#).unwrap();
        let names: Vec<&str> = members.iter().map(|(name, _)| name.as_str()).collect();
        assert_eq!(names, ["é", "a\"b", "😀"]);
        assert!(object_members(b"[1]").is_err());
        assert!(object_members(br#"{"a":1"#).is_err());
        assert!(object_members(br#"{"\ud800":1}"#).is_err());
    }

    #[test]
    fn events_are_chunks_and_errors_are_objects() {
        let mut out = Vec::new();
        push_event(&mut out, b"{}");
        assert_eq!(text(&out), "a\r\ndata: {}\n\n\r\n");
        assert_eq!(text(&error_json("no \"way\"")), r#"{"error":"no \"way\""}"#);
    }

    fn writer_and_peer() -> (EventWriter, std::net::TcpStream, crate::outbox::Outbox) {
        use std::os::fd::AsFd;
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (server, _) = listener.accept().unwrap();
        let outbox = crate::outbox::Outbox::new().unwrap();
        let stream = outbox.open(server.as_fd()).unwrap();
        (EventWriter::new(stream), client, outbox)
    }

    fn read_all(mut client: std::net::TcpStream, writer: EventWriter) -> String {
        use std::io::Read;
        drop(writer);
        client
            .set_read_timeout(Some(Duration::from_millis(300)))
            .unwrap();
        let mut got = Vec::new();
        let mut buffer = [0u8; 4096];
        while let Ok(n) = client.read(&mut buffer) {
            if n == 0 {
                break;
            }
            got.extend_from_slice(&buffer[..n]);
        }
        String::from_utf8(got).unwrap()
    }

    #[test]
    fn the_head_goes_with_the_first_event_and_an_error_later_is_an_event() {
        let (writer, client, _outbox) = writer_and_peer();
        let first = Ok(Answer::Response(response("", Vec::new())));
        assert!(writer.write(Some(&first), false));
        assert!(writer.started() && writer.first_at() > 0);
        assert!(writer.write(Some(&Err(CoreError::internal("late"))), false));
        assert!(writer.write(None, true));
        let got = read_all(client, writer);
        assert!(got.starts_with("HTTP/1.1 200 OK\r\n"), "{got}");
        assert!(got.ends_with(
            "2e\r\ndata: {\"model_name\":\"m\",\"model_version\":\"1\"}\n\n\r\n\
             18\r\ndata: {\"error\":\"late\"}\n\n\r\n"
        ));
    }

    #[test]
    fn a_whole_writer_answers_everything_itself_and_names_its_token() {
        use std::os::fd::AsFd;
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let cases: [(Option<Result<Answer, CoreError>>, &str); 2] = [
            (
                Some(Err(CoreError::invalid_arg("bad"))),
                "HTTP/1.1 400 Bad Request\r\n",
            ),
            (None, "HTTP/1.1 200 OK\r\n"),
        ];
        for (token, (first, status)) in (1u64..).zip(cases) {
            let client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
            let (server, _) = listener.accept().unwrap();
            let outbox = crate::outbox::Outbox::new().unwrap();
            let stream = outbox.open(server.as_fd()).unwrap();
            let completions = Arc::new(Completions::new().unwrap());
            let writer = EventWriter::whole(stream, Arc::clone(&completions), token);
            assert!(writer.write(first.as_ref(), true));
            assert_eq!(completions.take(), [token]);
            let got = read_all(client, writer);
            assert!(got.starts_with(status), "{got}");
            assert!(got.ends_with("\r\n0\r\n\r\n"), "{got:?}");
            assert_eq!(got.contains("\"error\":\"bad\""), token == 1, "{got}");
        }
    }

    #[test]
    fn a_first_error_or_bare_final_flag_is_declined_and_so_is_the_rest() {
        for first in [None, Some(Err(CoreError::invalid_arg("bad")))] {
            let (writer, client, _outbox) = writer_and_peer();
            assert!(!writer.write(first.as_ref(), false));
            let later = Ok(Answer::Response(response("", Vec::new())));
            assert!(!writer.write(Some(&later), true));
            assert!(!writer.started());
            assert_eq!(read_all(client, writer), "");
        }
    }
}
