//! The daemon's Prometheus metrics: one registry, and the typed handles the parts that
//! record hold (`prometheus-client`; recording is an atomic add or a short read lock on
//! a label family, nothing more). Names follow kube-apiserver's where it has one
//! (`apiserver_request_total`, `apiserver_request_duration_seconds`,
//! `apiserver_current_inflight_requests`, `apiserver_longrunning_requests`,
//! `apiserver_watch_events_total`, `apiserver_storage_objects`, `workqueue_depth`);
//! the rest are `hive_`. `docs/metrics.md` lists every family with its labels.
//!
//! What is a level rather than an event (objects per kind, the revision, the event log's
//! size, the scheduler's queue, fleet nodes, agent restarts) is not recorded as it
//! changes: whoever serves a scrape reads it then and hands it to [`Metrics::encode`]
//! as a [`Levels`]. So the hot paths pay only for requests, commits and watch events.
//!
//! This module knows no other part of hive: the store, the server and the scheduler
//! import it, never the reverse.

use std::sync::Arc;
use std::time::Duration;

use prometheus_client::encoding::text::encode;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

/// The content type of [`Metrics::encode`]'s text: OpenMetrics, what Prometheus asks
/// for first.
pub const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// The content type of [`prometheus_text`]: the Prometheus text format 0.0.4, what a
/// client that does not ask for OpenMetrics gets (curl, `promtool check metrics`), as
/// kube-apiserver does.
pub const PROMETHEUS_TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Seconds, for request latencies: 1 ms … 60 s, as kube-apiserver's.
const REQUEST_BUCKETS: [f64; 15] =
    [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0];
/// Seconds, for a node of a Job: 100 ms … 1 h.
const NODE_BUCKETS: [f64; 12] = [0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 1800.0, 3600.0];

/// One API request, as `apiserver_request_total` counts it.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    /// kube's verb: `get`, `list`, `watch`, `create`, `update`, `patch`, `delete`,
    /// `deletecollection`, or the method in lower case on a path that is no resource.
    pub verb: &'static str,
    /// The resource (`agents`, `events`, …), `""` for discovery and other paths.
    pub resource: &'static str,
    /// The subresource (`status`, `log`, `cancel`, …) or `""`.
    pub subresource: &'static str,
    /// The HTTP status code.
    pub code: u16,
}

/// A request without its outcome, for the latency histogram and the open watches.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RouteLabels {
    /// As in [`RequestLabels::verb`].
    pub verb: &'static str,
    /// As in [`RequestLabels::resource`].
    pub resource: &'static str,
    /// As in [`RequestLabels::subresource`].
    pub subresource: &'static str,
}

/// kube-apiserver's split of in-flight requests.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct InflightLabels {
    /// `readOnly` (GET, HEAD) or `mutating`.
    pub request_kind: &'static str,
}

/// A label of one kind or resource.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResourceLabels {
    /// The resource's plural (`agents`).
    pub resource: String,
}

/// Why a watch was ended by the server.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DroppedLabels {
    /// The resource watched.
    pub resource: String,
    /// `overflow` (fell behind its buffer: in-stream 410), `expired` (its history was
    /// compacted: in-stream 410). A watch whose client took nothing for the write
    /// timeout is counted with every other stream, in `hive_streams_ended_total`.
    pub reason: &'static str,
}

/// A limit that refused a request.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct LimitLabels {
    /// `long_running_total`, `long_running_per_client`, `inflight_total`,
    /// `inflight_per_client` (429s), `object_size` (413), `pending_approvals` (403).
    pub limit: &'static str,
}

/// Why the server ended a stream (any: watch, log, telemetry, list).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct EndedLabels {
    /// `not_reading` (its client took nothing for the write timeout),
    /// `credential_ended` (its token was revoked or its session ended).
    pub reason: &'static str,
}

/// A node kind of a Job.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct NodeKindLabels {
    /// The node's kind (`Prebuild`, `Start`, …).
    pub kind: String,
}

