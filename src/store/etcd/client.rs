//! A small client of etcd's v3 gRPC API: ranges, transactions, watches, leases and
//! compaction, over one HTTP/2 connection per member ([`grpc`](super::grpc)) with the
//! messages of [`proto`](super::proto). The default build needs no `protoc`.
//!
//! Endpoints are tried in turn: a request that could not be sent (no connection) moves
//! on to the next member at once. A request that was sent and then failed — a timeout,
//! a dropped connection, etcd's own "request timed out" or "leader changed" — may have
//! been applied; [`ClientError::Indeterminate`] says so, and the caller resolves it (see
//! `etcd::resolve`).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::mpsc;

use super::grpc::{Answers, CallError, Member};
use super::proto;

/// How long one unary request may take before it is given up (and, for a write,
/// resolved by reading back).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// Why a request to etcd failed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ClientError {
    /// No member could be reached: nothing was sent, so nothing was applied.
    #[error("no etcd member answers ({endpoints}): {last}")]
    Unreachable {
        /// The members tried.
        endpoints: String,
        /// The last connection error.
        last: String,
    },
    /// The request was sent but no answer came back: it may or may not have been applied.
    #[error("etcd did not answer in time ({endpoint}): {message}")]
    Indeterminate {
        /// The member the request went to.
        endpoint: String,
        /// What went wrong.
        message: String,
    },
    /// etcd answered with an error (a gRPC status).
    #[error("etcd refused the request: {message}")]
    Refused {
        /// The gRPC status code.
        code: i64,
        /// etcd's message, e.g. `etcdserver: too many operations in txn request`.
        message: String,
    },
}

impl ClientError {
    /// etcd's "required revision has been compacted" (a range or watch below the
    /// compacted revision).
    pub fn is_compacted(&self) -> bool {
        matches!(self, ClientError::Refused { message, .. } if message.contains("compacted"))
    }

    /// etcd's refusal of a transaction over its request limits (`--max-txn-ops`,
    /// `--max-request-bytes`).
    pub fn is_too_large(&self) -> bool {
        matches!(self, ClientError::Refused { message, .. }
            if message.contains("too many operations") || message.contains("request is too large"))
    }
}

/// A key and its value as etcd holds them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KeyValue {
    pub key: Vec<u8>,
    pub value: Vec<u8>,
    pub create_revision: u64,
    pub mod_revision: u64,
    pub lease: i64,
}

/// One change of a watch: a put, or a delete with the value it removed.
#[derive(Clone, Debug)]
pub struct WatchEvent {
    pub deleted: bool,
    pub kv: KeyValue,
    pub prev: Option<KeyValue>,
}

/// One message of a watch stream.
#[derive(Debug, Default)]
pub struct WatchResponse {
    /// The store's revision when the message was sent.
    pub revision: u64,
    pub created: bool,
    pub canceled: bool,
    /// Set when the watch started below the compacted revision.
    pub compact_revision: u64,
    pub cancel_reason: String,
    pub events: Vec<WatchEvent>,
}

/// A comparison of a transaction's guard.
#[derive(Clone, Debug)]
pub enum Compare {
    /// The key was last written at this revision (0: the key does not exist).
    ModRevision(Vec<u8>, u64),
    /// The key was created at this revision (0: the key does not exist).
    CreateRevision(Vec<u8>, u64),
}

/// An operation of a transaction.
#[derive(Clone, Debug)]
pub enum Op {
    Put {
        key: Vec<u8>,
        value: Vec<u8>,
        lease: i64,
    },
    Delete {
        key: Vec<u8>,
    },
    /// Every key from `from` up to `to`, not included.
    DeleteRange {
        from: Vec<u8>,
        to: Vec<u8>,
    },
    Get {
        key: Vec<u8>,
    },
}

/// What a transaction did.
#[derive(Debug)]
pub struct TxnResponse {
    /// The store's revision after it: the transaction's own when it wrote something.
    pub revision: u64,
    pub succeeded: bool,
    /// For each `Get` of the branch taken, in order: the key's value, if it exists.
    pub gets: Vec<Option<KeyValue>>,
}

/// A page of a range read.
#[derive(Debug)]
pub struct RangeResponse {
    pub revision: u64,
    pub kvs: Vec<KeyValue>,
    pub more: bool,
}

/// gRPC status codes etcd answers when a request may have been applied: the deadline
/// passed (`etcdserver: request timed out`), the call was cancelled, or the member lost
/// its leader while the request was in flight (`etcdserver: leader changed`).
const CANCELLED: i64 = 1;
const DEADLINE_EXCEEDED: i64 = 4;
const UNAVAILABLE: i64 = 14;

