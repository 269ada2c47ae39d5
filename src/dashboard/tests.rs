//! Route-level tests of the dashboard and of the API's session-cookie auth, without a
//! socket (`oneshot`).

use axum::body::Body;
use axum::http::{header, Request, StatusCode};
use axum::Router;
use tower::ServiceExt;

use crate::auth::{Role, TokenStore};
use crate::server::{app_with_pages, AppState, ServerConfig};
use crate::store::{Store, StoreConfig};

struct Fixture {
    app: Router,
    tokens: TokenStore,
    viewer: String,
    operator: String,
    _dir: tempfile::TempDir,
}

fn fixture() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(StoreConfig::new(dir.path().join("hive.redb"))).unwrap();
    let tokens = TokenStore::open(dir.path()).unwrap();
    let viewer = tokens.create("vera", Role::Viewer).unwrap();
    let operator = tokens.create("otto", Role::Operator).unwrap();
    let app = app_with_pages(AppState::new(store, tokens.clone(), ServerConfig::default()), super::router());
    Fixture { app, tokens, viewer, operator, _dir: dir }
}

struct Reply {
    status: StatusCode,
    headers: axum::http::HeaderMap,
    body: String,
}

async fn send(app: &Router, req: Request<Body>) -> Reply {
    let resp = app.clone().oneshot(req).await.unwrap();
    let status = resp.status();
    let headers = resp.headers().clone();
    let bytes = axum::body::to_bytes(resp.into_body(), 1 << 22).await.unwrap();
    Reply { status, headers, body: String::from_utf8_lossy(&bytes).into_owned() }
}

fn get(path: &str, cookie: Option<&str>) -> Request<Body> {
    let mut req = Request::get(path);
    if let Some(c) = cookie {
        req = req.header(header::COOKIE, c);
    }
    req.body(Body::empty()).unwrap()
}

/// Signs in with `token`; returns the `Cookie` header value and the page's CSRF token.
async fn sign_in(f: &Fixture, token: &str) -> (String, String) {
    let req = Request::post("/login")
        .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
        .body(Body::from(format!("token={token}")))
        .unwrap();
    let reply = send(&f.app, req).await;
    assert_eq!(reply.status, StatusCode::SEE_OTHER, "{}", reply.body);
    assert_eq!(reply.headers[header::LOCATION], "/");
    let set = reply.headers[header::SET_COOKIE].to_str().unwrap().to_string();
    let cookie = set.split(';').next().unwrap().to_string();
    let page = send(&f.app, get("/", Some(&cookie))).await;
    assert_eq!(page.status, StatusCode::OK);
    let csrf = page.body.split("name=\"csrf-token\" content=\"").nth(1).unwrap().split('"').next().unwrap();
    (cookie, csrf.to_string())
}

fn post_json(path: &str, cookie: &str, csrf: Option<&str>, body: &str) -> Request<Body> {
    let mut req =
        Request::post(path).header(header::COOKIE, cookie).header(header::CONTENT_TYPE, "application/json");
    if let Some(csrf) = csrf {
        req = req.header("x-csrf-token", csrf);
    }
    req.body(Body::from(body.to_string())).unwrap()
}

const AGENT: &str = r#"{"apiVersion":"hive.dev/v1","kind":"Agent","metadata":{"name":"a1"},
  "spec":{"config":{"repo":"https://git.example.invalid/a1.git"},"runtime":{"type":"process","process":{"command":["./run.sh"]}}}}"#;

