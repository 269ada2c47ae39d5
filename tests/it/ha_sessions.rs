//! A dashboard session on replicas that share one etcd: signed in on one replica, the
//! browser is signed in on every replica; signed out (or its token revoked) on one, it
//! is signed out on every replica.

use hive::store::etcd::cluster::LocalCluster;
use serde_json::json;

use crate::ha::{following, leading, offline, replica, set_wanted};
use crate::harness::{eventually, Daemon};

/// A browser that trusts the replicas' shared CA and does not follow redirects (so a
/// page that wants a sign-in answers 303 to `/login`).
fn browser(ca_pem: &[u8]) -> reqwest::Client {
    reqwest::Client::builder()
        .use_rustls_tls()
        .tls_built_in_root_certs(false)
        .add_root_certificate(reqwest::Certificate::from_pem(ca_pem).unwrap())
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap()
}

/// Signs in on `daemon` with `token`; the `hive_session=…` cookie.
async fn sign_in(browser: &reqwest::Client, daemon: &Daemon, token: &str) -> String {
    let signed_in =
        browser.post(format!("{}/login", daemon.url)).form(&[("token", token)]).send().await.unwrap();
    assert_eq!(signed_in.status(), 303, "{}", signed_in.text().await.unwrap());
    signed_in.headers()["set-cookie"].to_str().unwrap().split(';').next().unwrap().to_string()
}

/// The overview page on `daemon` with `cookie`: its CSRF token when signed in, `None`
/// when it sends the browser to `/login`.
async fn page_csrf(browser: &reqwest::Client, daemon: &Daemon, cookie: &str) -> Option<String> {
    let page = browser.get(format!("{}/", daemon.url)).header("cookie", cookie).send().await.unwrap();
    if page.status() == 303 {
        assert_eq!(page.headers()["location"], "/login");
        return None;
    }
    assert_eq!(page.status(), 200);
    let text = page.text().await.unwrap();
    Some(text.split("name=\"csrf-token\" content=\"").nth(1).unwrap().split('"').next().unwrap().to_string())
}

/// The status of an API read on `daemon` with only the cookie.
async fn api_read(browser: &reqwest::Client, daemon: &Daemon, cookie: &str) -> u16 {
    let url = format!("{}/apis/hive.dev/v1/agents", daemon.url);
    browser.get(url).header("cookie", cookie).send().await.unwrap().status().as_u16()
}

/// Waits until `cookie` no longer signs anyone in on `daemon`, for pages and the API.
async fn signed_out(browser: &reqwest::Client, daemon: &Daemon, cookie: &str, why: &str) {
    eventually(why, || async move {
        let gone = page_csrf(browser, daemon, cookie).await.is_none()
            && api_read(browser, daemon, cookie).await == 401;
        gone.then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_signed_in_on_one_replica_works_and_ends_on_every_replica() {
    let cluster = LocalCluster::start(1).unwrap();
    let store = cluster.url();
    let a = replica(&store);
    leading(&a).await;
    let b = replica(&store);
    following(&b).await;
    let browser = browser(&a.ca_pem);
    let minted = a.client().post("/hive/v1/tokens", &json!({"name": "browser", "role": "operator"})).await;
    assert_eq!(minted.code, 201, "{:?}", minted.body);
    let token = minted.body["token"].as_str().unwrap().to_string();

    // Signed in on A: the same cookie is signed in on B, for pages and the API.
    let (on, a_url, with) = (&browser, &a.url, &token);
    let cookie = eventually("the minted token to count on A", || async move {
        let signed_in = on.post(format!("{a_url}/login")).form(&[("token", with)]).send().await.unwrap();
        (signed_in.status() == 303).then(|| {
            signed_in.headers()["set-cookie"].to_str().unwrap().split(';').next().unwrap().to_string()
        })
    })
    .await;
    let csrf_on_a = page_csrf(&browser, &a, &cookie).await.expect("signed in on A");
    let csrf = page_csrf(&browser, &b, &cookie).await.expect("the session signed in on A is signed in on B");
    assert_eq!(csrf, csrf_on_a, "one session, one CSRF token");
    assert_eq!(api_read(&browser, &b, &cookie).await, 200);
    // A mutation B serves itself, and one it forwards to the leader (A), both with the
    // cookie and the page's CSRF token.
    let created = browser
        .post(format!("{}/apis/hive.dev/v1/agents", b.url))
        .header("cookie", &cookie)
        .header("x-csrf-token", &csrf)
        .json(&offline("a"))
        .send()
        .await
        .unwrap();
    assert_eq!(created.status(), 201, "{}", created.text().await.unwrap());
    let posted = browser
        .post(format!("{}/apis/hive.dev/v1/jobs", b.url))
        .header("cookie", &cookie)
        .header("x-csrf-token", &csrf)
        .json(&set_wanted("from-b", "a"))
        .send()
        .await
        .unwrap();
    assert_eq!(posted.status(), 201, "{}", posted.text().await.unwrap());
    // Without the CSRF token, B refuses the mutation.
    let refused = browser
        .post(format!("{}/apis/hive.dev/v1/agents", b.url))
        .header("cookie", &cookie)
        .json(&offline("b"))
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), 403);

    // Signed out on B: signed out on A too.
    let out = browser
        .post(format!("{}/logout", b.url))
        .header("cookie", &cookie)
        .form(&[("csrf", csrf.as_str())])
        .send()
        .await
        .unwrap();
    assert_eq!(out.status(), 303);
    signed_out(&browser, &b, &cookie, "the signed-out session to end on B").await;
    signed_out(&browser, &a, &cookie, "the session signed out on B to end on A").await;

    // Signed in again (on B this time) and seen on A; revoking the token ends it on both.
    let cookie = sign_in(&browser, &b, &token).await;
    assert!(page_csrf(&browser, &a, &cookie).await.is_some(), "the session signed in on B is signed in on A");
    let revoked = a.client().delete("/hive/v1/tokens/browser").await;
    assert_eq!(revoked.code, 200, "{:?}", revoked.body);
    signed_out(&browser, &a, &cookie, "the revoked token's session to end on A").await;
    signed_out(&browser, &b, &cookie, "the revoked token's session to end on B").await;
}
