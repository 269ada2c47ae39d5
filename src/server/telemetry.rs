//! `GET /hive/v1/fleet/nodes/{name}/telemetry[?follow=false]`: a node's telemetry as
//! newline-delimited JSON — first its channel descriptors
//! (`{"type":"descriptors","node":…,"channels":[{"channel","unit","description"}]}`),
//! then the recent frames, oldest first, then live frames as they are pulled
//! (`{"type":"frame","channel":…,"at":…,"value":…}`). With `follow=false` the stream
//! ends after the recent frames, as it does for a node that is over (killed, stopped,
//! failed); a node that is over and of which no frame is held is a 409 saying so. A live stream ends when the node stops being followed; a follower that falls behind gets `{"type":"lagged","missed":N}`
//! and carries on.

use axum::body::Body;
use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderValue};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use futures_util::StreamExt as _;
use serde::Deserialize;
use serde_json::{json, Value};
use tokio_stream::wrappers::errors::BroadcastStreamRecvError;
use tokio_stream::wrappers::BroadcastStream;

use super::error::{ApiError, ApiResult};
use super::AppState;
use crate::fleet::net::Frame;

/// The query of the telemetry stream.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct TelemetryQuery {
    follow: Option<bool>,
}

fn line(value: &Value) -> Bytes {
    let mut bytes = serde_json::to_vec(value).unwrap_or_default();
    bytes.push(b'\n');
    Bytes::from(bytes)
}

fn frame_line(frame: &Frame) -> Bytes {
    line(&json!({"type": "frame", "channel": frame.channel, "at": frame.at, "value": frame.value}))
}

pub(super) async fn stream(
    State(state): State<AppState>,
    Path(name): Path<String>,
    query: Result<Query<TelemetryQuery>, axum::extract::rejection::QueryRejection>,
) -> ApiResult<Response> {
    let Query(query) = query.map_err(|e| ApiError::BadRequest(format!("telemetry: {}", e.body_text())))?;
    let fleet = state.running_fleet()?;
    let Some(node) = crate::client::Api::<hive_api::Node>::new(&state.store).get(&name)? else {
        return Err(ApiError::NotFound { plural: "nodes".into(), name });
    };
    // A node that is over (killed, stopped, failed) has nothing live to follow.
    let over = !crate::fleet::is_live(&node);
    let crate::fleet::service::Telemetry { snapshot, live } =
        fleet.telemetry(name.clone(), query.follow.unwrap_or(true) && !over).await;
    // Over, and nothing held from when it ran: say so, rather than an empty 200 that reads
    // as a node with nothing to report (issue 32).
    if over && snapshot.recent.is_empty() {
        let phase = node.status.phase.map_or("over", hive_api::node::NodePhase::as_str);
        return Err(ApiError::Conflict {
            plural: "nodes".into(),
            name: name.clone(),
            message: format!(
                "node {name:?} is {phase}: its worker is gone and no telemetry of it is held;                  nothing to stream"
            ),
        });
    }
    let mut head =
        vec![line(&json!({"type": "descriptors", "node": name, "channels": snapshot.descriptors}))];
    let last = snapshot.recent.last().map(|f| f.at);
    head.extend(snapshot.recent.iter().map(frame_line));
    let head = futures_util::stream::iter(head.into_iter().map(Ok::<_, std::convert::Infallible>));
    let body = match live {
        None => Body::from_stream(head),
        Some(live) => {
            let live = BroadcastStream::new(live).filter_map(move |item| async move {
                match item {
                    // Frames already sent with the snapshot are skipped.
                    Ok(frame) if last.is_some_and(|at| frame.at <= at) => None,
                    Ok(frame) => Some(Ok(frame_line(&frame))),
                    Err(BroadcastStreamRecvError::Lagged(missed)) => {
                        Some(Ok(line(&json!({"type": "lagged", "missed": missed}))))
                    }
                }
            });
            Body::from_stream(head.chain(live))
        }
    };
    let mut response = body.into_response();
    response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/x-ndjson"));
    response.headers_mut().insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    Ok(response)
}
