//! gRPC over HTTP/2 to etcd's members, on the hyper hive already has.
//!
//! gRPC is HTTP/2: a call is a POST to `/<package>.<Service>/<Method>` with
//! `content-type: application/grpc`; each message in either direction is one byte (0: not
//! compressed), its length as four big-endian bytes, then its protobuf bytes; the status
//! comes last, as the `grpc-status` and `grpc-message` trailers (or as headers when the
//! call fails before any message). A unary call sends one message and reads one; a stream
//! keeps its request body open for more.
//!
//! Each member gets one HTTP/2 connection, opened on first use and again once it closed;
//! every call to that member is a stream on it (etcd's own clients do the same). Pings
//! every few seconds find a connection whose member went away while nothing was sent.

use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use http_body::Frame;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http2::SendRequest;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::sync::mpsc;

/// How long opening a connection to a member may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);

/// How often an idle connection is pinged, and how long a ping may go unanswered before
/// the connection counts as lost.
const PING_EVERY: Duration = Duration::from_secs(3);
const PING_TIMEOUT: Duration = Duration::from_secs(3);

/// The longest message read from etcd (its largest value is 1.5 MiB by default; a watch
/// message or a range page may carry many).
pub const MAX_MESSAGE: usize = 256 << 20;

/// The body of a call: one message, or a stream's messages as they are sent.
pub type Body = BoxBody<Bytes, Infallible>;

/// How a call failed.
#[derive(Debug)]
pub enum CallError {
    /// No connection could be opened, or the one open was closed before the call went
    /// out: nothing was sent.
    NotSent(String),
    /// Sent, then no whole answer came back: it may have been applied.
    Lost(String),
    /// etcd answered with a non-OK status.
    Status { code: i64, message: String },
}

/// One member's connection, opened when first needed.
pub struct Member {
    /// `http://host:port`.
    pub endpoint: String,
    authority: String,
    connection: tokio::sync::Mutex<Option<SendRequest<Body>>>,
}

impl Member {
    /// The member at `endpoint` (`http://host:port`), not connected yet.
    pub fn new(endpoint: String) -> Member {
        let authority = endpoint.trim_start_matches("http://").trim_end_matches('/').to_owned();
        Member { endpoint, authority, connection: tokio::sync::Mutex::new(None) }
    }

    /// A sender on the open connection, or on a new one.
    async fn sender(&self) -> Result<SendRequest<Body>, CallError> {
        let mut connection = self.connection.lock().await;
        if let Some(sender) = connection.as_ref().filter(|s| !s.is_closed()) {
            return Ok(sender.clone());
        }
        *connection = None;
        let not_sent = |e: &dyn std::fmt::Display| CallError::NotSent(format!("{}: {e}", self.endpoint));
        let tcp = tokio::time::timeout(CONNECT_TIMEOUT, tokio::net::TcpStream::connect(&self.authority))
            .await
            .map_err(|_| not_sent(&"connecting timed out"))?
            .map_err(|e| not_sent(&e))?;
        tcp.set_nodelay(true).map_err(|e| not_sent(&e))?;
        let (sender, driver) = hyper::client::conn::http2::Builder::new(TokioExecutor::new())
            .timer(TokioTimer::new())
            .keep_alive_interval(PING_EVERY)
            .keep_alive_timeout(PING_TIMEOUT)
            .keep_alive_while_idle(true)
            .initial_stream_window_size(4 << 20)
            .initial_connection_window_size(16 << 20)
            .max_frame_size(1 << 20)
            .handshake::<_, Body>(TokioIo::new(tcp))
            .await
            .map_err(|e| not_sent(&e))?;
        let endpoint = self.endpoint.clone();
        tokio::spawn(async move {
            if let Err(e) = driver.await {
                tracing::debug!(%endpoint, "etcd connection ended: {e}");
            }
        });
        *connection = Some(sender.clone());
        Ok(sender)
    }

