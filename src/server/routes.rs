//! Authorization declared where a route is: every method of every authenticated route
//! names the [`Verb`] a caller's role must allow, and the check runs on that route.
//!
//! Routes are built with [`get`], [`post`], [`put`], [`patch`] and [`delete`] (and the
//! same names chained on a [`Route`]) in place of axum's method routers; each takes the
//! verb before the handler, so a method without a verb does not compile. An
//! [`ApiRouter`] accepts only such routes, and the authenticated part of
//! [`super::app`] is built from one [`ApiRouter`] alone, so no authenticated route
//! can be served without a declared verb. The router also keeps the table of what was
//! declared ([`ApiRouter::table`]), which the tests walk.
//!
//! The `authenticate` middleware in `mod.rs` only establishes who is calling (a bearer
//! token, or the dashboard's session cookie with its CSRF check) and inserts the
//! [`Principal`]; the layer each method gets here decides whether that principal may.
//!
//! A method a path does not serve is refused as forbidden, not as 405, to a caller who
//! could not use every method the path serves (and needs at least [`Verb::Write`]): a
//! viewer's DELETE on a collection is a 403, as it was when roles were inferred from
//! the method. Either way nothing is served, and no route is revealed to a caller the
//! route would refuse.

use std::collections::BTreeMap;

use axum::extract::{Request, State};
use axum::handler::Handler;
use axum::http::Method;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{self, MethodRouter};
use axum::Router;

use super::error::ApiError;
use super::AppState;
use crate::auth::{Principal, Verb};

/// The methods of one path, each with the verb it needs. A method declared with [`get`]
/// also answers HEAD, with the same verb.
pub struct Route {
    methods: MethodRouter<AppState>,
    verbs: Vec<(Method, Verb)>,
}

macro_rules! verb_routes {
    ($($name:ident => $method:ident),* $(,)?) => {
        $(
            #[doc = concat!("A route serving `", stringify!($method), "` with `handler`, for callers whose role allows `verb`.")]
            pub fn $name<H, T>(verb: Verb, handler: H) -> Route
            where
                H: Handler<T, AppState>,
                T: 'static,
            {
                Route { methods: MethodRouter::new(), verbs: Vec::new() }.$name(verb, handler)
            }
        )*

        impl Route {
            $(
                #[doc = concat!("Also serves `", stringify!($method), "` with `handler`, for callers whose role allows `verb`.")]
                #[track_caller]
                pub fn $name<H, T>(self, verb: Verb, handler: H) -> Route
                where
                    H: Handler<T, AppState>,
                    T: 'static,
                {
                    self.with(Method::$method, verb, routing::$name(handler))
                }
            )*
        }
    };
}

verb_routes!(get => GET, post => POST, put => PUT, patch => PATCH, delete => DELETE);

impl Route {
    #[track_caller]
    fn with(mut self, method: Method, verb: Verb, methods: MethodRouter<AppState>) -> Route {
        let checked = methods.route_layer(middleware::from_fn_with_state(verb, authorize));
        self.methods = self.methods.merge(checked);
        self.verbs.push((method, verb));
        self
    }

    #[track_caller]
    fn merge(mut self, other: Route) -> Route {
        self.methods = self.methods.merge(other.methods);
        self.verbs.extend(other.verbs);
        self
    }

    /// What a method this path does not serve needs before the caller learns so: the
    /// strongest verb the path declares, and at least [`Verb::Write`].
    fn unserved_verb(&self) -> Verb {
        self.verbs.iter().map(|(_, verb)| *verb).fold(Verb::Write, Verb::max)
    }
}

/// One declared method of one path.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Declared {
    /// The method (`GET` also stands for HEAD).
    pub method: Method,
    /// The path as axum matches it, e.g. `/apis/hive.dev/v1/agents/{name}`.
    pub path: &'static str,
    /// What the caller's role must allow.
    pub verb: Verb,
}

/// The authenticated API's routes, every one with its verbs. Routes of one path given
/// in several places are merged (a method declared twice panics, as in axum).
#[derive(Default)]
pub struct ApiRouter {
    routes: BTreeMap<&'static str, Route>,
}

impl ApiRouter {
    /// No routes.
    pub fn new() -> ApiRouter {
        ApiRouter::default()
    }

    /// Adds `route` at `path`.
    #[track_caller]
    pub fn route(mut self, path: &'static str, route: Route) -> ApiRouter {
        let route = match self.routes.remove(path) {
            Some(existing) => existing.merge(route),
            None => route,
        };
        self.routes.insert(path, route);
        self
    }

    /// Adds every route of `other`.
    #[track_caller]
    pub fn merge(self, other: ApiRouter) -> ApiRouter {
        other.routes.into_iter().fold(self, |router, (path, route)| router.route(path, route))
    }

    /// Every declared method of every path, by path.
    pub fn table(&self) -> Vec<Declared> {
        self.routes
            .iter()
            .flat_map(|(path, route)| {
                route.verbs.iter().map(|(method, verb)| Declared {
                    method: method.clone(),
                    path,
                    verb: *verb,
                })
            })
            .collect()
    }

