//! Ending one response's stream from outside hyper, for a watch whose client reads
//! nothing: hyper polls no body whose writes are blocked (a full socket, or an HTTP/2
//! stream out of flow-control window), so an error from the body alone would never be
//! seen. On HTTP/2 each stream runs in its own task (`http2.rs`), which this ends — h2
//! then resets the stream (`RST_STREAM`) and frees what it buffered, and the
//! connection's other streams go on. On HTTP/1.1 a response ends early only with its
//! connection, so this closes the connection.

use std::sync::Arc;

use tokio::sync::Notify;

tokio::task_local! {
    /// The stream of the request being handled: set around each HTTP/2 stream's task and
    /// each HTTP/1.1 request's handling.
    static CURRENT: EndStream;
}

/// A way to end one response's stream (see the module's note).
#[derive(Clone, Default)]
pub struct EndStream {
    requested: Arc<Notify>,
}

impl EndStream {
    /// The stream of the request being handled now; `None` outside a connection of ours
    /// (a test calling the router directly).
    pub fn current() -> Option<EndStream> {
        CURRENT.try_with(EndStream::clone).ok()
    }

    /// Ends the stream (at once, or as soon as its task or connection next runs).
    pub fn end(&self) {
        // `notify_one` keeps the wake-up when nothing waits yet.
        self.requested.notify_one();
    }

    /// Resolves once [`EndStream::end`] was called.
    pub(in crate::server) async fn requested(&self) {
        self.requested.notified().await;
    }

    /// Runs `future` with this as the [`EndStream::current`] stream.
    pub(in crate::server) fn scope<F: std::future::Future>(
        self,
        future: F,
    ) -> impl std::future::Future<Output = F::Output> {
        CURRENT.scope(self, future)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_current_stream_is_the_one_in_scope_and_ending_it_wakes_its_owner() {
        assert!(EndStream::current().is_none(), "none outside a connection");
        let end = EndStream::default();
        let taken = end.clone().scope(async { EndStream::current() }).await.expect("in scope");
        taken.end();
        tokio::time::timeout(std::time::Duration::from_secs(5), end.requested())
            .await
            .expect("ending before anyone waits is kept");
    }
}