#[tokio::test]
async fn sign_in_sets_a_locked_down_cookie_and_pages_need_it() {
    let f = fixture();
    let page = send(&f.app, get("/agents", None)).await;
    assert_eq!(page.status, StatusCode::SEE_OTHER);
    assert_eq!(page.headers[header::LOCATION], "/login");
    let login = send(&f.app, get("/login", None)).await;
    assert_eq!(login.status, StatusCode::OK);
    assert!(login.body.contains("name=\"token\""));

    let req = Request::post("/login")
        .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
        .body(Body::from(format!("token={}", f.operator)))
        .unwrap();
    let reply = send(&f.app, req).await;
    let set = reply.headers[header::SET_COOKIE].to_str().unwrap();
    for flag in ["hive_session=", "HttpOnly", "Secure", "SameSite=Strict", "Path=/", "Max-Age=43200"] {
        assert!(set.contains(flag), "{flag} missing from {set}");
    }
    assert!(!set.contains(&f.operator), "the token never goes into the cookie");

    let (cookie, csrf) = sign_in(&f, &f.operator).await;
    let created = send(&f.app, post_json("/apis/hive.dev/v1/agents", &cookie, Some(&csrf), AGENT)).await;
    assert_eq!(created.status, StatusCode::CREATED, "{}", created.body);
    for path in ["/", "/agents", "/agents/a1", "/jobs", "/approvals", "/fleet", "/provision"] {
        let page = send(&f.app, get(path, Some(&cookie))).await;
        assert_eq!(page.status, StatusCode::OK, "{path}");
        assert!(page.headers[header::CONTENT_SECURITY_POLICY]
            .to_str()
            .unwrap()
            .contains("script-src 'self'"));
        assert!(page.body.contains("otto"), "{path} names who is signed in");
        assert!(!page.body.contains(&f.operator), "{path} never shows the token");
        assert!(page.body.contains(&csrf));
    }
}

#[tokio::test]
async fn a_bad_token_is_refused_with_the_form() {
    let f = fixture();
    let req = Request::post("/login")
        .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
        .body(Body::from("token=hive_nope"))
        .unwrap();
    let reply = send(&f.app, req).await;
    assert_eq!(reply.status, StatusCode::UNAUTHORIZED);
    assert!(reply.headers.get(header::SET_COOKIE).is_none());
    assert!(reply.body.contains("not valid"));
    let forged = Request::post("/login")
        .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
        .header(header::ORIGIN, "https://evil.example")
        .header(header::HOST, "127.0.0.1:7443")
        .body(Body::from(format!("token={}", f.operator)))
        .unwrap();
    assert_eq!(send(&f.app, forged).await.status, StatusCode::FORBIDDEN);
}

#[tokio::test]
async fn the_api_accepts_the_cookie_and_mutations_need_the_csrf_token() {
    let f = fixture();
    let (cookie, csrf) = sign_in(&f, &f.operator).await;
    let list = send(&f.app, get("/apis/hive.dev/v1/agents", Some(&cookie))).await;
    assert_eq!(list.status, StatusCode::OK, "{}", list.body);

    let missing = send(&f.app, post_json("/apis/hive.dev/v1/agents", &cookie, None, AGENT)).await;
    assert_eq!(missing.status, StatusCode::FORBIDDEN);
    let status: serde_json::Value = serde_json::from_str(&missing.body).unwrap();
    assert_eq!(status["kind"], "Status");
    assert_eq!(status["reason"], "Forbidden");
    assert!(status["message"].as_str().unwrap().contains("X-CSRF-Token header is missing"), "{status}");

    let wrong = send(&f.app, post_json("/apis/hive.dev/v1/agents", &cookie, Some("forged"), AGENT)).await;
    assert_eq!(wrong.status, StatusCode::FORBIDDEN);
    assert!(wrong.body.contains("does not match"), "{}", wrong.body);

    let ok = send(&f.app, post_json("/apis/hive.dev/v1/agents", &cookie, Some(&csrf), AGENT)).await;
    assert_eq!(ok.status, StatusCode::CREATED, "{}", ok.body);

    // A bearer request needs no CSRF token.
    let bearer = Request::get("/apis/hive.dev/v1/agents/a1")
        .header(header::AUTHORIZATION, format!("Bearer {}", f.operator))
        .body(Body::empty())
        .unwrap();
    assert_eq!(send(&f.app, bearer).await.status, StatusCode::OK);
    // No cookie, no bearer: 401 as before.
    assert_eq!(send(&f.app, get("/apis/hive.dev/v1/agents", None)).await.status, StatusCode::UNAUTHORIZED);
}