/// A fleet node's phase and provider.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FleetLabels {
    /// `status.phase` (`Pending` while none is written).
    pub phase: String,
    /// `spec.provider`.
    pub provider: String,
}

/// One agent.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct AgentLabels {
    /// The agent's name.
    pub agent: String,
}

/// The API's handles (the server's request layer and its watch streams).
#[derive(Clone, Debug)]
pub struct ApiMetrics {
    /// `apiserver_request_total{verb,resource,subresource,code}`.
    pub requests: Family<RequestLabels, Counter>,
    /// `apiserver_request_duration_seconds{verb,resource,subresource}`: time to the
    /// response's head; long-running requests (watches, followed logs) are not in it.
    pub duration: Family<RouteLabels, Histogram, fn() -> Histogram>,
    /// `apiserver_current_inflight_requests{request_kind}`, long-running ones excluded.
    pub inflight: Family<InflightLabels, Gauge>,
    /// `apiserver_longrunning_requests{verb,resource,subresource}`: open watches and
    /// followed logs and telemetry streams.
    pub longrunning: Family<RouteLabels, Gauge>,
    /// `apiserver_watch_events_total{resource}`: object events written to watch streams.
    pub watch_events: Family<ResourceLabels, Counter>,
    /// `hive_watch_dropped_total{resource,reason}`: watches the server ended.
    pub watch_dropped: Family<DroppedLabels, Counter>,
    /// `hive_limit_refusals_total{limit}`: requests refused by a limit.
    pub limit_refusals: Family<LimitLabels, Counter>,
    /// `hive_streams_ended_total{reason}`: streaming answers the server ended.
    pub streams_ended: Family<EndedLabels, Counter>,
}

impl ApiMetrics {
    /// The counter of requests refused by `limit`.
    pub fn refused(&self, limit: &'static str) -> Counter {
        self.limit_refusals.get_or_create_owned(&LimitLabels { limit })
    }

    /// The counter of streams ended for `reason`.
    pub fn stream_ended(&self, reason: &'static str) -> Counter {
        self.streams_ended.get_or_create_owned(&EndedLabels { reason })
    }
}

impl Default for ApiMetrics {
    fn default() -> Self {
        ApiMetrics {
            requests: Family::default(),
            duration: Family::new_with_constructor(|| Histogram::new(REQUEST_BUCKETS)),
            inflight: Family::default(),
            longrunning: Family::default(),
            watch_events: Family::default(),
            watch_dropped: Family::default(),
            limit_refusals: Family::default(),
            streams_ended: Family::default(),
        }
    }
}

/// The store's commit thread's handles.
#[derive(Clone, Debug)]
pub struct StoreMetrics {
    /// `hive_store_commit_duration_seconds`: one batch planned, made durable and
    /// published.
    pub commit_duration: Histogram,
    /// `hive_store_commit_batch_size`: requests in one batch.
    pub batch_size: Histogram,
    /// `hive_store_checkpoint_duration_seconds`: logged batches applied to the redb file
    /// in one durable transaction.
    pub checkpoint_duration: Histogram,
    /// `hive_store_checkpoint_batches`: logged batches in one checkpoint.
    pub checkpoint_entries: Histogram,
}

impl Default for StoreMetrics {
    fn default() -> Self {
        StoreMetrics {
            commit_duration: Histogram::new(exponential_buckets(0.0001, 2.0, 16)),
            batch_size: Histogram::new(exponential_buckets(1.0, 2.0, 12)),
            checkpoint_duration: Histogram::new(exponential_buckets(0.0005, 2.0, 16)),
            checkpoint_entries: Histogram::new(exponential_buckets(1.0, 2.0, 16)),
        }
    }
}

/// The API audit log's handles, counted by its writer thread and its senders
/// (kube-apiserver's `apiserver_audit_event_total` and `apiserver_audit_error_total`,
/// with the drops apart).
#[derive(Clone, Debug, Default)]
pub struct AuditMetrics {
    /// `hive_audit_events_total`: lines written to the audit log.
    pub events: Counter,
    /// `hive_audit_dropped_total`: entries dropped because the writer did not keep up
    /// (or had stopped, at shutdown).
    pub dropped: Counter,
    /// `hive_audit_failed_total`: entries the writer could not write, and flushes that
    /// failed.
    pub failed: Counter,
}

