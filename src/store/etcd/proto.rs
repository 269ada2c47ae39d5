//! The messages of etcd's v3 gRPC API that hive sends and reads, as protobuf structs.
//!
//! Written by hand from the field numbers of etcd's `etcdserverpb/rpc.proto` and
//! `mvccpb/kv.proto` (stable since etcd 3.0; `cancel_reason` since 3.4), with prost's
//! derive: no `.proto` compiler at build time. Only the fields hive uses are declared; a
//! field etcd adds is skipped when decoding, as protobuf does with any unknown field.

/// `etcdserverpb.ResponseHeader`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ResponseHeader {
    #[prost(int64, tag = "3")]
    pub revision: i64,
}

/// An answer of which only the header is read: `LeaseRevokeResponse`,
/// `CompactionResponse`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Answered {
    #[prost(message, optional, tag = "1")]
    pub header: Option<ResponseHeader>,
}

/// `mvccpb.KeyValue`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct KeyValue {
    #[prost(bytes = "vec", tag = "1")]
    pub key: Vec<u8>,
    #[prost(int64, tag = "2")]
    pub create_revision: i64,
    #[prost(int64, tag = "3")]
    pub mod_revision: i64,
    #[prost(bytes = "vec", tag = "5")]
    pub value: Vec<u8>,
    #[prost(int64, tag = "6")]
    pub lease: i64,
}

/// `etcdserverpb.RangeRequest`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct RangeRequest {
    #[prost(bytes = "vec", tag = "1")]
    pub key: Vec<u8>,
    #[prost(bytes = "vec", tag = "2")]
    pub range_end: Vec<u8>,
    #[prost(int64, tag = "3")]
    pub limit: i64,
    #[prost(int64, tag = "4")]
    pub revision: i64,
}

/// `etcdserverpb.RangeResponse`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct RangeResponse {
    #[prost(message, optional, tag = "1")]
    pub header: Option<ResponseHeader>,
    #[prost(message, repeated, tag = "2")]
    pub kvs: Vec<KeyValue>,
    #[prost(bool, tag = "3")]
    pub more: bool,
}

/// `etcdserverpb.PutRequest`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct PutRequest {
    #[prost(bytes = "vec", tag = "1")]
    pub key: Vec<u8>,
    #[prost(bytes = "vec", tag = "2")]
    pub value: Vec<u8>,
    #[prost(int64, tag = "3")]
    pub lease: i64,
}

/// `etcdserverpb.DeleteRangeRequest`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct DeleteRangeRequest {
    #[prost(bytes = "vec", tag = "1")]
    pub key: Vec<u8>,
    /// Empty: `key` alone; else every key from `key` up to this one, not included.
    #[prost(bytes = "vec", tag = "2")]
    pub range_end: Vec<u8>,
}

/// `etcdserverpb.RequestOp`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct RequestOp {
    #[prost(oneof = "Request", tags = "1, 2, 3")]
    pub request: Option<Request>,
}

/// `etcdserverpb.RequestOp.request`.
#[derive(Clone, PartialEq, prost::Oneof)]
pub enum Request {
    #[prost(message, tag = "1")]
    Range(RangeRequest),
    #[prost(message, tag = "2")]
    Put(PutRequest),
    #[prost(message, tag = "3")]
    DeleteRange(DeleteRangeRequest),
}

/// `etcdserverpb.ResponseOp`: only a range's answer is read (a transaction's gets).
#[derive(Clone, PartialEq, prost::Message)]
pub struct ResponseOp {
    #[prost(message, optional, tag = "1")]
    pub response_range: Option<RangeResponse>,
}

/// `etcdserverpb.Compare.CompareTarget`.
pub const TARGET_CREATE: i32 = 1;
/// `etcdserverpb.Compare.CompareTarget`.
pub const TARGET_MOD: i32 = 2;