/// A client of one etcd cluster.
pub struct Client {
    members: Vec<Member>,
    /// `http://host:port` of each member.
    endpoints: Vec<String>,
    /// The member that answered last: tried first.
    current: AtomicUsize,
}

impl Client {
    /// A client of the members at `endpoints` (`host:port` or `http://host:port`).
    pub fn new(endpoints: &[String]) -> Result<Client, ClientError> {
        let endpoints: Vec<String> =
            endpoints
                .iter()
                .map(|e| {
                    if e.contains("://") {
                        e.trim_end_matches('/').to_owned()
                    } else {
                        format!("http://{e}")
                    }
                })
                .collect();
        if let Some(other) = endpoints.iter().find(|e| !e.starts_with("http://")) {
            return Err(ClientError::Unreachable {
                endpoints: endpoints.join(","),
                last: format!("{other}: only plaintext members (http://) are supported"),
            });
        }
        let members = endpoints.iter().cloned().map(Member::new).collect();
        Ok(Client { members, endpoints, current: AtomicUsize::new(0) })
    }

    /// The members, as `http://host:port`.
    pub fn endpoints(&self) -> &[String] {
        &self.endpoints
    }

    /// Runs `attempt` on the first member that takes the connection, starting with the
    /// one that answered last, within `timeout`.
    async fn each_member<'a, T, F, Fut>(&'a self, timeout: Duration, attempt: F) -> Result<T, ClientError>
    where
        F: Fn(&'a Member) -> Fut,
        Fut: std::future::Future<Output = Result<T, CallError>> + 'a,
    {
        let start = self.current.load(Ordering::Relaxed);
        let mut last = String::new();
        for i in 0..self.members.len() {
            let index = (start + i) % self.members.len();
            let member = &self.members[index];
            let answer = match tokio::time::timeout(timeout, attempt(member)).await {
                Ok(answer) => answer,
                Err(_) => Err(CallError::Lost(format!("{}: no answer within {timeout:?}", member.endpoint))),
            };
            let next = (index + 1) % self.members.len();
            match answer {
                Ok(answer) => {
                    self.current.store(index, Ordering::Relaxed);
                    return Ok(answer);
                }
                Err(CallError::NotSent(message)) => last = message,
                Err(CallError::Lost(message)) => {
                    // Sent (perhaps), then lost: the next member is tried next time.
                    self.current.store(next, Ordering::Relaxed);
                    return Err(ClientError::Indeterminate { endpoint: member.endpoint.clone(), message });
                }
                Err(CallError::Status { code, message }) => {
                    if code == UNAVAILABLE {
                        // This member has no leader or lost it: another may have one.
                        self.current.store(next, Ordering::Relaxed);
                    }
                    return Err(if matches!(code, CANCELLED | DEADLINE_EXCEEDED | UNAVAILABLE) {
                        ClientError::Indeterminate { endpoint: member.endpoint.clone(), message }
                    } else {
                        ClientError::Refused { code, message }
                    });
                }
            }
        }
        Err(ClientError::Unreachable { endpoints: self.endpoints.join(","), last })
    }

    /// A unary call of `method` with `request`.
    async fn call<M: prost::Message + Default>(
        &self,
        method: &'static str,
        request: &impl prost::Message,
    ) -> Result<M, ClientError> {
        self.each_member(REQUEST_TIMEOUT, |member| member.call(method, request)).await
    }

    /// Keys from `key` up to `range_end` (exclusive; empty: `key` alone), at most `limit`
    /// of them (0: all), at `revision` (0: the latest).
    pub async fn range(
        &self,
        key: &[u8],
        range_end: &[u8],
        limit: usize,
        revision: u64,
    ) -> Result<RangeResponse, ClientError> {
        let request = proto::RangeRequest {
            key: key.to_vec(),
            range_end: range_end.to_vec(),
            limit: signed(limit as u64),
            revision: signed(revision),
        };
        let answer: proto::RangeResponse = self.call("/etcdserverpb.KV/Range", &request).await?;
        Ok(RangeResponse {
            revision: revision_of(answer.header.as_ref()),
            kvs: answer.kvs.into_iter().map(KeyValue::from).collect(),
            more: answer.more,
        })
    }

    /// One transaction: if every comparison holds, `success`, else `failure`.
    pub async fn txn(
        &self,
        compare: &[Compare],
        success: &[Op],
        failure: &[Op],
    ) -> Result<TxnResponse, ClientError> {
        let request = proto::TxnRequest {
            compare: compare.iter().map(compare_proto).collect(),
            success: success.iter().map(op_proto).collect(),
            failure: failure.iter().map(op_proto).collect(),
        };
        let answer: proto::TxnResponse = self.call("/etcdserverpb.KV/Txn", &request).await?;
        let gets = answer
            .responses
            .into_iter()
            .filter_map(|response| response.response_range)
            .map(|range| range.kvs.into_iter().next().map(KeyValue::from))
            .collect();
        Ok(TxnResponse { revision: revision_of(answer.header.as_ref()), succeeded: answer.succeeded, gets })
    }

    /// A lease of `ttl` seconds; returns its id and the TTL etcd granted.
    pub async fn grant(&self, ttl: u64) -> Result<(i64, u64), ClientError> {
        let request = proto::LeaseGrantRequest { ttl: signed(ttl) };
        let answer: proto::LeaseGrantResponse = self.call("/etcdserverpb.Lease/LeaseGrant", &request).await?;
        if !answer.error.is_empty() {
            return Err(ClientError::Refused { code: -1, message: answer.error });
        }
        Ok((answer.id, unsigned(answer.ttl)))
    }

    /// Renews lease `id` once; returns the TTL left (0: the lease is gone).
    pub async fn keep_alive(&self, id: i64) -> Result<u64, ClientError> {
        let request = &proto::LeaseId { id };
        let answer = self
            .each_member(REQUEST_TIMEOUT, |member| async move {
                let (_requests, mut answers) =
                    member.stream("/etcdserverpb.Lease/LeaseKeepAlive", request).await?;
                let message = first(&member.endpoint, &mut answers).await?;
                proto::LeaseKeepAliveResponse::decode_from(message)
            })
            .await?;
        Ok(unsigned(answer.ttl))
    }

    /// Ends lease `id` and deletes its keys.
    pub async fn revoke(&self, id: i64) -> Result<(), ClientError> {
        let _: proto::Answered = self.call("/etcdserverpb.Lease/LeaseRevoke", &proto::LeaseId { id }).await?;
        Ok(())
    }

    /// Drops history up to `revision`.
    pub async fn compact(&self, revision: u64) -> Result<(), ClientError> {
        let request = proto::CompactionRequest { revision: signed(revision) };
        let _: proto::Answered = self.call("/etcdserverpb.KV/Compact", &request).await?;
        Ok(())
    }

    /// Opens a watch of the keys from `key` up to `range_end`, from `start_revision`,
    /// with the values deletes removed. The stream ends when the connection does.
    pub async fn watch(
        &self,
        key: &[u8],
        range_end: &[u8],
        start_revision: u64,
    ) -> Result<WatchStream, ClientError> {
        let request = proto::WatchRequest {
            create_request: Some(proto::WatchCreateRequest {
                key: key.to_vec(),
                range_end: range_end.to_vec(),
                start_revision: signed(start_revision),
                progress_notify: true,
                prev_kv: true,
            }),
        };
        let request = &request;
        self.each_member(REQUEST_TIMEOUT, |member| async move {
            let (requests, answers) = member.stream("/etcdserverpb.Watch/Watch", request).await?;
            Ok(WatchStream { endpoint: member.endpoint.clone(), _requests: requests, answers })
        })
        .await
    }
}