    /// What a method `path` does not serve needs (see the module docs); `None` for a
    /// path that is not declared.
    pub fn unserved_verb(&self, path: &str) -> Option<Verb> {
        self.routes.get(path).map(Route::unserved_verb)
    }

    /// The axum router. Each path's unserved methods answer through [`unserved`].
    pub fn into_router(self) -> Router<AppState> {
        self.routes.into_iter().fold(Router::new(), |router, (path, route)| {
            let verb = route.unserved_verb();
            router.route(path, route.methods.fallback(move |request: Request| unserved(verb, request)))
        })
    }
}

/// The layer on every declared method: refuses a caller whose role does not allow `verb`.
async fn authorize(State(verb): State<Verb>, request: Request, next: Next) -> Response {
    match check(verb, &request) {
        Ok(()) => next.run(request).await,
        Err(refused) => refused.into_response(),
    }
}

/// A method the path does not serve: 405 only to a caller who may use the whole path.
async fn unserved(verb: Verb, request: Request) -> ApiError {
    match check(verb, &request) {
        Ok(()) => ApiError::MethodNotAllowed,
        Err(refused) => refused,
    }
}

fn check(verb: Verb, request: &Request) -> Result<(), ApiError> {
    // `authenticate` runs first and inserts the principal; a route reached without one
    // (a router built without that middleware) serves nothing.
    let principal = request.extensions().get::<Principal>().ok_or(ApiError::Unauthorized)?;
    if principal.allows(verb) {
        return Ok(());
    }
    Err(ApiError::Forbidden(forbidden_message(principal, request.method(), request.uri().path())))
}

/// The 403 message, in the Kubernetes wording kubectl users know.
pub fn forbidden_message(principal: &Principal, method: &Method, path: &str) -> String {
    let resource = resource(path);
    format!(
        "{resource}.hive.dev is forbidden: User \"{}\" (role {}) cannot {} resource \"{resource}\" in API group \"hive.dev\"",
        principal.name,
        principal.role,
        verb_word(method),
    )
}

/// The resource a path names, for the 403 message: the plural of a kind (or `events`),
/// `tokens`, `offers`, or a provider's configure path.
fn resource(path: &str) -> String {
    if path.starts_with("/hive/v1/tokens") {
        return "tokens".into();
    }
    if path == "/hive/v1/fleet/offers" {
        return "offers".into();
    }
    if let Some(rest) = path.strip_prefix("/hive/v1/fleet/providers/") {
        return format!("providers/{rest}");
    }
    let rest =
        path.strip_prefix("/apis/hive.dev/v1/").or_else(|| path.strip_prefix("/api/v1/")).unwrap_or("");
    rest.split('/').next().unwrap_or("").to_string()
}

fn verb_word(method: &Method) -> &'static str {
    match *method {
        Method::GET | Method::HEAD => "get",
        Method::POST => "create",
        Method::PUT => "update",
        Method::PATCH => "patch",
        Method::DELETE => "delete",
        _ => "access",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn handler() {}

    #[test]
    fn unserved_methods_need_the_strongest_verb_and_at_least_write() {
        let cases = [
            (get(Verb::Read, handler), Verb::Write),
            (get(Verb::Read, handler).post(Verb::Request, handler), Verb::Write),
            (get(Verb::Read, handler).post(Verb::Admin, handler), Verb::Admin),
            (get(Verb::Admin, handler), Verb::Admin),
        ];
        for (route, want) in cases {
            assert_eq!(route.unserved_verb(), want, "{:?}", route.verbs);
        }
    }

    #[test]
    fn routes_of_one_path_merge_and_table_in_path_order() {
        let router = ApiRouter::new()
            .route("/b", post(Verb::Write, handler))
            .route("/a", get(Verb::Read, handler))
            .merge(ApiRouter::new().route("/b", get(Verb::Read, handler)));
        let table: Vec<_> = router.table().into_iter().map(|d| (d.method, d.path, d.verb)).collect();
        assert_eq!(
            table,
            [
                (Method::GET, "/a", Verb::Read),
                (Method::POST, "/b", Verb::Write),
                (Method::GET, "/b", Verb::Read)
            ]
        );
    }

    #[test]
    #[should_panic(expected = "Overlapping method route")]
    fn a_method_declared_twice_panics() {
        let _ = ApiRouter::new().route("/a", get(Verb::Read, handler)).route("/a", get(Verb::Admin, handler));
    }

    #[test]
    fn resources_named_in_refusals() {
        let cases = [
            ("/apis/hive.dev/v1/agents", "agents"),
            ("/apis/hive.dev/v1/providers/p/status", "providers"),
            ("/api/v1/events/e", "events"),
            ("/hive/v1/tokens/ci", "tokens"),
            ("/hive/v1/fleet/offers", "offers"),
            ("/hive/v1/fleet/providers/vast/configure", "providers/vast/configure"),
            ("/hive/v1/whoami", ""),
        ];
        for (path, want) in cases {
            assert_eq!(resource(path), want, "{path}");
        }
    }
}
