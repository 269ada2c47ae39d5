//! Selected lists and watches through the API: the right objects, page by page, found
//! without parsing any object's JSON (issue 28, item 6: a `limit=1` page with a label
//! selector over 20,000 Agents parsed every Agent after the token).

use std::time::Duration;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use axum::Router;
use futures_util::StreamExt as _;
use serde_json::{json, Value};
use tower::ServiceExt as _;

use crate::auth::{Role, TokenStore};
use crate::server::{app, AppState, ServerConfig};
use crate::store::{Mutation, Obj, Store, StoreConfig, Subresource};

const AGENTS: &str = "/apis/hive.dev/v1/agents";

/// How many Agents the fixture stores.
const COUNT: usize = 120;

/// The app over a store of [`COUNT`] Agents labelled by [`labels`], and a viewer's token.
struct Fixture {
    app: Router,
    store: Store,
    viewer: String,
    _dir: tempfile::TempDir,
}

fn name(i: usize) -> String {
    format!("a-{i:03}")
}

/// Agent `i`'s labels: four shapes in turn, one of them none at all.
fn labels(i: usize) -> Value {
    match i % 4 {
        0 => json!({"tier": "gold", "env": "prod"}),
        1 => json!({"tier": "silver"}),
        2 => json!({}),
        _ => json!({"tier": "bronze", "legacy": "true", "env": "dev"}),
    }
}

fn agent(i: usize, labels: Value) -> Value {
    json!({"apiVersion": "hive.dev/v1", "kind": "Agent", "metadata": {"name": name(i), "labels": labels},
           "spec": {"wanted": "Running"}})
}

impl Fixture {
    async fn new() -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(StoreConfig::new(dir.path().join("hive.redb"))).unwrap();
        let tokens = TokenStore::open(dir.path()).unwrap();
        let viewer = tokens.create("viewer", Role::Viewer).unwrap();
        let creates = (0..COUNT).map(|i| Mutation::Create { kind: "agents", object: agent(i, labels(i)) });
        store.commit_all(creates.collect(), false).await.unwrap();
        let app = app(AppState::new(store.clone(), tokens, ServerConfig::default()));
        Fixture { app, store, viewer, _dir: dir }
    }

    async fn get(&self, path: &str) -> Value {
        let request = Request::get(path)
            .header("authorization", format!("Bearer {}", self.viewer))
            .body(Body::empty())
            .unwrap();
        let response = self.app.clone().oneshot(request).await.unwrap();
        assert_eq!(response.status(), StatusCode::OK, "{path}");
        let body = axum::body::to_bytes(response.into_body(), 1 << 24).await.unwrap();
        serde_json::from_slice(&body).unwrap()
    }

    /// Every page of `query` with `limit`, and the names they hold, in order.
    async fn pages(&self, query: &str, limit: usize) -> (Vec<Value>, Vec<String>) {
        let (mut pages, mut names) = (Vec::new(), Vec::new());
        let mut token = String::new();
        loop {
            let page = self.get(&format!("{AGENTS}?{query}&limit={limit}&continue={token}")).await;
            let items = page["items"].as_array().unwrap();
            names.extend(items.iter().map(|item| hive_api::meta::name_of(item).to_string()));
            let next = page["metadata"]["continue"].as_str().map(str::to_string);
            pages.push(page);
            match next {
                Some(next) => token = next,
                None => return (pages, names),
            }
        }
    }
}

/// Whether a selector selects Agent `i`.
type Selects = fn(usize) -> bool;

/// The names of the Agents `i` for which `selected(i)` holds.
fn expected(selected: Selects) -> Vec<String> {
    (0..COUNT).filter(|&i| selected(i)).map(name).collect()
}

#[tokio::test]
async fn a_selected_page_parses_no_object() {
    let fixture = Fixture::new().await;
    // (selector query, which Agents it selects)
    let cases: Vec<(&str, Selects)> = vec![
        ("labelSelector=tier%3Dgold", |i| i % 4 == 0),
        ("labelSelector=tier%3D%3Dsilver", |i| i % 4 == 1),
        ("labelSelector=tier%21%3Dgold", |i| i % 4 != 0),
        ("labelSelector=tier%20in%20(gold,bronze)", |i| i % 4 == 0 || i % 4 == 3),
        ("labelSelector=tier%20notin%20(gold,bronze)", |i| i % 4 == 1 || i % 4 == 2),
        ("labelSelector=legacy", |i| i % 4 == 3),
        ("labelSelector=%21tier", |i| i % 4 == 2),
        ("labelSelector=env,%21legacy", |i| i % 4 == 0),
        ("labelSelector=nothing%3Dhere", |_| false),
        ("fieldSelector=metadata.name%3Da-042", |i| i == 42),
        ("fieldSelector=metadata.name%21%3Da-000,metadata.namespace%3D", |i| i != 0),
        ("fieldSelector=metadata.namespace%3Delsewhere", |_| false),
        ("labelSelector=tier%3Dgold&fieldSelector=metadata.name%21%3Da-004", |i| i % 4 == 0 && i != 4),
    ];
    for (query, selected) in cases {
        let want = expected(selected);
        for limit in [1, 7, 1000] {
            let before = Obj::parsed_on_this_thread();
            let (pages, names) = fixture.pages(query, limit).await;
            let parsed = Obj::parsed_on_this_thread() - before;
            assert_eq!(names, want, "{query}, limit {limit}");
            assert_eq!(parsed, 0, "{query}, limit {limit}: objects parsed to select {} pages", pages.len());
        }
    }
}