    /// Opens a call of `method` (`/etcdserverpb.KV/Txn`) with `body`, and returns its
    /// answer's status line and headers checked, its body still to read.
    async fn open(&self, method: &str, body: Body) -> Result<hyper::body::Incoming, CallError> {
        let mut sender = self.sender().await?;
        if sender.ready().await.is_err() {
            // The connection closed since it was last used: open another, once.
            *self.connection.lock().await = None;
            sender = self.sender().await?;
            sender.ready().await.map_err(|e| CallError::NotSent(format!("{}: {e}", self.endpoint)))?;
        }
        let request = http::Request::post(format!("http://{}{method}", self.authority))
            .header(http::header::CONTENT_TYPE, "application/grpc")
            .header(http::header::TE, "trailers")
            .body(body)
            .map_err(|e| CallError::NotSent(e.to_string()))?;
        let response = sender
            .send_request(request)
            .await
            .map_err(|e| CallError::Lost(format!("{}: {e}", self.endpoint)))?;
        let (parts, body) = response.into_parts();
        if let Some(failed) = status_of(&parts.headers) {
            return Err(failed);
        }
        if parts.status != http::StatusCode::OK {
            return Err(CallError::Lost(format!("{}: HTTP {}", self.endpoint, parts.status)));
        }
        Ok(body)
    }

    /// A unary call: `request` to `method`, its one answer decoded.
    pub async fn call<M: prost::Message + Default>(
        &self,
        method: &str,
        request: &impl prost::Message,
    ) -> Result<M, CallError> {
        let body = self.open(method, Full::new(frame(request)).boxed()).await?;
        let mut answer =
            Answers { endpoint: self.endpoint.clone(), body, buffer: BytesMut::new(), done: false };
        let message = match answer.next().await {
            Some(Ok(message)) => message,
            Some(Err(e)) => return Err(e),
            None => {
                return Err(CallError::Lost(format!("{}: the call ended without an answer", self.endpoint)))
            }
        };
        // The status follows the answer (in the same write, as etcd sends it): read it, so
        // the stream ends rather than being reset, and a failure after the answer counts.
        // A connection lost after the answer leaves the answer standing.
        match answer.next().await {
            Some(Err(failed @ CallError::Status { .. })) => return Err(failed),
            Some(Ok(_)) => {
                return Err(CallError::Status {
                    code: -1,
                    message: "etcd answered a unary call twice".into(),
                })
            }
            None | Some(Err(_)) => {}
        }
        M::decode(message)
            .map_err(|e| CallError::Status { code: -1, message: format!("unreadable answer from etcd: {e}") })
    }

    /// Opens a stream of `method` with `first` as its first message; the returned sender
    /// sends more (the stream's request side stays open while it lives).
    pub async fn stream(
        &self,
        method: &str,
        first: &impl prost::Message,
    ) -> Result<(mpsc::Sender<Bytes>, Answers), CallError> {
        let (sender, requests) = mpsc::channel(8);
        let _ = sender.try_send(frame(first));
        let body = self.open(method, BodyExt::boxed(Requests(requests))).await?;
        Ok((sender, Answers { endpoint: self.endpoint.clone(), body, buffer: BytesMut::new(), done: false }))
    }
}

/// The messages of a call's answer, as they arrive.
pub struct Answers {
    endpoint: String,
    body: hyper::body::Incoming,
    buffer: BytesMut,
    done: bool,
}