/// The scheduler's handles.
#[derive(Clone, Debug)]
pub struct SchedulerMetrics {
    /// `hive_scheduler_node_duration_seconds{kind}`: a node from start to terminal.
    pub node_duration: Family<NodeKindLabels, Histogram, fn() -> Histogram>,
    /// `hive_scheduler_lease_waits`: ready nodes waiting for an agent's lease another
    /// DAG holds (after the last scheduling pass).
    pub lease_waits: Gauge,
    /// `hive_scheduler_build_slots_in_use`: heavy nodes running.
    pub build_slots_in_use: Gauge,
    /// `hive_scheduler_build_slots`: heavy nodes that may run at once.
    pub build_slots: Gauge,
}

impl Default for SchedulerMetrics {
    fn default() -> Self {
        SchedulerMetrics {
            node_duration: Family::new_with_constructor(|| Histogram::new(NODE_BUCKETS)),
            lease_waits: Gauge::default(),
            build_slots_in_use: Gauge::default(),
            build_slots: Gauge::default(),
        }
    }
}

impl PartialEq for SchedulerMetrics {
    /// Handles are not configuration: any two compare equal, so a config holding one
    /// still compares by its settings.
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl Eq for SchedulerMetrics {}

/// One controller (by the kind it reconciles) or its work queue.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ControllerLabels {
    /// The kind: `Agent`, `Approval`, `Job` (the Job intake), `Provider`.
    pub controller: &'static str,
}

/// A work queue, as client-go's `workqueue_depth{name}`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct QueueLabels {
    /// The controller's kind.
    pub name: &'static str,
}

/// The controllers' handles, as controller-runtime names them.
#[derive(Clone, Debug)]
pub struct ControllerMetrics {
    /// `controller_runtime_reconcile_time_seconds{controller}`.
    pub duration: Family<ControllerLabels, Histogram, fn() -> Histogram>,
    /// `controller_runtime_reconcile_errors_total{controller}`: runs that returned an
    /// error or panicked.
    pub errors: Family<ControllerLabels, Counter>,
    /// `controller_runtime_reconcile_total{controller}`: every run.
    pub runs: Family<ControllerLabels, Counter>,
    /// `workqueue_depth{name}`: names queued when the last run ended.
    pub depth: Family<QueueLabels, Gauge>,
}

impl Default for ControllerMetrics {
    fn default() -> Self {
        ControllerMetrics {
            duration: Family::new_with_constructor(|| Histogram::new(REQUEST_BUCKETS)),
            errors: Family::default(),
            runs: Family::default(),
            depth: Family::default(),
        }
    }
}

impl hive_controllers::Observer for ControllerMetrics {
    fn reconciled(&self, controller: &'static str, took: Duration, failed: bool, queued: usize) {
        let labels = ControllerLabels { controller };
        self.duration.get_or_create(&labels).observe(seconds(took));
        self.runs.get_or_create(&labels).inc();
        // Created at the first run, so a controller that never failed shows a 0.
        let errors = self.errors.get_or_create(&labels);
        if failed {
            errors.inc();
        }
        self.depth.get_or_create(&QueueLabels { name: controller }).set(queued as i64);
    }
}