#[tokio::test]
async fn a_viewer_gets_no_controls_and_the_api_refuses_its_mutations() {
    let f = fixture();
    let (op_cookie, op_csrf) = sign_in(&f, &f.operator).await;
    let created =
        send(&f.app, post_json("/apis/hive.dev/v1/agents", &op_cookie, Some(&op_csrf), AGENT)).await;
    assert_eq!(created.status, StatusCode::CREATED, "{}", created.body);
    let (cookie, csrf) = sign_in(&f, &f.viewer).await;
    let agent = send(&f.app, get("/agents/a1", Some(&cookie))).await;
    assert_eq!(agent.status, StatusCode::OK);
    assert!(!agent.body.contains("data-template"), "no power buttons for a viewer");
    for control in ["agent-kill", "agent-delete"] {
        assert!(!agent.body.contains(control), "{control} rendered for a viewer");
    }
    assert!(agent.body.contains("data-can-write=\"false\""));
    let provision = send(&f.app, get("/provision", Some(&cookie))).await;
    for control in ["provision-form", "kill-form", "configure-form", "offers-form"] {
        assert!(!provision.body.contains(control), "{control} rendered for a viewer");
    }
    assert!(provision.body.contains("Read-only"));
    let refused = send(&f.app, post_json("/apis/hive.dev/v1/agents", &cookie, Some(&csrf), AGENT)).await;
    assert_eq!(refused.status, StatusCode::FORBIDDEN);
    assert!(refused.body.contains("role viewer"), "{}", refused.body);

    let provision = send(&f.app, get("/provision", Some(&op_cookie))).await;
    assert!(provision.body.contains("provision-form") && provision.body.contains("kill-form"));
    assert!(!provision.body.contains("configure-form"), "ConfigureProvider is admin's");
    let agent = send(&f.app, get("/agents/a1", Some(&op_cookie))).await;
    assert!(agent.body.contains("data-template=\"Restart\""));
    for control in ["id=\"agent-kill\"", "id=\"agent-delete\"", "id=\"agent-confirm\""] {
        assert!(agent.body.contains(control), "{control} missing for an operator");
    }
}

#[tokio::test]
async fn a_missing_object_gets_a_404_page_without_controls() {
    let f = fixture();
    let (cookie, csrf) = sign_in(&f, &f.operator).await;
    for (path, says, back) in [
        ("/agents/nope", "There is no agent named", "href=\"/agents\""),
        ("/nodes/nope", "There is no node named", "href=\"/fleet\""),
        ("/jobs/nope", "There is no job named", "href=\"/jobs\""),
    ] {
        let page = send(&f.app, get(path, Some(&cookie))).await;
        assert_eq!(page.status, StatusCode::NOT_FOUND, "{path}");
        assert!(page.body.contains(says) && page.body.contains("<code>nope</code>"), "{path}: {}", page.body);
        assert!(page.body.contains(back), "{path} links back");
        for live in
            ["Loading…", "data-template", "agent-kill", "agent-delete", "explorer", "data-page=\"agent\""]
        {
            assert!(!page.body.contains(live), "{path} renders {live}");
        }
    }
    // Once it exists, the same path is the object's page.
    let created = send(&f.app, post_json("/apis/hive.dev/v1/agents", &cookie, Some(&csrf), AGENT)).await;
    assert_eq!(created.status, StatusCode::CREATED, "{}", created.body);
    let page = send(&f.app, get("/agents/a1", Some(&cookie))).await;
    assert_eq!(page.status, StatusCode::OK);
    assert!(page.body.contains("id=\"agent-yaml\"") && page.body.contains("id=\"agent-events\""));
}

