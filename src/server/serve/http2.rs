//! HTTP/2 (ALPN `h2`): hyper's server, with limits so that one client cannot cost
//! unbounded memory however many streams it opens, and each stream in a task of its
//! own that [`EndStream`] can end.
//!
//! What one connection may hold: at most [`MAX_CONCURRENT_STREAMS`] streams (more are
//! refused by h2 with `REFUSED_STREAM`, as Go's server does past its default of 250);
//! request heads of at most [`MAX_HEADER_LIST_BYTES`] each; at most
//! [`CONNECTION_WINDOW`] of request bodies sent ahead of the handlers reading them (the
//! flow-control windows we grant). What a stream holds on the way out is what an
//! HTTP/1.1 connection holds: at most [`MAX_SEND_BUFFER`] queued in h2 plus the chunk
//! hyper has taken from the body — so one watch costs the same over either protocol,
//! and the connection cap together with the stream cap bounds them all.

use std::future::Future;

use hyper::server::conn::http2::Builder;

use super::end_stream::EndStream;

/// Streams one connection may have open at once (Go's `http2` server default).
pub(super) const MAX_CONCURRENT_STREAMS: u32 = 250;

/// The largest request head, as HPACK counts it (each field's name and value plus 32
/// bytes). A bearer token or a session cookie is a few hundred bytes, a kubectl
/// request's head under 1 KiB.
pub(super) const MAX_HEADER_LIST_BYTES: u32 = 16 * 1024;

/// The flow-control window granted to each stream's request body, and to all of them
/// together on one connection: what a client may send before a handler reads it.
pub(super) const STREAM_WINDOW: u32 = 1024 * 1024;
pub(super) const CONNECTION_WINDOW: u32 = 1024 * 1024;

/// Response bytes h2 queues per stream beyond what the socket took (hyper's default,
/// about what hyper's HTTP/1.1 write buffer holds).
pub(super) const MAX_SEND_BUFFER: usize = 400 * 1024;

/// hyper's HTTP/2 server with the limits above.
pub(super) fn builder() -> Builder<StreamTasks> {
    let mut builder = Builder::new(StreamTasks);
    builder
        .max_concurrent_streams(MAX_CONCURRENT_STREAMS)
        .max_header_list_size(MAX_HEADER_LIST_BYTES)
        .initial_stream_window_size(STREAM_WINDOW)
        .initial_connection_window_size(CONNECTION_WINDOW)
        .max_send_buf_size(MAX_SEND_BUFFER);
    builder
}

/// Runs each HTTP/2 stream (hyper hands us its future: the handler, then the body
/// written out) in its own task, with an [`EndStream`] in scope that drops the future
/// when asked: h2 then resets the stream and frees what it had queued.
#[derive(Clone, Copy, Debug)]
pub(super) struct StreamTasks;

impl<F> hyper::rt::Executor<F> for StreamTasks
where
    F: Future<Output = ()> + Send + 'static,
{
    fn execute(&self, stream: F) {
        let end = EndStream::default();
        let ended = end.clone();
        tokio::spawn(end.scope(async move {
            tokio::select! {
                () = stream => {}
                () = ended.requested() => {}
            }
        }));
    }
}