/// What is read at scrape time (see the module docs).
#[derive(Clone, Debug, Default)]
pub struct Levels {
    /// Objects stored, per resource.
    pub objects: Vec<(String, i64)>,
    /// The store's revision.
    pub revision: i64,
    /// Events retained for watches.
    pub events: i64,
    /// About how many bytes they hold.
    pub event_bytes: i64,
    /// Events at or below this revision were dropped by retention.
    pub compacted: i64,
    /// Nodes of Jobs queued (waiting for deps or resources).
    pub queued_nodes: i64,
    /// Nodes running, per kind.
    pub running_nodes: Vec<(String, i64)>,
    /// Fleet nodes per (phase, provider).
    pub fleet_nodes: Vec<(String, String, i64)>,
    /// Crash restarts per agent (`status.restarts`).
    pub agent_restarts: Vec<(String, i64)>,
    /// Whether this process runs the scheduler, the controllers and the fleet (always
    /// on its own; the elected leader among replicas on etcd).
    pub leading: bool,
    /// Among replicas: the replica that leads, as this one knows it.
    pub leader: Option<String>,
}

/// The gauges [`Levels`] set.
#[derive(Clone, Debug, Default)]
struct LevelGauges {
    objects: Family<ResourceLabels, Gauge>,
    revision: Gauge,
    events: Gauge,
    event_bytes: Gauge,
    compacted: Gauge,
    queued_nodes: Gauge,
    running_nodes: Family<NodeKindLabels, Gauge>,
    fleet_nodes: Family<FleetLabels, Gauge>,
    agent_restarts: Family<AgentLabels, Gauge>,
    leading: Gauge,
    leader: Family<ReplicaLabels, Gauge>,
}

/// Labels naming a replica.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReplicaLabels {
    /// The replica's name (host and API address).
    pub replica: String,
}

/// The registry and every handle; clone the handle a part records into.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    /// Whether the API records requests (`hive serve --metrics=false` turns it off,
    /// to measure what recording costs).
    pub recording: bool,
    /// The API's handles.
    pub api: ApiMetrics,
    /// The store's handles.
    pub store: StoreMetrics,
    /// The scheduler's handles.
    pub scheduler: SchedulerMetrics,
    /// The controllers' handles.
    pub controllers: std::sync::Arc<ControllerMetrics>,
    /// The API audit log's handles.
    pub audit: AuditMetrics,
    levels: LevelGauges,
    /// One scrape at a time: levels set and encoded together.
    scrape: std::sync::Mutex<()>,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new(true)
    }
}