#[tokio::test]
async fn pages_escape_what_they_render() {
    let f = fixture();
    let (cookie, _) = sign_in(&f, &f.operator).await;
    let page = send(&f.app, get("/agents/%3Cscript%3Ealert(1)%3C%2Fscript%3E%22", Some(&cookie))).await;
    assert_eq!(page.status, StatusCode::NOT_FOUND, "no such agent");
    assert!(page.body.contains("Agent &lt;script&gt;alert(1)&lt;/script&gt;&quot;"), "{}", page.body);
    assert!(!page.body.contains("<script>alert"));
}

#[tokio::test]
async fn each_provision_form_gets_its_own_command_id() {
    let f = fixture();
    let (cookie, _) = sign_in(&f, &f.operator).await;
    let id = |body: &str| {
        body.split("id=\"provision-form\" class=\"stack\" data-command=\"").nth(1).unwrap()[..20].to_string()
    };
    let first = id(&send(&f.app, get("/provision", Some(&cookie))).await.body);
    let second = id(&send(&f.app, get("/provision", Some(&cookie))).await.body);
    assert!(first.starts_with("provision-") && first != second, "{first} {second}");
}

#[tokio::test]
async fn sign_out_and_revocation_end_the_session() {
    let f = fixture();
    let (cookie, csrf) = sign_in(&f, &f.operator).await;
    let forged =
        Request::post("/logout").header(header::COOKIE, &cookie).body(Body::from("csrf=nope")).unwrap();
    assert_eq!(send(&f.app, forged).await.status, StatusCode::FORBIDDEN);
    let out = Request::post("/logout")
        .header(header::COOKIE, &cookie)
        .body(Body::from(format!("csrf={csrf}")))
        .unwrap();
    let reply = send(&f.app, out).await;
    assert_eq!(reply.status, StatusCode::SEE_OTHER);
    assert!(reply.headers[header::SET_COOKIE].to_str().unwrap().contains("Max-Age=0"));
    assert_eq!(send(&f.app, get("/", Some(&cookie))).await.status, StatusCode::SEE_OTHER);
    assert_eq!(
        send(&f.app, get("/apis/hive.dev/v1/agents", Some(&cookie))).await.status,
        StatusCode::UNAUTHORIZED
    );

    let (cookie, _) = sign_in(&f, &f.viewer).await;
    f.tokens.revoke("vera").unwrap();
    assert_eq!(send(&f.app, get("/", Some(&cookie))).await.status, StatusCode::SEE_OTHER);
    assert_eq!(
        send(&f.app, get("/apis/hive.dev/v1/agents", Some(&cookie))).await.status,
        StatusCode::UNAUTHORIZED
    );
}

#[tokio::test]
async fn assets_are_embedded() {
    let f = fixture();
    for (path, kind) in [
        ("/assets/app.js", "text/javascript"),
        ("/assets/app.css", "text/css"),
        ("/assets/fleet.js", "text/javascript"),
        ("/assets/yaml.js", "text/javascript"),
        ("/assets/tables.js", "text/javascript"),
        ("/assets/events.js", "text/javascript"),
        ("/assets/detail.js", "text/javascript"),
        ("/assets/theme.css", "text/css"),
    ] {
        let reply = send(&f.app, get(path, None)).await;
        assert_eq!(reply.status, StatusCode::OK);
        assert!(reply.headers[header::CONTENT_TYPE].to_str().unwrap().starts_with(kind));
        assert!(!reply.body.is_empty());
    }
    assert_eq!(send(&f.app, get("/assets/nope.js", None)).await.status, StatusCode::NOT_FOUND);
}

