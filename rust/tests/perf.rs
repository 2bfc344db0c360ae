//! The load generator against small servers of the test's own: every request answered and
//! recorded, failures counted with the server's words, open-loop rates kept.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::time::Duration;

use bytes::Bytes;
use tritonfast_core::perf::{Load, LoadSpec, Pace, Protocol, Record};

/// An HTTP/1.1 server on a free port answering every request with `status` and `body`; each
/// connection on a thread of its own.
fn http_server(status: u16, body: &'static str) -> String {
    slow_http_server(status, body, Duration::ZERO)
}

/// The same, answering each request `delay` after it came.
fn slow_http_server(status: u16, body: &'static str, delay: Duration) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let address = listener.local_addr().unwrap().to_string();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(stream) = stream else { return };
            std::thread::spawn(move || {
                let mut reader = BufReader::new(stream.try_clone().unwrap());
                let mut writer = stream;
                loop {
                    let mut length = 0usize;
                    loop {
                        let mut line = String::new();
                        if reader.read_line(&mut line).unwrap_or(0) == 0 {
                            return;
                        }
                        if let Some(value) =
                            line.to_ascii_lowercase().strip_prefix("content-length:")
                        {
                            length = value.trim().parse().unwrap();
                        }
                        if line == "\r\n" {
                            break;
                        }
                    }
                    let mut request_body = vec![0; length];
                    reader.read_exact(&mut request_body).unwrap();
                    std::thread::sleep(delay);
                    let answer = format!(
                        "HTTP/1.1 {status} X\r\nContent-Length: {}\r\n\r\n{body}",
                        body.len()
                    );
                    if writer.write_all(answer.as_bytes()).is_err() {
                        return;
                    }
                }
            });
        }
    });
    address
}

/// What an HTTP/2 test server does with each call: its request's body, and where to answer.
type Call = (h2::RecvStream, h2::SendStream<Bytes>);

/// An HTTP/2 server on a free port whose every call (headers answered with gRPC's content
/// type) is handed to `handle`, each on a task of its own.
fn h2_server<F, Fut>(handle: F) -> String
where
    F: Fn(Call) -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let address = listener.local_addr().unwrap().to_string();
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async move {
            let listener = tokio::net::TcpListener::from_std(listener).unwrap();
            loop {
                let (socket, _) = listener.accept().await.unwrap();
                let handle = handle.clone();
                tokio::spawn(async move {
                    let mut connection = h2::server::handshake(socket).await.unwrap();
                    while let Some(Ok((request, mut respond))) = connection.accept().await {
                        let head = http::Response::builder()
                            .header("content-type", "application/grpc")
                            .body(())
                            .unwrap();
                        let stream = respond.send_response(head, false).unwrap();
                        tokio::spawn(handle.clone()((request.into_body(), stream)));
                    }
                });
            }
        });
    });
    address
}

/// An HTTP/2 server answering every gRPC call with the grpc-status `code`.
fn grpc_server(code: u32) -> String {
    h2_server(move |(mut body, mut stream): Call| async move {
        while let Some(Ok(chunk)) = body.data().await {
            let _ = body.flow_control().release_capacity(chunk.len());
        }
        stream
            .send_data(Bytes::from_static(b"\0\0\0\0\x02ok"), false)
            .unwrap();
        let mut trailers = http::HeaderMap::new();
        trailers.insert("grpc-status", code.to_string().parse().unwrap());
        trailers.insert("grpc-message", "bad%20input".parse().unwrap());
        stream.send_trailers(trailers).unwrap();
    })
}

/// A length-delimited protobuf field (payloads under 128 bytes).
fn field(number: u8, payload: &[u8]) -> Vec<u8> {
    let mut out = vec![(number << 3) | 2, u8::try_from(payload.len()).unwrap()];
    out.extend_from_slice(payload);
    out
}

/// A gRPC-framed `ModelStreamInferResponse`: an error, or a response whose
/// `triton_final_response` is `last`.
fn stream_response(error: Option<&str>, last: bool) -> Bytes {
    let message = error.map_or_else(
        || {
            let entry = [
                field(1, b"triton_final_response"),
                field(2, &[0x08, u8::from(last)]),
            ];
            // An empty final response has no outputs; the others carry one.
            let output = if last {
                Vec::new()
            } else {
                field(5, b"output")
            };
            field(2, &[field(4, &entry.concat()), output].concat())
        },
        |text| field(1, text.as_bytes()),
    );
    let mut framed = vec![0];
    framed.extend_from_slice(&u32::try_from(message.len()).unwrap().to_be_bytes());
    framed.extend_from_slice(&message);
    Bytes::from(framed)
}