impl Metrics {
    /// Every family registered; `recording` as [`Metrics::recording`].
    pub fn new(recording: bool) -> Metrics {
        let mut registry = Registry::default();
        let api = ApiMetrics::default();
        let store = StoreMetrics::default();
        let scheduler = SchedulerMetrics::default();
        let levels = LevelGauges::default();
        let controllers = std::sync::Arc::new(ControllerMetrics::default());
        let audit = AuditMetrics::default();
        let r = &mut registry;
        r.register(
            "apiserver_request",
            "API requests by verb, resource, subresource and HTTP code",
            api.requests.clone(),
        );
        r.register(
            "apiserver_request_duration_seconds",
            "Time to the response head, by verb, resource and subresource (long-running requests excluded)",
            api.duration.clone(),
        );
        r.register(
            "apiserver_current_inflight_requests",
            "API requests being served, long-running ones excluded",
            api.inflight.clone(),
        );
        r.register(
            "apiserver_longrunning_requests",
            "Open long-running requests: watches, followed logs and telemetry streams",
            api.longrunning.clone(),
        );
        r.register(
            "apiserver_watch_events",
            "Object events written to watch streams",
            api.watch_events.clone(),
        );
        r.register(
            "hive_watch_dropped",
            "Watches the server ended with an in-stream 410: overflow (fell behind its buffer) or expired (its revision was compacted)",
            api.watch_dropped.clone(),
        );
        r.register(
            "hive_limit_refusals",
            "Requests refused by a limit: long_running_total, long_running_per_client, inflight_total, inflight_per_client (429), object_size (413), pending_approvals (403)",
            api.limit_refusals.clone(),
        );
        r.register(
            "hive_streams_ended",
            "Streaming answers the server ended: not_reading (write timeout), credential_ended (token revoked, session ended)",
            api.streams_ended.clone(),
        );
        r.register(
            "hive_store_commit_duration_seconds",
            "One commit batch planned, made durable and published",
            store.commit_duration.clone(),
        );
        r.register(
            "hive_store_commit_batch_size",
            "Write requests in one commit batch",
            store.batch_size.clone(),
        );
        r.register(
            "hive_store_checkpoint_duration_seconds",
            "Logged commit batches applied to the database file in one durable transaction",
            store.checkpoint_duration.clone(),
        );
        r.register(
            "hive_store_checkpoint_batches",
            "Logged commit batches in one checkpoint",
            store.checkpoint_entries.clone(),
        );
        r.register("apiserver_storage_objects", "Objects stored, by resource", levels.objects.clone());
        r.register(
            "hive_store_revision",
            "The store's revision (the last committed write)",
            levels.revision.clone(),
        );
        r.register("hive_store_events", "Events retained for watches", levels.events.clone());
        r.register(
            "hive_store_event_bytes",
            "About how much memory the retained events hold",
            levels.event_bytes.clone(),
        );
        r.register(
            "hive_store_compacted_revision",
            "Events at or below this revision were dropped by retention",
            levels.compacted.clone(),
        );
        r.register(
            "hive_scheduler_queued_nodes",
            "Nodes of Jobs waiting for deps or resources",
            levels.queued_nodes.clone(),
        );
        r.register(
            "hive_scheduler_running_nodes",
            "Nodes of Jobs running, by kind",
            levels.running_nodes.clone(),
        );
        r.register(
            "hive_scheduler_lease_waits",
            "Ready nodes waiting for an agent lease another Job holds",
            scheduler.lease_waits.clone(),
        );
        r.register(
            "hive_scheduler_build_slots",
            "Build slots (heavy nodes that may run at once)",
            scheduler.build_slots.clone(),
        );
        r.register(
            "hive_scheduler_build_slots_in_use",
            "Heavy nodes running",
            scheduler.build_slots_in_use.clone(),
        );
        r.register(
            "hive_scheduler_node_duration_seconds",
            "Nodes of Jobs from start to terminal, by kind",
            scheduler.node_duration.clone(),
        );
        r.register("hive_fleet_nodes", "Fleet nodes by phase and provider", levels.fleet_nodes.clone());
        r.register(
            "hive_agent_restarts",
            "Crash restarts of each agent (status.restarts)",
            levels.agent_restarts.clone(),
        );
        r.register(
            "hive_leading",
            "1 when this process runs the scheduler, the controllers and the fleet (the elected leader among replicas on etcd), else 0",
            levels.leading.clone(),
        );
        r.register(
            "hive_leader",
            "Among replicas on etcd: 1 for the replica this one knows to lead",
            levels.leader.clone(),
        );
        r.register("hive_audit_events", "Lines written to the API audit log", audit.events.clone());
        r.register(
            "hive_audit_dropped",
            "API audit entries dropped: the writer did not keep up, or had stopped at shutdown",
            audit.dropped.clone(),
        );
        r.register(
            "hive_audit_failed",
            "API audit entries the writer could not write, and flushes that failed",
            audit.failed.clone(),
        );
        r.register(
            "controller_runtime_reconcile_time_seconds",
            "Reconcile runs, by controller",
            controllers.duration.clone(),
        );
        r.register("controller_runtime_reconcile", "Reconcile runs, by controller", controllers.runs.clone());
        r.register(
            "controller_runtime_reconcile_errors",
            "Reconcile runs that failed (an error or a panic), by controller",
            controllers.errors.clone(),
        );
        r.register(
            "workqueue_depth",
            "Names queued in a controller's work queue when its last run ended",
            controllers.depth.clone(),
        );
        Metrics {
            registry,
            recording,
            api,
            store,
            scheduler,
            controllers,
            audit,
            levels,
            scrape: std::sync::Mutex::new(()),
        }
    }