/// The messages of one watch, as etcd streams them.
pub struct WatchStream {
    endpoint: String,
    /// The request side of the stream, kept open while the watch lives.
    _requests: mpsc::Sender<Bytes>,
    answers: Answers,
}

impl WatchStream {
    /// The member this watch is open on.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// The next message; `None` when the stream ended.
    pub async fn next(&mut self) -> Option<Result<WatchResponse, ClientError>> {
        let endpoint = &self.endpoint;
        Some(match self.answers.next().await? {
            Ok(message) => decode_watch(message),
            Err(CallError::Status { code, message }) => Err(ClientError::Refused { code, message }),
            Err(CallError::NotSent(message) | CallError::Lost(message)) => {
                Err(ClientError::Indeterminate { endpoint: endpoint.clone(), message })
            }
        })
    }
}

/// The first answer of a stream.
async fn first(endpoint: &str, answers: &mut Answers) -> Result<Bytes, CallError> {
    answers
        .next()
        .await
        .unwrap_or_else(|| Err(CallError::Lost(format!("{endpoint}: the stream ended without an answer"))))
}

trait DecodeFrom: prost::Message + Default {
    /// Decodes an answer of etcd's.
    fn decode_from(message: Bytes) -> Result<Self, CallError> {
        Self::decode(message)
            .map_err(|e| CallError::Status { code: -1, message: format!("unreadable answer from etcd: {e}") })
    }
}