/// Every script and style sheet a page names is served, in the order the log view
/// needs (it replaces `app.js`'s tail before the pages load); `/status` is a page of
/// its own for a viewer, and the API's `/metrics` answers the viewer's cookie.
#[tokio::test]
async fn every_asset_a_page_names_is_served_and_status_reads_metrics_as_a_viewer() {
    let f = fixture();
    let (cookie, _) = sign_in(&f, &f.viewer).await;
    let page = send(&f.app, get("/status", Some(&cookie))).await;
    assert_eq!(page.status, StatusCode::OK, "{}", page.body);
    assert!(page.body.contains("id=\"mx-api\""), "{}", page.body);
    let named: Vec<&str> = page.body.split(['"', '\'']).filter(|part| part.starts_with("/assets/")).collect();
    for asset in [
        "/assets/logs.js",
        "/assets/charts.js",
        "/assets/jobs_filter.js",
        "/assets/metrics.js",
        "/assets/views.css",
    ] {
        assert!(named.contains(&asset), "{asset} not in {named:?}");
    }
    let at = |asset: &str| named.iter().position(|n| *n == asset).unwrap();
    assert!(at("/assets/app.js") < at("/assets/logs.js") && at("/assets/logs.js") < at("/assets/pages.js"));
    for asset in named {
        let reply = send(&f.app, get(asset, None)).await;
        assert_eq!(reply.status, StatusCode::OK, "{asset}");
        assert!(!reply.body.is_empty(), "{asset}");
    }
    let metrics = send(&f.app, get("/metrics", Some(&cookie))).await;
    assert_eq!(metrics.status, StatusCode::OK, "{}", metrics.body);
    assert!(metrics.body.contains("apiserver_request_total"), "{}", metrics.body);
}

#[test]
fn dashboard_listen_takes_an_address_or_a_port() {
    assert_eq!(super::parse_listen("8443").unwrap().to_string(), "127.0.0.1:8443");
    assert_eq!(super::parse_listen("0.0.0.0:9000").unwrap().to_string(), "0.0.0.0:9000");
    assert!(super::parse_listen("nope").is_err());
}

fn logout(cookie: &str, csrf: &str) -> Request<Body> {
    Request::post("/logout").header(header::COOKIE, cookie).body(Body::from(format!("csrf={csrf}"))).unwrap()
}

/// Reads a response body to its end, or `None` when it is still open after `secs`
/// (of paused, auto-advancing test time).
async fn ends_within(resp: axum::response::Response, secs: u64) -> Option<String> {
    let read = axum::body::to_bytes(resp.into_body(), 1 << 22);
    let bytes = tokio::time::timeout(std::time::Duration::from_secs(secs), read).await.ok()?.unwrap();
    Some(String::from_utf8_lossy(&bytes).into_owned())
}

#[tokio::test(start_paused = true)]
async fn a_cookie_watch_ends_with_its_session() {
    for end in ["sign-out", "revocation"] {
        let f = fixture();
        let (cookie, csrf) = sign_in(&f, &f.viewer).await;
        let watch = f.app.clone().oneshot(get("/apis/hive.dev/v1/agents?watch=true", Some(&cookie))).await;
        let watch = watch.unwrap();
        assert_eq!(watch.status(), StatusCode::OK);
        match end {
            "sign-out" => {
                assert_eq!(send(&f.app, logout(&cookie, &csrf)).await.status, StatusCode::SEE_OTHER)
            }
            _ => f.tokens.revoke("vera").unwrap(),
        }
        assert!(ends_within(watch, 60).await.is_some(), "after {end}, the watch kept its connection");
    }
    // A live session's watch is not cut (nor is a non-streaming answer wrapped).
    let f = fixture();
    let (cookie, _) = sign_in(&f, &f.viewer).await;
    let watch = f.app.clone().oneshot(get("/apis/hive.dev/v1/agents?watch=true", Some(&cookie))).await;
    assert!(ends_within(watch.unwrap(), 120).await.is_none(), "a live session's watch ended");
    let list = f.app.clone().oneshot(get("/apis/hive.dev/v1/agents", Some(&cookie))).await.unwrap();
    assert!(list.headers().contains_key(header::CONTENT_LENGTH), "a list keeps its length");
}