impl Answers {
    /// The next message's protobuf bytes; `None` once the call ended with status OK.
    pub async fn next(&mut self) -> Option<Result<Bytes, CallError>> {
        loop {
            if self.buffer.len() >= 5 {
                let length =
                    u32::from_be_bytes([self.buffer[1], self.buffer[2], self.buffer[3], self.buffer[4]]);
                let length = length as usize;
                if self.buffer[0] != 0 {
                    return Some(Err(CallError::Status {
                        code: -1,
                        message: "etcd sent a compressed message, which was not asked for".into(),
                    }));
                }
                if length > MAX_MESSAGE {
                    return Some(Err(CallError::Status {
                        code: -1,
                        message: format!("a message from etcd of {length} bytes is over {MAX_MESSAGE}"),
                    }));
                }
                if self.buffer.len() >= 5 + length {
                    self.buffer.advance(5);
                    return Some(Ok(self.buffer.split_to(length).freeze()));
                }
            }
            if self.done {
                return None;
            }
            match self.body.frame().await {
                Some(Ok(frame)) => match frame.into_data() {
                    Ok(data) => self.buffer.extend_from_slice(&data),
                    Err(frame) => {
                        self.done = true;
                        if let Some(failed) = frame.trailers_ref().and_then(status_of) {
                            return Some(Err(failed));
                        }
                        if !self.buffer.is_empty() {
                            return Some(Err(CallError::Lost(format!(
                                "{}: the call ended in the middle of a message",
                                self.endpoint
                            ))));
                        }
                    }
                },
                Some(Err(e)) => return Some(Err(CallError::Lost(format!("{}: {e}", self.endpoint)))),
                None => {
                    self.done = true;
                    if !self.buffer.is_empty() {
                        return Some(Err(CallError::Lost(format!(
                            "{}: the call ended in the middle of a message",
                            self.endpoint
                        ))));
                    }
                    return Some(Err(CallError::Lost(format!(
                        "{}: the call ended without a status",
                        self.endpoint
                    ))));
                }
            }
        }
    }
}

/// A stream's request body: the messages its sender sends, until the sender is dropped.
struct Requests(mpsc::Receiver<Bytes>);

impl http_body::Body for Requests {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        self.0.poll_recv(cx).map(|message| message.map(|m| Ok(Frame::data(m))))
    }
}

/// `message` as one gRPC message: not compressed, its length, its bytes.
pub fn frame(message: &impl prost::Message) -> Bytes {
    let length = message.encoded_len();
    let mut buffer = BytesMut::with_capacity(5 + length);
    buffer.put_u8(0);
    buffer.put_u32(u32::try_from(length).unwrap_or(u32::MAX));
    // Encoding into a buffer with room for the message cannot fail.
    let _ = message.encode(&mut buffer);
    buffer.freeze()
}

/// The failure `headers` carry (`grpc-status` other than 0), if they do.
fn status_of(headers: &http::HeaderMap) -> Option<CallError> {
    let code: i64 = headers.get("grpc-status")?.to_str().ok()?.trim().parse().ok()?;
    if code == 0 {
        return None;
    }
    // `grpc-message` is percent-encoded UTF-8.
    let message = headers
        .get("grpc-message")
        .map(|m| percent_encoding::percent_decode(m.as_bytes()).decode_utf8_lossy().into_owned())
        .unwrap_or_default();
    Some(CallError::Status { code, message })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_status_names_its_code_and_its_decoded_message() {
        let mut headers = http::HeaderMap::new();
        headers.insert("grpc-status", "11".parse().unwrap());
        headers.insert(
            "grpc-message",
            "etcdserver: mvcc: required revision has been compacted%21".parse().unwrap(),
        );
        match status_of(&headers) {
            Some(CallError::Status { code: 11, message }) => {
                assert_eq!(message, "etcdserver: mvcc: required revision has been compacted!")
            }
            other => panic!("{other:?}"),
        }
        headers.insert("grpc-status", "0".parse().unwrap());
        assert!(status_of(&headers).is_none());
        assert!(status_of(&http::HeaderMap::new()).is_none());
    }

    #[test]
    fn a_frame_is_a_flag_a_length_and_the_message() {
        let message = super::super::proto::LeaseId { id: 300 };
        let framed = frame(&message);
        assert_eq!(&framed[..5], &[0, 0, 0, 0, 3]);
        assert_eq!(&framed[5..], &[0x08, 0xac, 0x02]);
    }
}
