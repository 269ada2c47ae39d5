//! The watch body's joining of lines into chunks.

use bytes::Bytes;

use super::{Chunk, INITIAL_RUN, JOIN_BYTES, READY_RUN};

/// A line of `len` bytes (newline included) made of `fill`.
fn line(fill: u8, len: usize) -> Bytes {
    let mut bytes = vec![fill; len - 1];
    bytes.push(b'\n');
    Bytes::from(bytes)
}

/// The chunks `lines` make when added one after the other, as the body adds them: a
/// line the chunk gives back starts the next one.
fn chunks(lines: &[Bytes]) -> Vec<Bytes> {
    let mut chunk = Chunk::default();
    let mut out = Vec::new();
    for line in lines {
        if let Err(line) = chunk.push(line.clone()) {
            out.push(chunk.take());
            chunk.push(line).expect("an empty chunk takes any line");
        }
        if chunk.is_full() {
            out.push(chunk.take());
        }
    }
    if !chunk.is_empty() {
        out.push(chunk.take());
    }
    out
}

#[test]
fn each_poll_joins_the_queued_lines_up_to_the_bound() {
    let small = |fill| line(fill, 300);
    let half = |fill| line(fill, JOIN_BYTES / 2);
    // (name, lines queued, the lengths of the chunks the polls yield)
    let cases: Vec<(&str, Vec<Bytes>, Vec<usize>)> = vec![
        ("one line goes as it is", vec![small(b'a')], vec![300]),
        ("every queued line in one chunk", (0..16).map(|i| small(b'a' + i)).collect(), vec![16 * 300]),
        ("two halves fill one chunk exactly", vec![half(b'a'), half(b'b')], vec![JOIN_BYTES]),
        (
            "a line that would pass the bound starts the next chunk",
            vec![half(b'a'), small(b'b'), half(b'c'), small(b'd')],
            vec![JOIN_BYTES / 2 + 300, JOIN_BYTES / 2 + 300],
        ),
        (
            "a line larger than the bound goes alone, with what comes before and after in their own chunks",
            vec![small(b'a'), line(b'b', 3 * JOIN_BYTES), small(b'c'), small(b'd')],
            vec![300, 3 * JOIN_BYTES, 600],
        ),
    ];
    for (name, queued, expected) in cases {
        let chunks = chunks(&queued);
        let lengths: Vec<usize> = chunks.iter().map(Bytes::len).collect();
        assert_eq!(lengths, expected, "{name}");
        assert_eq!(chunks.concat(), queued.concat(), "{name}: the same bytes in the same order");
    }
}

#[test]
fn a_line_at_least_the_bound_is_not_copied() {
    let big = line(b'x', JOIN_BYTES);
    let mut chunk = Chunk::default();
    chunk.push(big.clone()).expect("room");
    assert!(chunk.is_full());
    assert_eq!(chunk.take().as_ptr(), big.as_ptr(), "the line's own bytes, not a copy");
    assert!(chunk.is_empty());
}

/// A label-selected watch over the router, from the store's revision when `from_now`
/// (else from its current state, as synthetic `ADDED`s), and the store to write to;
/// `before` is committed first.
async fn selected_watch(
    selector: &str,
    from_now: bool,
    before: Vec<crate::store::Mutation>,
) -> (axum::body::Body, crate::store::Store, tempfile::TempDir) {
    use axum::http::{Request, StatusCode};
    use tower::ServiceExt as _;

    use crate::auth::{Role, TokenStore};
    use crate::server::{app, AppState, ServerConfig};
    use crate::store::{Store, StoreConfig};

    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(StoreConfig::new(dir.path().join("hive.redb"))).unwrap();
    let tokens = TokenStore::open(dir.path()).unwrap();
    let viewer = tokens.create("viewer", Role::Viewer).unwrap();
    if !before.is_empty() {
        store.commit_all(before, false).await.unwrap();
    }
    let app = app(AppState::new(store.clone(), tokens, ServerConfig::default()));
    let from = if from_now { format!("&resourceVersion={}", store.revision()) } else { String::new() };
    let path = format!("/apis/hive.dev/v1/agents?watch=1{from}&labelSelector={selector}");
    let request = Request::get(path)
        .header("authorization", format!("Bearer {viewer}"))
        .body(axum::body::Body::empty())
        .unwrap();
    let response = app.oneshot(request).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    (response.into_body(), store, dir)
}