#[tokio::test]
async fn provision_forms_post_and_wait_for_their_script() {
    let f = fixture();
    let admin = f.tokens.create("ada", Role::Admin).unwrap();
    let (cookie, _) = sign_in(&f, &admin).await;
    let page = send(&f.app, get("/provision", Some(&cookie))).await;
    for form in ["configure-form", "offers-form", "provision-form", "kill-form"] {
        let tag = page.body.split(&format!("<form id=\"{form}\"")).nth(1).unwrap().split('>').next().unwrap();
        assert!(tag.contains("method=\"post\""), "{form}: {tag}");
        let rest = page.body.split(&format!("<form id=\"{form}\"")).nth(1).unwrap();
        let button = rest.split("<button type=\"submit\"").nth(1).unwrap().split('>').next().unwrap();
        assert!(button.contains("disabled"), "{form}'s submit is enabled before its script: {button}");
    }
    // A stray native submit: refused, and the key was in the body, not in a URL.
    let native = Request::post("/provision")
        .header(header::COOKIE, &cookie)
        .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
        .body(Body::from("provider=vastai&apiKey=sk-secret"))
        .unwrap();
    assert_eq!(send(&f.app, native).await.status, StatusCode::METHOD_NOT_ALLOWED);
}

#[tokio::test]
async fn one_token_evicts_only_its_own_sessions() {
    let f = fixture();
    let (viewer, _) = sign_in(&f, &f.viewer).await;
    let (first, _) = sign_in(&f, &f.operator).await;
    for _ in 0..16 {
        sign_in(&f, &f.operator).await;
    }
    assert_eq!(send(&f.app, get("/", Some(&first))).await.status, StatusCode::SEE_OTHER, "oldest evicted");
    assert_eq!(send(&f.app, get("/", Some(&viewer))).await.status, StatusCode::OK, "another token's stays");
}

#[tokio::test]
async fn signing_in_again_ends_the_old_session() {
    let f = fixture();
    let (old, _) = sign_in(&f, &f.viewer).await;
    let again = Request::post("/login")
        .header(header::COOKIE, &old)
        .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
        .body(Body::from(format!("token={}", f.operator)))
        .unwrap();
    assert_eq!(send(&f.app, again).await.status, StatusCode::SEE_OTHER);
    assert_eq!(send(&f.app, get("/", Some(&old))).await.status, StatusCode::SEE_OTHER);
}

#[tokio::test]
async fn signing_out_of_a_dead_session_just_clears_the_cookie() {
    let f = fixture();
    let (cookie, _) = sign_in(&f, &f.viewer).await;
    f.tokens.revoke("vera").unwrap();
    let reply = send(&f.app, logout(&cookie, "stale-page-token")).await;
    assert_eq!(reply.status, StatusCode::SEE_OTHER);
    assert_eq!(reply.headers[header::LOCATION], "/login");
    assert!(reply.headers[header::SET_COOKIE].to_str().unwrap().contains("Max-Age=0"));
    // A live session still needs its CSRF token.
    let (cookie, _) = sign_in(&f, &f.operator).await;
    assert_eq!(send(&f.app, logout(&cookie, "forged")).await.status, StatusCode::FORBIDDEN);
}

#[tokio::test]
async fn same_origin_reads_the_uri_authority_without_a_host_header() {
    let f = fixture();
    let login = |origin: &str| {
        Request::post("https://127.0.0.1:7443/login")
            .header(header::ORIGIN, origin)
            .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
            .body(Body::from(format!("token={}", f.operator)))
            .unwrap()
    };
    assert_eq!(send(&f.app, login("https://evil.example")).await.status, StatusCode::FORBIDDEN);
    assert_eq!(send(&f.app, login("https://127.0.0.1:7443")).await.status, StatusCode::SEE_OTHER);
}

