//! `/login` (sign in with a token) and `/logout`.

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode, Uri};
use axum::response::{IntoResponse, Redirect, Response};
use axum::Extension;

use super::form_field;
use crate::auth::sessions::{clear_cookie, cookie, set_cookie, SignInError, COOKIE};
use crate::dashboard::html::Markup;
use crate::dashboard::layout::{head, html_response};
use crate::dashboard::Sessions;
use crate::server::AppState;

/// Whether a form post comes from this site: browsers send `Origin` on POST; when they
/// do, it must name the scheme and host the request went to (a login or logout form on
/// another site cannot sign a browser in or out). The dashboard is served only over TLS,
/// so the scheme is `https` (HTTP/2 names it in the request URI, with the host in its
/// authority instead of a `Host` header): `http://` the same host is another origin, a
/// page anyone on the path could have written.
fn same_origin(headers: &HeaderMap, uri: &Uri) -> bool {
    let Some(origin) = headers.get(header::ORIGIN).and_then(|v| v.to_str().ok()) else { return true };
    let host = headers
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .or_else(|| uri.authority().map(|a| a.as_str()))
        .unwrap_or("");
    let scheme = uri.scheme_str().unwrap_or("https");
    origin.split_once("://").is_some_and(|(origin_scheme, rest)| origin_scheme == scheme && rest == host)
}

fn render(error: Option<&str>) -> String {
    let mut m = Markup::new();
    head(&mut m, "Sign in", None);
    m.open("body", &[("class", "login"), ("data-page", "login")]);
    m.open("main", &[("class", "login-box")]);
    m.elem("h1", &[], "⬡ hive");
    m.elem("p", &[("class", "muted")], "Sign in with an API token.");
    if let Some(error) = error {
        m.elem("p", &[("class", "error"), ("role", "alert")], error);
    }
    m.open("form", &[("method", "post"), ("action", "/login")]);
    m.open("label", &[("for", "token")]).text("Token").close("label");
    m.void(
        "input",
        &[
            ("id", "token"),
            ("name", "token"),
            ("type", "password"),
            ("autocomplete", "off"),
            ("required", ""),
            ("autofocus", ""),
            ("placeholder", "hive_…"),
        ],
    );
    m.elem("button", &[("type", "submit"), ("class", "primary")], "Sign in");
    m.close("form");
    m.open("p", &[("class", "hint")])
        .text("The admin token is in the kubeconfig hive serve wrote (")
        .elem("code", &[], "<state-dir>/kubeconfig.yaml")
        .text("); mint others with ")
        .elem("code", &[], "hive token create --name NAME --role viewer")
        .text(".")
        .close("p");
    m.close("main").close("body").close("html");
    m.finish()
}

/// `GET /login`: the form, or the overview when already signed in.
pub async fn form(
    State(state): State<AppState>,
    Extension(sessions): Extension<Sessions>,
    headers: HeaderMap,
) -> Response {
    if sessions.current(&state.tokens, &headers).await.is_some() {
        return Redirect::to("/").into_response();
    }
    html_response(render(None))
}

/// `POST /login` with `token=…`: a session cookie and a redirect to the overview, or
/// the form again with the reason (401). A session this browser already had is signed
/// out first, so signing in again does not leave it behind.
pub async fn submit(
    State(state): State<AppState>,
    Extension(sessions): Extension<Sessions>,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    if !same_origin(&headers, &uri) {
        let mut response = html_response(render(Some("This sign-in did not come from this site.")));
        *response.status_mut() = StatusCode::FORBIDDEN;
        return response;
    }
    let token = form_field(&body, "token").unwrap_or_default();
    if state.tokens.authenticate(token.trim()).is_some() {
        if let Some(old) = cookie(&headers, COOKIE) {
            if let Err(e) = sessions.sign_out(old).await {
                tracing::warn!(error = %e, "cannot end the session this browser had before signing in again");
            }
        }
    }
    match sessions.sign_in(&state.tokens, &token).await {
        Ok((id, principal)) => {
            tracing::info!(token_name = &*principal.name, role = %principal.role, "dashboard sign-in");
            let mut response = Redirect::to("/").into_response();
            if let Ok(value) = HeaderValue::from_str(&set_cookie(&id)) {
                response.headers_mut().insert(header::SET_COOKIE, value);
            }
            response
        }
        Err(SignInError::Unknown) => {
            let mut response = html_response(render(Some("That token is not valid (unknown or revoked).")));
            *response.status_mut() = StatusCode::UNAUTHORIZED;
            response
        }
        Err(e @ SignInError::Unavailable(_)) => {
            tracing::warn!(error = %e, cause = ?std::error::Error::source(&e), "dashboard sign-in failed");
            let mut response = html_response(render(Some("Signing in failed for now; try again.")));
            *response.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
            response
        }
    }
}

/// `POST /logout` with the page's `csrf` field: ends the session and clears the cookie.
/// A session that already ended (expired, revoked) needs no CSRF token: its cookie is
/// just cleared.
pub async fn sign_out(
    State(state): State<AppState>,
    Extension(sessions): Extension<Sessions>,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let csrf = form_field(&body, "csrf").unwrap_or_default();
    let live = sessions.current(&state.tokens, &headers).await.is_some();
    if !same_origin(&headers, &uri) || (live && !sessions.csrf_matches(&state.tokens, &headers, &csrf).await)
    {
        return (StatusCode::FORBIDDEN, "sign-out refused: missing or invalid CSRF token").into_response();
    }
    if let Some(id) = cookie(&headers, COOKIE) {
        if let Err(e) = sessions.sign_out(id).await {
            tracing::warn!(error = %e, "dashboard sign-out failed");
            return (StatusCode::SERVICE_UNAVAILABLE, "sign-out failed for now; try again").into_response();
        }
    }
    let mut response = Redirect::to("/login").into_response();
    if let Ok(value) = HeaderValue::from_str(&clear_cookie()) {
        response.headers_mut().insert(header::SET_COOKIE, value);
    }
    response
}