/// An HTTP/2 server answering each message of a `ModelStreamInfer` stream with `answers`.
fn stream_server(answers: Vec<Bytes>) -> String {
    h2_server(move |(mut body, mut stream): Call| {
        let answers = answers.clone();
        async move {
            let mut pending = Vec::new();
            while let Some(Ok(chunk)) = body.data().await {
                let _ = body.flow_control().release_capacity(chunk.len());
                pending.extend_from_slice(&chunk);
                // Each whole message gets the answers.
                while pending.len() >= 5 {
                    let length = u32::from_be_bytes(pending[1..5].try_into().unwrap());
                    let whole = 5 + length as usize;
                    if pending.len() < whole {
                        break;
                    }
                    pending.drain(..whole);
                    for answer in &answers {
                        stream.send_data(answer.clone(), false).unwrap();
                    }
                }
            }
        }
    })
}

fn spec(protocol: Protocol, address: String, pace: Pace) -> LoadSpec {
    let request = format!(
        "POST /v2/models/m/infer HTTP/1.1\r\nHost: {address}\r\nContent-Length: 4\r\n\r\nbody"
    );
    LoadSpec {
        protocol,
        address,
        path: "/inference.GRPCInferenceService/ModelInfer".to_string(),
        payloads: vec![request.into_bytes()],
        scripts: Vec::new(),
        decoupled: false,
        serial: false,
        threads: 2,
        connections_per_thread: 2,
        pace,
        seed: 1,
    }
}

/// Runs the load for `how_long` and returns every record.
fn run(spec: LoadSpec, how_long: Duration) -> (Vec<Record>, Load) {
    let mut load = Load::start(spec).unwrap();
    std::thread::sleep(how_long);
    load.stop();
    (load.take(), load)
}

fn assert_ordered(records: &[Record]) {
    for record in records {
        assert!(record.start <= record.sent, "{record:?}");
        assert!(record.sent <= record.first_byte, "{record:?}");
        assert!(record.first_byte <= record.end, "{record:?}");
    }
}

#[test]
fn a_closed_loop_over_http_records_every_answer() {
    let (records, load) = run(
        spec(Protocol::Http, http_server(200, "{}"), Pace::Concurrency(3)),
        Duration::from_millis(300),
    );
    assert!(records.len() > 10, "only {} answers", records.len());
    assert!(records.iter().all(|r| r.ok));
    assert_ordered(&records);
    let counts = load.counts();
    assert_eq!((counts.succeeded, counts.failed), (records.len() as u64, 0));
    assert!(load.take().is_empty(), "records are handed out once");
}

#[test]
fn http_error_answers_are_failures_with_the_servers_words() {
    let (records, load) = run(
        spec(
            Protocol::Http,
            http_server(400, "{\"error\":\"bad shape\"}"),
            Pace::Concurrency(1),
        ),
        Duration::from_millis(100),
    );
    assert!(!records.is_empty() && records.iter().all(|r| !r.ok));
    assert_eq!(
        load.errors(),
        vec!["HTTP 400: {\"error\":\"bad shape\"}".to_string()]
    );
}

#[test]
fn grpc_calls_are_judged_by_their_status() {
    let (records, load) = run(
        spec(Protocol::Grpc, grpc_server(0), Pace::Concurrency(4)),
        Duration::from_millis(300),
    );
    assert!(
        records.len() > 10 && records.iter().all(|r| r.ok),
        "{:?}",
        load.errors()
    );
    assert_ordered(&records);

    let (records, load) = run(
        spec(Protocol::Grpc, grpc_server(3), Pace::Concurrency(1)),
        Duration::from_millis(100),
    );
    assert!(!records.is_empty() && records.iter().all(|r| !r.ok));
    assert_eq!(load.errors(), vec!["gRPC status 3: bad input".to_string()]);
}

#[test]
fn an_open_loop_keeps_its_rate() {
    for poisson in [false, true] {
        let pace = Pace::Rate {
            per_second: 400.0,
            poisson,
        };
        let (records, _) = run(
            spec(Protocol::Http, http_server(200, "{}"), pace),
            Duration::from_secs(1),
        );
        // 400 requests in the second, give or take the start and the scheduler.
        assert!(
            (300..=500).contains(&records.len()),
            "{} requests (poisson {poisson})",
            records.len()
        );
        assert!(records.iter().all(|r| r.ok));
    }
}