/// Issue 28 item 8: `Origin: http://HOST` passed for the https dashboard on HOST (only the
/// part after `://` was compared), so a page served over plain HTTP on that host — any
/// port-sharing proxy, or a network attacker in the path — could post a sign-in.
#[tokio::test]
async fn a_login_from_another_scheme_is_refused() {
    let f = fixture();
    let login = |uri: &str, origin: &str| {
        Request::post(uri)
            .header(header::HOST, "127.0.0.1:7443")
            .header(header::ORIGIN, origin)
            .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
            .body(Body::from(format!("token={}", f.operator)))
            .unwrap()
    };
    for uri in ["/login", "https://127.0.0.1:7443/login"] {
        assert_eq!(
            send(&f.app, login(uri, "http://127.0.0.1:7443")).await.status,
            StatusCode::FORBIDDEN,
            "{uri}"
        );
        assert_eq!(
            send(&f.app, login(uri, "https://127.0.0.1:7443")).await.status,
            StatusCode::SEE_OTHER,
            "{uri}"
        );
    }
}

#[tokio::test]
async fn every_response_says_nosniff() {
    let f = fixture();
    for path in ["/version", "/login", "/", "/assets/app.js", "/apis/hive.dev/v1/agents", "/nope"] {
        let reply = send(&f.app, get(path, None)).await;
        assert_eq!(reply.headers[header::X_CONTENT_TYPE_OPTIONS], "nosniff", "{path}");
    }
}

#[tokio::test]
async fn offer_search_needs_an_operator() {
    let f = fixture();
    let (viewer, _) = sign_in(&f, &f.viewer).await;
    let refused = send(&f.app, get("/hive/v1/fleet/offers?provider=vastai", Some(&viewer))).await;
    assert_eq!(refused.status, StatusCode::FORBIDDEN, "{}", refused.body);
}

#[tokio::test(start_paused = true)]
async fn a_bearer_watch_ends_when_its_token_is_revoked() {
    let f = fixture();
    let bearer = |token: &str| {
        Request::get("/apis/hive.dev/v1/agents?watch=true")
            .header(header::AUTHORIZATION, format!("Bearer {token}"))
            .body(Body::empty())
            .unwrap()
    };
    let watch = f.app.clone().oneshot(bearer(&f.viewer)).await.unwrap();
    assert_eq!(watch.status(), StatusCode::OK);
    let kept = f.app.clone().oneshot(bearer(&f.operator)).await.unwrap();
    f.tokens.revoke("vera").unwrap();
    assert!(ends_within(watch, 60).await.is_some(), "the revoked token's watch kept its connection");
    assert!(ends_within(kept, 120).await.is_none(), "a valid token's watch ended");
}

/// `/events` is the Events page (issue 32): before it, the path fell through to the
/// API's fallback and a browser got a raw JSON `Status`.
#[tokio::test]
async fn events_is_a_page_with_its_filter() {
    let f = fixture();
    let (cookie, _) = sign_in(&f, &f.viewer).await;
    let page = send(&f.app, get("/events?type=Warning&object=agent/a1", Some(&cookie))).await;
    assert_eq!(page.status, StatusCode::OK, "{}", page.body);
    assert!(
        page.headers[header::CONTENT_TYPE].to_str().unwrap().starts_with("text/html"),
        "{:?}",
        page.headers
    );
    for id in [
        "events-filter-kind",
        "events-filter-object",
        "events-filter-type",
        "events-filter-reason",
        "events-filter-since",
        "events-list",
    ] {
        assert!(page.body.contains(&format!("id=\"{id}\"")), "no #{id} in {}", page.body);
    }
    assert!(page.body.contains("href=\"/events\" aria-current=\"page\""), "{}", page.body);
    // Without a session it is a page too: a redirect to sign in, never JSON.
    let anonymous = send(&f.app, get("/events", None)).await;
    assert_eq!(anonymous.status, StatusCode::SEE_OTHER);
}