/// `etcdserverpb.Compare`, result `EQUAL` (0, the default).
#[derive(Clone, PartialEq, prost::Message)]
pub struct Compare {
    #[prost(int32, tag = "1")]
    pub result: i32,
    #[prost(int32, tag = "2")]
    pub target: i32,
    #[prost(bytes = "vec", tag = "3")]
    pub key: Vec<u8>,
    #[prost(oneof = "CompareTo", tags = "5, 6")]
    pub target_union: Option<CompareTo>,
}

/// `etcdserverpb.Compare.target_union`.
#[derive(Clone, PartialEq, prost::Oneof)]
pub enum CompareTo {
    #[prost(int64, tag = "5")]
    CreateRevision(i64),
    #[prost(int64, tag = "6")]
    ModRevision(i64),
}

/// `etcdserverpb.TxnRequest`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct TxnRequest {
    #[prost(message, repeated, tag = "1")]
    pub compare: Vec<Compare>,
    #[prost(message, repeated, tag = "2")]
    pub success: Vec<RequestOp>,
    #[prost(message, repeated, tag = "3")]
    pub failure: Vec<RequestOp>,
}

/// `etcdserverpb.TxnResponse`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct TxnResponse {
    #[prost(message, optional, tag = "1")]
    pub header: Option<ResponseHeader>,
    #[prost(bool, tag = "2")]
    pub succeeded: bool,
    #[prost(message, repeated, tag = "3")]
    pub responses: Vec<ResponseOp>,
}

/// `etcdserverpb.CompactionRequest`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct CompactionRequest {
    #[prost(int64, tag = "1")]
    pub revision: i64,
}

/// `etcdserverpb.LeaseGrantRequest`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct LeaseGrantRequest {
    #[prost(int64, tag = "1")]
    pub ttl: i64,
}

/// `etcdserverpb.LeaseGrantResponse`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct LeaseGrantResponse {
    #[prost(int64, tag = "2")]
    pub id: i64,
    #[prost(int64, tag = "3")]
    pub ttl: i64,
    #[prost(string, tag = "4")]
    pub error: String,
}

/// `etcdserverpb.LeaseRevokeRequest` and `etcdserverpb.LeaseKeepAliveRequest`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct LeaseId {
    #[prost(int64, tag = "1")]
    pub id: i64,
}

/// `etcdserverpb.LeaseKeepAliveResponse`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct LeaseKeepAliveResponse {
    #[prost(int64, tag = "3")]
    pub ttl: i64,
}

/// `etcdserverpb.WatchRequest` with its `create_request`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct WatchRequest {
    #[prost(message, optional, tag = "1")]
    pub create_request: Option<WatchCreateRequest>,
}

/// `etcdserverpb.WatchCreateRequest`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct WatchCreateRequest {
    #[prost(bytes = "vec", tag = "1")]
    pub key: Vec<u8>,
    #[prost(bytes = "vec", tag = "2")]
    pub range_end: Vec<u8>,
    #[prost(int64, tag = "3")]
    pub start_revision: i64,
    #[prost(bool, tag = "4")]
    pub progress_notify: bool,
    #[prost(bool, tag = "6")]
    pub prev_kv: bool,
}

/// `etcdserverpb.WatchResponse`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct WatchResponse {
    #[prost(message, optional, tag = "1")]
    pub header: Option<ResponseHeader>,
    #[prost(bool, tag = "3")]
    pub created: bool,
    #[prost(bool, tag = "4")]
    pub canceled: bool,
    #[prost(int64, tag = "5")]
    pub compact_revision: i64,
    #[prost(string, tag = "6")]
    pub cancel_reason: String,
    #[prost(message, repeated, tag = "11")]
    pub events: Vec<Event>,
}

/// `mvccpb.Event.EventType`.
pub const EVENT_DELETE: i32 = 1;

/// `mvccpb.Event`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Event {
    #[prost(int32, tag = "1")]
    pub type_: i32,
    #[prost(message, optional, tag = "2")]
    pub kv: Option<KeyValue>,
    #[prost(message, optional, tag = "3")]
    pub prev_kv: Option<KeyValue>,
}