#[test]
fn a_server_that_is_not_there_fails_the_start() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let address = listener.local_addr().unwrap().to_string();
    drop(listener);
    for protocol in [Protocol::Http, Protocol::Grpc] {
        let error = Load::start(spec(protocol, address.clone(), Pace::Concurrency(1))).unwrap_err();
        assert!(
            error.starts_with(&format!("cannot connect to {address}")),
            "{error}"
        );
    }
}

#[test]
fn a_load_without_requests_or_pace_is_refused() {
    let mut empty = spec(
        Protocol::Http,
        "127.0.0.1:1".to_string(),
        Pace::Concurrency(1),
    );
    empty.payloads.clear();
    assert_eq!(Load::start(empty).unwrap_err(), "no requests to send");
    let idle = spec(
        Protocol::Http,
        "127.0.0.1:1".to_string(),
        Pace::Concurrency(0),
    );
    assert_eq!(
        Load::start(idle).unwrap_err(),
        "the concurrency must be at least 1"
    );
}

#[test]
fn scripts_set_the_order_of_the_payloads() {
    let mut spec = spec(Protocol::Http, http_server(200, "{}"), Pace::Concurrency(2));
    spec.payloads = vec![spec.payloads[0].clone(); 3];
    spec.scripts = vec![vec![0, 1, 1], vec![2]];
    let (mut records, _) = run(spec, Duration::from_millis(200));
    records.sort_by_key(|r| r.start);
    let first: Vec<u32> = records
        .iter()
        .map(|r| r.payload)
        .filter(|&p| p != 2)
        .take(6)
        .collect();
    assert_eq!(first, [0, 1, 1, 0, 1, 1]);
    assert!(
        records.iter().any(|r| r.payload == 2),
        "the second context runs its own script"
    );
}

#[test]
fn a_stream_request_ends_at_its_final_response() {
    let answers = vec![
        stream_response(None, false),
        stream_response(None, false),
        stream_response(None, true),
    ];
    let mut decoupled = spec(
        Protocol::GrpcStream,
        stream_server(answers),
        Pace::Concurrency(2),
    );
    decoupled.decoupled = true;
    let (records, load) = run(decoupled, Duration::from_millis(300));
    assert!(
        records.len() > 5 && records.iter().all(|r| r.ok),
        "{:?}",
        load.errors()
    );
    assert!(
        records.iter().all(|r| r.responses == 2),
        "two responses each, and an empty final one"
    );
    assert_ordered(&records);

    // A model that is not decoupled answers once per request.
    let once = spec(
        Protocol::GrpcStream,
        stream_server(vec![stream_response(None, false)]),
        Pace::Concurrency(1),
    );
    let (records, _) = run(once, Duration::from_millis(200));
    assert!(records.len() > 5 && records.iter().all(|r| r.ok && r.responses == 1));
}

#[test]
fn a_stream_error_fails_its_request_with_the_servers_words() {
    let answers = vec![stream_response(Some("unexpected shape"), false)];
    let (records, load) = run(
        spec(
            Protocol::GrpcStream,
            stream_server(answers),
            Pace::Concurrency(1),
        ),
        Duration::from_millis(100),
    );
    assert!(!records.is_empty() && records.iter().all(|r| !r.ok));
    assert_eq!(
        load.errors(),
        vec!["gRPC stream error: unexpected shape".to_string()]
    );
    let rate = spec(
        Protocol::GrpcStream,
        "127.0.0.1:1".to_string(),
        Pace::Rate {
            per_second: 1.0,
            poisson: false,
        },
    );
    assert_eq!(
        Load::start(rate).unwrap_err(),
        "streams are measured with a concurrency, not a request rate"
    );
}

#[test]
fn a_serial_open_loop_keeps_one_request_of_each_script_in_flight() {
    let address = slow_http_server(200, "{}", Duration::from_millis(20));
    let mut spec = spec(
        Protocol::Http,
        address,
        Pace::Rate {
            per_second: 500.0,
            poisson: false,
        },
    );
    spec.payloads = vec![spec.payloads[0].clone(); 2];
    spec.scripts = vec![vec![0], vec![1]];
    spec.threads = 1;
    spec.serial = true;
    let (mut records, _) = run(spec, Duration::from_millis(500));
    records.sort_by_key(|r| r.start);
    for script in [0, 1] {
        let own: Vec<&Record> = records.iter().filter(|r| r.payload == script).collect();
        assert!(own.len() >= 5, "script {script}: {} requests", own.len());
        for pair in own.windows(2) {
            assert!(
                pair[1].start >= pair[0].end,
                "script {script}: {pair:?} overlap"
            );
        }
    }
    // Two scripts of 20 ms requests: far below the 500 per second asked.
    assert!(records.len() <= 60, "{} requests", records.len());
}
