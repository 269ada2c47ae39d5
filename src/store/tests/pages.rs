//! Pages of a selected list: the matches after the token, in order, found by looking at
//! each object at most once and none past the first match after the page, however few
//! objects each hold of the cache's lock looks at.

use super::super::Store;
use super::{agent, config, create, TestClock};

/// A store of the Agents `a00` … `a39`.
async fn store() -> (tempfile::TempDir, Store) {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(config(dir.path(), &TestClock::new())).unwrap();
    let creates = (0..40).map(|i| create(agent(&format!("a{i:02}"), "Up"))).collect();
    store.commit_all(creates, false).await.unwrap();
    (dir, store)
}

/// Whether a selector keeps Agent `i`.
type Selects = fn(usize) -> bool;

#[tokio::test]
async fn a_selected_page_looks_at_each_object_once_and_stops_one_match_past_its_end() {
    let (_dir, store) = store().await;
    let names: Vec<String> = (0..40).map(|i| format!("a{i:02}")).collect();
    let selections: [(&str, Selects); 4] = [
        ("every third", |i| i % 3 == 0),
        ("none", |_| false),
        ("all", |_| true),
        ("the last two", |i| i >= 38),
    ];
    for (what, selected) in selections {
        for after in [None, Some("a00"), Some("a17"), Some("a39"), Some("zz")] {
            // The model: the selected names after the token.
            let matching: Vec<usize> =
                (0..40).filter(|&i| selected(i) && after.is_none_or(|a| names[i].as_str() > a)).collect();
            let first = after.map_or(0, |a| names.iter().filter(|n| n.as_str() <= a).count());
            for limit in [None, Some(1), Some(2), Some(5)] {
                for per_lock in [1, 3, 4096] {
                    let case = format!("{what}, after {after:?}, limit {limit:?}, {per_lock} a lock");
                    let mut looked = Vec::new();
                    let page = store.page_selected("agents", after, limit, per_lock, |name, object| {
                        assert_eq!(hive_api::meta::name_of(&object.value()), name, "{case}");
                        looked.push(name.to_string());
                        selected(name[1..].parse().unwrap())
                    });
                    let taken = limit.map_or(matching.len(), |l| l.min(matching.len()));
                    let want: Vec<&str> = matching[..taken].iter().map(|&i| names[i].as_str()).collect();
                    let got: Vec<String> =
                        page.items.iter().map(|o| hive_api::meta::name_of(&o.value()).to_string()).collect();
                    assert_eq!(got, want, "{case}");
                    assert_eq!(page.last.as_deref(), want.last().copied(), "{case}");
                    assert_eq!(page.more, matching.len() > taken, "{case}");
                    assert_eq!((page.remaining, page.revision), (None, store.revision()), "{case}");
                    // Looked at: from the token up to the first match past the page, or to the end.
                    let end = matching.get(taken).map_or(40, |&i| i + 1);
                    let want_looked: Vec<&str> =
                        names[first.min(end)..end].iter().map(String::as_str).collect();
                    assert_eq!(looked, want_looked, "{case}");
                }
            }
        }
    }
    assert!(store.page_selected("nothing", None, Some(1), 10, |_, _| true).items.is_empty());
}