fn agent(name: &str, labels: serde_json::Value) -> serde_json::Value {
    serde_json::json!({"apiVersion": "hive.dev/v1", "kind": "Agent",
        "metadata": {"name": name, "labels": labels}, "spec": {"wanted": "Running"}})
}

/// More events ready than one poll takes, none of which the watcher sees, then one it
/// does: the body, which stops after a bounded run of them, must come back for the rest
/// by itself — no later write will wake it.
#[tokio::test]
async fn a_long_run_of_events_a_selector_skips_does_not_stall_the_watch() {
    use http_body_util::BodyExt as _;

    use crate::store::Mutation;

    let (mut body, store, _dir) = selected_watch("pick%3Dyes", true, Vec::new()).await;
    let skipped = (0..READY_RUN + 50).map(|i| Mutation::Create {
        kind: "agents",
        object: agent(&format!("skip-{i}"), serde_json::json!({"pick": "no"})),
    });
    store.commit_all(skipped.collect(), false).await.unwrap();
    let picked =
        Mutation::Create { kind: "agents", object: agent("picked", serde_json::json!({"pick": "yes"})) };
    store.commit_all(vec![picked], false).await.unwrap();

    // Unconstrained: tokio's cooperative budget would otherwise make the store's channel
    // say Pending (and wake the task) after 128 events, hiding a body that relies on it.
    // The stall is looked at first (`biased`): a timeout around the read would poll the
    // body once more when it fires, and that poll would find the events.
    let frame = tokio::select! {
        biased;
        () = tokio::time::sleep(std::time::Duration::from_secs(10)) => panic!("the watch stalled with events ready"),
        frame = tokio::task::unconstrained(body.frame()) => frame.expect("a frame").expect("no error"),
    };
    let line = String::from_utf8(frame.into_data().expect("data").to_vec()).unwrap();
    assert!(line.starts_with(r#"{"type":"ADDED""#) && line.contains(r#""name":"picked""#), "{line}");
    assert_eq!(line.lines().count(), 1, "{line}");
}

/// The same for the initial state: more objects than one poll looks at, the selector
/// skipping all but the last.
#[tokio::test]
async fn a_long_run_of_initial_objects_a_selector_skips_does_not_stall_the_watch() {
    use http_body_util::BodyExt as _;

    use crate::store::Mutation;

    let mut before: Vec<Mutation> = (0..INITIAL_RUN + 50)
        .map(|i| Mutation::Create {
            kind: "agents",
            object: agent(&format!("skip-{i:05}"), serde_json::json!({"pick": "no"})),
        })
        .collect();
    before.push(Mutation::Create {
        kind: "agents",
        object: agent("zz-picked", serde_json::json!({"pick": "yes"})),
    });
    let (mut body, _store, _dir) = selected_watch("pick%3Dyes", false, before).await;

    let frame = tokio::select! {
        biased;
        () = tokio::time::sleep(std::time::Duration::from_secs(10)) => panic!("the watch stalled in its initial objects"),
        frame = body.frame() => frame.expect("a frame").expect("no error"),
    };
    let line = String::from_utf8(frame.into_data().expect("data").to_vec()).unwrap();
    assert!(line.starts_with(r#"{"type":"ADDED""#) && line.contains(r#""name":"zz-picked""#), "{line}");
    assert_eq!(line.lines().count(), 1, "{line}");
}