impl<M: prost::Message + Default> DecodeFrom for M {}

fn decode_watch(message: Bytes) -> Result<WatchResponse, ClientError> {
    let answer = proto::WatchResponse::decode_from(message).map_err(|_| ClientError::Refused {
        code: -1,
        message: "unreadable watch message from etcd".into(),
    })?;
    let events = answer
        .events
        .into_iter()
        .map(|event| WatchEvent {
            deleted: event.type_ == proto::EVENT_DELETE,
            kv: event.kv.map(KeyValue::from).unwrap_or_default(),
            prev: event.prev_kv.map(KeyValue::from),
        })
        .collect();
    Ok(WatchResponse {
        revision: revision_of(answer.header.as_ref()),
        created: answer.created,
        canceled: answer.canceled,
        compact_revision: unsigned(answer.compact_revision),
        cancel_reason: answer.cancel_reason,
        events,
    })
}

impl From<proto::KeyValue> for KeyValue {
    fn from(kv: proto::KeyValue) -> KeyValue {
        KeyValue {
            key: kv.key,
            value: kv.value,
            create_revision: unsigned(kv.create_revision),
            mod_revision: unsigned(kv.mod_revision),
            lease: kv.lease,
        }
    }
}

fn compare_proto(compare: &Compare) -> proto::Compare {
    let (target, key, to) = match compare {
        Compare::ModRevision(key, revision) => {
            (proto::TARGET_MOD, key, proto::CompareTo::ModRevision(signed(*revision)))
        }
        Compare::CreateRevision(key, revision) => {
            (proto::TARGET_CREATE, key, proto::CompareTo::CreateRevision(signed(*revision)))
        }
    };
    proto::Compare { result: 0, target, key: key.clone(), target_union: Some(to) }
}

fn op_proto(op: &Op) -> proto::RequestOp {
    let request = match op {
        Op::Put { key, value, lease } => {
            proto::Request::Put(proto::PutRequest { key: key.clone(), value: value.clone(), lease: *lease })
        }
        Op::Delete { key } => {
            proto::Request::DeleteRange(proto::DeleteRangeRequest { key: key.clone(), range_end: Vec::new() })
        }
        Op::DeleteRange { from, to } => proto::Request::DeleteRange(proto::DeleteRangeRequest {
            key: from.clone(),
            range_end: to.clone(),
        }),
        Op::Get { key } => {
            proto::Request::Range(proto::RangeRequest { key: key.clone(), ..Default::default() })
        }
    };
    proto::RequestOp { request: Some(request) }
}

/// etcd's revisions are `int64` on the wire and never negative.
fn unsigned(n: i64) -> u64 {
    u64::try_from(n).unwrap_or(0)
}