    /// The registry in the OpenMetrics text format, with `levels` as they are now.
    pub fn encode(&self, levels: &Levels) -> String {
        let _one = self.scrape.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let g = &self.levels;
        g.objects.clear();
        for (resource, n) in &levels.objects {
            g.objects.get_or_create(&ResourceLabels { resource: resource.clone() }).set(*n);
        }
        g.revision.set(levels.revision);
        g.events.set(levels.events);
        g.event_bytes.set(levels.event_bytes);
        g.compacted.set(levels.compacted);
        g.queued_nodes.set(levels.queued_nodes);
        g.running_nodes.clear();
        for (kind, n) in &levels.running_nodes {
            g.running_nodes.get_or_create(&NodeKindLabels { kind: kind.clone() }).set(*n);
        }
        g.fleet_nodes.clear();
        for (phase, provider, n) in &levels.fleet_nodes {
            g.fleet_nodes
                .get_or_create(&FleetLabels { phase: phase.clone(), provider: provider.clone() })
                .set(*n);
        }
        g.agent_restarts.clear();
        for (agent, n) in &levels.agent_restarts {
            g.agent_restarts.get_or_create(&AgentLabels { agent: agent.clone() }).set(*n);
        }
        g.leading.set(i64::from(levels.leading));
        g.leader.clear();
        if let Some(replica) = &levels.leader {
            g.leader.get_or_create(&ReplicaLabels { replica: replica.clone() }).set(1);
        }
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = encode(&mut out, &self.registry);
        out
    }
}

/// `openmetrics` (as [`Metrics::encode`] writes it) in the Prometheus text format
/// 0.0.4. For the families hive has (counters, gauges, histograms; no units, exemplars
/// or info) the two differ only in that a counter family is named with its `_total`
/// in `# HELP` and `# TYPE`, and that there is no `# EOF`.
pub fn prometheus_text(openmetrics: &str) -> String {
    let mut counters = std::collections::HashSet::new();
    for line in openmetrics.lines() {
        if let Some(name) = line.strip_prefix("# TYPE ").and_then(|rest| rest.strip_suffix(" counter")) {
            counters.insert(name);
        }
    }
    let mut out = String::with_capacity(openmetrics.len() + 16 * counters.len());
    for line in openmetrics.lines() {
        if line == "# EOF" {
            continue;
        }
        let descriptor = ["# HELP ", "# TYPE "].into_iter().find_map(|prefix| {
            let rest = line.strip_prefix(prefix)?;
            let (name, tail) = rest.split_once(' ')?;
            counters.contains(name).then(|| format!("{prefix}{name}_total {tail}"))
        });
        match descriptor {
            Some(renamed) => out.push_str(&renamed),
            None => out.push_str(line),
        }
        out.push('\n');
    }
    out
}

/// Shared handles, as the daemon passes them around.
pub type SharedMetrics = Arc<Metrics>;

/// Seconds of `elapsed`, for a histogram.
pub fn seconds(elapsed: Duration) -> f64 {
    elapsed.as_secs_f64()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_family_is_in_the_text_with_its_type() {
        let metrics = Metrics::new(true);
        metrics
            .api
            .requests
            .get_or_create(&RequestLabels { verb: "create", resource: "agents", subresource: "", code: 201 })
            .inc();
        let text =
            metrics.encode(&Levels { revision: 7, objects: vec![("agents".into(), 2)], ..Levels::default() });
        assert!(text.contains("# TYPE apiserver_request counter"), "{text}");
        assert!(
            text.contains(
                r#"apiserver_request_total{verb="create",resource="agents",subresource="",code="201"} 1"#
            ),
            "{text}"
        );
        assert!(text.contains("hive_store_revision 7"), "{text}");
        assert!(text.contains(r#"apiserver_storage_objects{resource="agents"} 2"#), "{text}");
        assert!(text.ends_with("# EOF\n"), "{text}");
        let plain = prometheus_text(&text);
        assert!(plain.contains("# TYPE apiserver_request_total counter\n"), "{plain}");
        assert!(plain.contains("# HELP apiserver_request_total API requests"), "{plain}");
        assert!(plain.contains("# TYPE hive_store_revision gauge\n"), "{plain}");
        assert!(!plain.contains("# EOF"), "{plain}");
    }
}