/// A page with a selector looks at objects only until it is full and one more matched,
/// so paging through a list looks at each object about once, however small the pages:
/// it used to look at every object after the token for each page.
#[tokio::test]
async fn paging_a_selected_list_looks_at_each_object_about_once() {
    let fixture = Fixture::new().await;
    for (query, every) in
        [("labelSelector=tier%3Dgold", 4), ("labelSelector=legacy%2Ctier", 4), ("labelSelector=tier", 4)]
    {
        let before = Obj::labels_read_on_this_thread();
        let (pages, names) = fixture.pages(query, 1).await;
        let looked = Obj::labels_read_on_this_thread() - before;
        assert_eq!(pages.len(), names.len(), "{query}: one item a page");
        // Each page looks from its token to the match after its own: at most the gap
        // between two matches more than the objects in between.
        assert!(
            looked <= COUNT + every * pages.len(),
            "{query}: {looked} objects looked at for {} pages",
            pages.len()
        );
        for page in &pages {
            assert!(
                page["metadata"].get("remainingItemCount").is_none(),
                "{query}: unknown under a selector, as kube-apiserver answers: {}",
                page["metadata"]
            );
        }
    }
    let unselected = fixture.get(&format!("{AGENTS}?limit=100")).await;
    assert_eq!(unselected["metadata"]["remainingItemCount"], COUNT - 100, "counted without a selector");
}

/// Reads the next watch line from `body`, at most 5 s.
async fn next_line(body: &mut axum::body::BodyDataStream, buffered: &mut Vec<u8>) -> Value {
    loop {
        if let Some(end) = buffered.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = buffered.drain(..=end).collect();
            return serde_json::from_slice(&line).unwrap();
        }
        let chunk = tokio::time::timeout(Duration::from_secs(5), body.next()).await;
        buffered.extend_from_slice(&chunk.expect("a line within 5 s").expect("the watch goes on").unwrap());
    }
}

#[tokio::test]
async fn a_selected_watch_parses_no_object() {
    let fixture = Fixture::new().await;
    let revision = fixture.store.revision();
    let path = format!("{AGENTS}?watch=true&labelSelector=tier%3Dgold&resourceVersion={revision}");
    let request = Request::get(&path)
        .header("authorization", format!("Bearer {}", fixture.viewer))
        .body(Body::empty())
        .unwrap();
    let before = Obj::parsed_on_this_thread();
    let response = fixture.app.clone().oneshot(request).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let mut body = response.into_body().into_data_stream();
    // Every Agent that is not gold changes and stays not gold; then a silver one turns
    // gold and a gold one changes: only those two reach the watcher.
    let update = |i: usize, labels: Value| Mutation::Update {
        kind: "agents",
        object: agent(i, labels),
        subresource: Subresource::Main,
    };
    let mut updates: Vec<Mutation> =
        (0..COUNT).filter(|i| i % 4 != 0).map(|i| update(i, json!({"tier": "tin"}))).collect();
    updates.push(update(1, json!({"tier": "gold"})));
    updates.push(update(4, json!({"tier": "gold", "env": "test"})));
    fixture.store.commit_all(updates, false).await.unwrap();
    let mut buffered = Vec::new();
    let mut seen = Vec::new();
    for _ in 0..2 {
        let event = next_line(&mut body, &mut buffered).await;
        seen.push((
            event["type"].as_str().unwrap().to_string(),
            hive_api::meta::name_of(&event["object"]).to_string(),
        ));
    }
    assert_eq!(seen, [("ADDED".to_string(), name(1)), ("MODIFIED".to_string(), name(4))]);
    let parsed = Obj::parsed_on_this_thread() - before;
    assert_eq!(parsed, 0, "objects parsed to select {} events", COUNT * 3 / 4 + 2);
}