fn signed(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

fn revision_of(header: Option<&proto::ResponseHeader>) -> u64 {
    header.map_or(0, |h| unsigned(h.revision))
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;

    use http_body_util::{BodyExt as _, Full, StreamBody};
    use hyper::body::Frame;
    use hyper_util::rt::{TokioExecutor, TokioIo};
    use prost::Message as _;

    use super::*;

    /// How a fake member answers every call.
    #[derive(Clone, Copy)]
    enum Answer {
        /// A transaction that succeeded at revision 42, then status OK.
        Succeeded,
        /// Only a status (not 0) and its message.
        Fails(u16, &'static str),
        /// The transaction's answer, then a status that is not OK.
        AnswersThenFails(u16, &'static str),
    }

    /// A member that answers every call as `how` says.
    async fn fake_member(how: Answer) -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let answer = move |_request| async move {
            let response = http::Response::builder().header("content-type", "application/grpc");
            let (status, message) = match how {
                Answer::Fails(status, message) => {
                    let response = response.header("grpc-status", status).header("grpc-message", message);
                    return Ok::<_, Infallible>(response.body(Full::new(Bytes::new()).boxed()).unwrap());
                }
                Answer::Succeeded => (0, ""),
                Answer::AnswersThenFails(status, message) => (status, message),
            };
            let answer = proto::TxnResponse {
                header: Some(proto::ResponseHeader { revision: 42 }),
                succeeded: true,
                responses: Vec::new(),
            };
            let mut trailers = http::HeaderMap::new();
            trailers.insert("grpc-status", status.into());
            trailers.insert("grpc-message", http::HeaderValue::from_static(message));
            let frames = [Ok(Frame::data(super::super::grpc::frame(&answer))), Ok(Frame::trailers(trailers))];
            Ok(response.body(StreamBody::new(futures_util::stream::iter(frames)).boxed()).unwrap())
        };
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let connection = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(tcp), hyper::service::service_fn(answer));
                tokio::spawn(connection);
            }
        });
        format!("127.0.0.1:{port}")
    }

    #[tokio::test]
    async fn a_member_out_of_reach_is_skipped_and_one_that_lost_its_leader_is_an_unknown_outcome() {
        let closed = {
            let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            format!("127.0.0.1:{}", listener.local_addr().unwrap().port())
        };
        let leaderless = fake_member(Answer::Fails(14, "etcdserver: leader changed")).await;
        let healthy = fake_member(Answer::Succeeded).await;
        let etcd = Client::new(&[closed.clone(), leaderless, healthy]).unwrap();
        let put = [Op::Put { key: b"/k".to_vec(), value: b"v".to_vec(), lease: 0 }];
        // Nothing is sent to the closed port; the member without a leader may have
        // applied the write: unknown, not refused.
        match etcd.txn(&[], &put, &[]).await {
            Err(ClientError::Indeterminate { message, .. }) => {
                assert!(message.contains("leader changed"), "{message}")
            }
            other => panic!("{other:?}"),
        }
        // The next call goes to the member after it.
        let answer = etcd.txn(&[], &put, &[]).await.unwrap();
        assert!(answer.succeeded);
        assert_eq!(answer.revision, 42);
        // A refusal is one, with etcd's message and code.
        let refusing = fake_member(Answer::Fails(3, "etcdserver: too many operations in txn request")).await;
        let etcd = Client::new(&[refusing]).unwrap();
        let refused = etcd.txn(&[], &put, &[]).await.unwrap_err();
        assert!(
            matches!(refused, ClientError::Refused { code: 3, .. }) && refused.is_too_large(),
            "{refused:?}"
        );
        // A status that is not OK after an answer is the call's outcome.
        let failing_late = fake_member(Answer::AnswersThenFails(9, "etcdserver: failed late")).await;
        let late = Client::new(&[failing_late]).unwrap().txn(&[], &put, &[]).await.unwrap_err();
        assert!(
            matches!(&late, ClientError::Refused { code: 9, message } if message.contains("failed late")),
            "{late:?}"
        );
        // No member at all: unreachable, naming them.
        let unreachable = Client::new(&[closed]).unwrap().txn(&[], &put, &[]).await.unwrap_err();
        assert!(matches!(unreachable, ClientError::Unreachable { .. }), "{unreachable:?}");
    }

    fn kv(key: &[u8], create_revision: i64, mod_revision: i64) -> proto::KeyValue {
        proto::KeyValue { key: key.to_vec(), create_revision, mod_revision, value: b"{}".to_vec(), lease: 0 }
    }

    #[test]
    fn a_watch_message_decodes_puts_and_deletes_with_their_revisions() {
        let message = proto::WatchResponse {
            header: Some(proto::ResponseHeader { revision: 9 }),
            events: vec![
                proto::Event { type_: 0, kv: Some(kv(b"/hive/a", 2, 9)), prev_kv: None },
                proto::Event {
                    type_: proto::EVENT_DELETE,
                    kv: Some(kv(b"/hive/b", 0, 9)),
                    prev_kv: Some(kv(b"/hive/b", 3, 4)),
                },
            ],
            ..Default::default()
        };
        let message = decode_watch(message.encode_to_vec().into()).unwrap();
        assert_eq!(message.revision, 9);
        assert_eq!(message.events.len(), 2);
        assert!(!message.events[0].deleted);
        assert_eq!(message.events[0].kv.key, b"/hive/a");
        assert_eq!((message.events[0].kv.create_revision, message.events[0].kv.mod_revision), (2, 9));
        assert!(message.events[1].deleted);
        assert_eq!(message.events[1].prev.as_ref().unwrap().mod_revision, 4);
    }

    #[test]
    fn a_compacted_watch_and_a_refusal_are_told_apart() {
        let message = proto::WatchResponse {
            header: Some(proto::ResponseHeader { revision: 20 }),
            canceled: true,
            compact_revision: 12,
            cancel_reason: "etcdserver: mvcc: required revision has been compacted".into(),
            ..Default::default()
        };
        let message = decode_watch(message.encode_to_vec().into()).unwrap();
        assert!(message.canceled);
        assert_eq!(message.compact_revision, 12);
        let too_large = ClientError::Refused {
            code: 3,
            message: "etcdserver: too many operations in txn request".into(),
        };
        assert!(too_large.is_too_large() && !too_large.is_compacted());
        assert!(decode_watch(Bytes::from_static(b"\xff\xff")).is_err());
    }
}
