//! The DAG shape of every power and lifecycle operation, per agent, from the agent's
//! live state — the coordinator document's "Every operation as a DAG". Pure: the
//! caller reads live state; this module only decides nodes and edges.
//!
//! The head `SetWanted` (intent) and the tail `Reconcile` (convergence) are always
//! present in the power shapes; only the mechanical nodes (Signal, Drain,
//! StopForUpdate) depend on whether the agent runs. A multi-agent operation is one
//! DAG with an independent subgraph per agent.

use hive_api::agent::Wanted;
use hive_api::job::{Edge, JobNode, JobTemplate, NodeAction};

/// What the submit layer read about one agent just before building its subgraph.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AgentState {
    /// The agent's name.
    pub name: String,
    /// Whether it runs now.
    pub running: bool,
    /// Whether its applied rev lags the wanted one (a start then rebuilds first).
    pub stale: bool,
    /// Whether it has a harness that honours the graceful-stop fence.
    pub graceful: bool,
    /// The fleet Node its installation is on (`status.node`; `None`: the daemon's host):
    /// what a move leaves.
    pub on: Option<String>,
}

/// The intent an operation writes, if any. A spawn writes none: it builds the agent
/// as created, and its tail Reconcile starts it only when it was created wanted Up (an
/// agent created `Offline` stays stopped, its spec untouched).
pub fn intent(template: JobTemplate) -> Option<Wanted> {
    match template {
        JobTemplate::Start | JobTemplate::Restart => Some(Wanted::Up),
        JobTemplate::Stop | JobTemplate::Kill => Some(Wanted::Offline),
        _ => None,
    }
}

/// Whether `template` is one the submit layer builds from agent state (the api's
/// definition, which admission also uses for template Jobs).
pub fn is_agent_template(template: JobTemplate) -> bool {
    template.builds_from_agents()
}

/// The rebuild a MetaLock fans out per affected agent: the ordinary rebuild shape with
/// `relock = false` on its Prebuild, so the child builds against the lock the bump just
/// wrote instead of re-resolving (and reverting) it.
pub fn rebuild_locked(agent: &str) -> Vec<JobNode> {
    let mut chain = Chain::new(agent);
    chain.rebuild(false);
    chain.nodes
}

/// An approved `ApplyCommit` / `MergeConfigPr`: one ApprovalDeploy node on the target,
/// carrying the approval's name (the executor reads the change from it).
pub fn approval_deploy(agent: &str, approval: &str) -> Vec<JobNode> {
    let mut chain = Chain::new(agent);
    chain.then("approval-deploy", NodeAction::ApprovalDeploy { approval: approval.to_string() });
    chain.nodes
}

/// The one MetaLock node of a meta-update or the boot sweep: bump `inputs` (`hive` is
/// the hive base input; any other name is an agent's config input), then fan out
/// rebuilds. `fan_out`: the exact agents to rebuild, in order (the boot sweep's stale,
/// wanted-up agents, parents first); `None` lets the executor rebuild every installed
/// agent whose input changed. `non_fatal`: a failed bump is reported in the step label
/// and the rebuilds still fan out (the boot sweep must not strand stale agents).
pub fn meta_lock(inputs: &[String], fan_out: Option<&[String]>, non_fatal: bool) -> Vec<JobNode> {
    let action =
        NodeAction::MetaLock { inputs: inputs.to_vec(), agents: fan_out.map(<[String]>::to_vec), non_fatal };
    vec![JobNode::from_action("meta-lock", None, &action)]
}

/// Lets the builds of `spec` (its Prebuild and Create nodes) retry `limit` times with the
/// default backoff (`hive serve --build-retries`), unless the Job names its own
/// `spec.retry` or a node its own `retry`. Nothing changes for `limit` 0.
pub fn retry_builds(spec: &mut hive_api::JobSpec, limit: u32) {
    if limit == 0 || spec.retry.is_some() {
        return;
    }
    for node in &mut spec.nodes {
        if matches!(node.kind, hive_api::job::JobNodeKind::Prebuild | hive_api::job::JobNodeKind::Create)
            && node.retry.is_none()
        {
            node.retry = Some(hive_api::job::Retry { limit, backoff: None });
        }
    }
}

/// Builds the nodes of one DAG: a subgraph per agent, in the order given.
pub fn build(template: JobTemplate, agents: &[AgentState]) -> Vec<JobNode> {
    agents.iter().flat_map(|a| subgraph(template, a)).collect()
}

/// Appends nodes as a chain: each node depends (AfterOk) on the one before.
struct Chain<'a> {
    agent: &'a str,
    nodes: Vec<JobNode>,
}

impl<'a> Chain<'a> {
    fn new(agent: &'a str) -> Chain<'a> {
        Chain { agent, nodes: Vec::new() }
    }

    fn id(&self, step: &str) -> String {
        format!("{}/{step}", self.agent)
    }

    fn push(&mut self, step: &str, action: NodeAction, edge: Edge) {
        let mut node = JobNode::from_action(self.id(step), Some(self.agent), &action);
        if let Some(prev) = self.nodes.last() {
            node = node.after(prev.id.clone(), edge);
        }
        self.nodes.push(node);
    }

    fn then(&mut self, step: &str, action: NodeAction) {
        self.push(step, action, Edge::AfterOk)
    }

    fn set_wanted(&mut self, wanted: Wanted) {
        self.then("set-wanted", NodeAction::SetWanted { wanted });
    }

    fn reconcile(&mut self) {
        self.then("reconcile", NodeAction::Reconcile { kill: false });
    }

    /// Prebuild → StopForUpdate → Swap →(AfterAny) Reconcile: the one rebuild shape.
    /// The AfterAny edge brings a wanted-up agent back on its old config when the swap
    /// fails. Without `relock` the build uses what the meta lock pins.
    fn rebuild(&mut self, relock: bool) {
        self.then("prebuild", NodeAction::Prebuild { relock });
        self.then("stop-for-update", NodeAction::StopForUpdate);
        self.then("swap", NodeAction::Swap);
        self.push("reconcile", NodeAction::Reconcile { kill: false }, Edge::AfterAny);
    }

    fn quiesce(&mut self, agent: &AgentState) {
        if agent.running && agent.graceful {
            self.then("signal", NodeAction::Signal);
            self.then("drain", NodeAction::Drain);
        }
    }
}

fn subgraph(template: JobTemplate, agent: &AgentState) -> Vec<JobNode> {
    let mut chain = Chain::new(&agent.name);
    match template {
        JobTemplate::Rebuild => chain.rebuild(true),
        JobTemplate::Stop => {
            chain.set_wanted(Wanted::Offline);
            chain.quiesce(agent);
            chain.reconcile();
        }
        JobTemplate::Kill => {
            chain.set_wanted(Wanted::Offline);
            chain.then("reconcile", NodeAction::Reconcile { kill: true });
        }
        JobTemplate::Restart => {
            chain.set_wanted(Wanted::Up);
            if agent.running {
                chain.quiesce(agent);
                chain.then("stop-for-update", NodeAction::StopForUpdate);
            }
            chain.reconcile();
        }
        JobTemplate::Start => {
            chain.set_wanted(Wanted::Up);
            if !agent.running && agent.stale {
                // The upgrade builds against the lock as it is (the coordinator
                // document's "build against the bumped lock"): a start never moves the
                // agent to a newer commit of its branch; only a rebuild, an approved
                // deploy or a meta-update does.
                chain.rebuild(false);
            } else {
                chain.reconcile();
            }
        }
        JobTemplate::PermChange => {
            chain.then("write-perm-file", NodeAction::WritePermFile);
            chain.rebuild(true);
        }
        JobTemplate::Spawn => {
            chain.then("create", NodeAction::Create { relock: true });
            chain.then("write-dropin", NodeAction::WriteDropin);
            chain.reconcile();
        }
        JobTemplate::Move => {
            chain.then("vacate", NodeAction::Vacate { from: agent.on.clone() });
            chain.then("create", NodeAction::Create { relock: false });
            chain.then("write-dropin", NodeAction::WriteDropin);
            chain.reconcile();
        }
        _ => chain.reconcile(),
    }
    chain.nodes
}

#[cfg(test)]
mod tests {
    use super::*;

    fn agent(name: &str, running: bool, stale: bool, graceful: bool) -> AgentState {
        AgentState { name: name.into(), running, stale, graceful, on: None }
    }

    /// `kind(dep, dep~)` per node, `~` marking an AfterAny edge.
    fn render(nodes: &[JobNode]) -> String {
        nodes
            .iter()
            .map(|n| {
                let deps: Vec<String> = n
                    .deps
                    .iter()
                    .map(|d| {
                        let step = d.node.rsplit('/').next().unwrap_or("");
                        if d.edge == Edge::AfterAny {
                            format!("{step}~")
                        } else {
                            step.to_string()
                        }
                    })
                    .collect();
                let step = n.id.rsplit('/').next().unwrap_or("");
                if deps.is_empty() {
                    step.to_string()
                } else {
                    format!("{step}({})", deps.join(","))
                }
            })
            .collect::<Vec<_>>()
            .join(" ")
    }

    #[test]
    fn shapes_follow_the_coordinator_document() {
        use JobTemplate::*;
        let cases = [
            (Rebuild, agent("a", true, false, true), "prebuild stop-for-update(prebuild) swap(stop-for-update) reconcile(swap~)"),
            (Rebuild, agent("a", false, false, false), "prebuild stop-for-update(prebuild) swap(stop-for-update) reconcile(swap~)"),
            (Stop, agent("a", true, false, true), "set-wanted signal(set-wanted) drain(signal) reconcile(drain)"),
            (Stop, agent("a", true, false, false), "set-wanted reconcile(set-wanted)"),
            (Stop, agent("a", false, false, true), "set-wanted reconcile(set-wanted)"),
            (Restart, agent("a", true, false, true), "set-wanted signal(set-wanted) drain(signal) stop-for-update(drain) reconcile(stop-for-update)"),
            (Restart, agent("a", true, false, false), "set-wanted stop-for-update(set-wanted) reconcile(stop-for-update)"),
            (Restart, agent("a", false, false, true), "set-wanted reconcile(set-wanted)"),
            (Start, agent("a", false, false, true), "set-wanted reconcile(set-wanted)"),
            (Start, agent("a", false, true, true), "set-wanted prebuild(set-wanted) stop-for-update(prebuild) swap(stop-for-update) reconcile(swap~)"),
            (Start, agent("a", true, true, true), "set-wanted reconcile(set-wanted)"),
            (Kill, agent("a", true, false, true), "set-wanted reconcile(set-wanted)"),
            (Spawn, agent("a", false, false, true), "create write-dropin(create) reconcile(write-dropin)"),
            (Move, agent("a", true, false, true), "vacate create(vacate) write-dropin(create) reconcile(write-dropin)"),
            (Reconcile, agent("a", true, false, true), "reconcile"),
            (PermChange, agent("a", true, false, true), "write-perm-file prebuild(write-perm-file) stop-for-update(prebuild) swap(stop-for-update) reconcile(swap~)"),
        ];
        for (template, state, want) in cases {
            assert_eq!(
                render(&build(template, std::slice::from_ref(&state))),
                want,
                "{template:?} {state:?}"
            );
        }
    }

    #[test]
    fn many_agents_make_one_dag_with_independent_subgraphs() {
        let nodes =
            build(JobTemplate::Stop, &[agent("a", true, false, true), agent("b", false, false, true)]);
        let ids: Vec<&str> = nodes.iter().map(|n| n.id.as_str()).collect();
        assert_eq!(
            ids,
            ["a/set-wanted", "a/signal", "a/drain", "a/reconcile", "b/set-wanted", "b/reconcile"]
        );
        assert!(nodes.iter().all(|n| n.deps.iter().all(|d| d.node.starts_with(n.agent.as_deref().unwrap()))));
        assert_eq!(nodes[0].action(), Ok(NodeAction::SetWanted { wanted: Wanted::Offline }));
    }

    #[test]
    fn fan_out_meta_and_approval_shapes() {
        let child = rebuild_locked("a");
        assert_eq!(
            render(&child),
            "prebuild stop-for-update(prebuild) swap(stop-for-update) reconcile(swap~)"
        );
        assert_eq!(
            child[0].action(),
            Ok(NodeAction::Prebuild { relock: false }),
            "children must not revert the bump"
        );
        assert_eq!(child[0].params, serde_json::json!({"relock": false}).as_object().cloned().unwrap());
        let deploy = approval_deploy("a", "apr-1");
        assert_eq!(deploy.len(), 1);
        assert_eq!(deploy[0].action(), Ok(NodeAction::ApprovalDeploy { approval: "apr-1".into() }));
        let lock = meta_lock(&["hive".into()], Some(&["p".into(), "c".into()]), true);
        assert_eq!(lock[0].agent, None);
        let agents = Some(vec!["p".to_string(), "c".to_string()]);
        assert_eq!(
            lock[0].action(),
            Ok(NodeAction::MetaLock { inputs: vec!["hive".into()], agents, non_fatal: true })
        );
        for (template, nodes) in [
            (JobTemplate::Rebuild, child),
            (JobTemplate::ApprovalDeploy, deploy),
            (JobTemplate::BootSweep, lock),
        ] {
            let mut job = hive_api::Job::new("j", hive_api::job::JobSpec { template, ..Default::default() });
            job.spec.nodes = nodes;
            assert!(hive_api::resource::validate(&job).is_empty(), "{template:?}");
        }
    }

    #[test]
    fn kill_reconciles_without_a_drain_and_intents_match() {
        let nodes = build(JobTemplate::Kill, &[agent("a", true, false, true)]);
        assert_eq!(nodes[1].action(), Ok(NodeAction::Reconcile { kill: true }));
        assert_eq!(intent(JobTemplate::Kill), Some(Wanted::Offline));
        assert_eq!(intent(JobTemplate::Restart), Some(Wanted::Up));
        assert_eq!(intent(JobTemplate::Rebuild), None);
        assert_eq!(intent(JobTemplate::Spawn), None, "a spawn keeps the wanted it was created with");
    }

    /// Built from typed actions, the nodes read as hive has always written them: stored
    /// Jobs and clients see no change.
    #[test]
    fn nodes_keep_their_wire_form() {
        use serde_json::json;
        let wire = |nodes: Vec<JobNode>| serde_json::to_value(nodes).unwrap();
        assert_eq!(
            wire(build(JobTemplate::Kill, &[agent("a", true, false, true)])),
            json!([
                {"id": "a/set-wanted", "kind": "SetWanted", "agent": "a", "params": {"wanted": "Offline"}},
                {"id": "a/reconcile", "kind": "Reconcile", "agent": "a", "deps": [{"node": "a/set-wanted", "edge": "AfterOk"}],
                 "params": {"kill": true}}
            ])
        );
        assert_eq!(
            wire(build(JobTemplate::Start, &[agent("a", false, true, true)])),
            json!([
                {"id": "a/set-wanted", "kind": "SetWanted", "agent": "a", "params": {"wanted": "Up"}},
                {"id": "a/prebuild", "kind": "Prebuild", "agent": "a", "deps": [{"node": "a/set-wanted", "edge": "AfterOk"}],
                 "params": {"relock": false}},
                {"id": "a/stop-for-update", "kind": "StopForUpdate", "agent": "a", "deps": [{"node": "a/prebuild", "edge": "AfterOk"}]},
                {"id": "a/swap", "kind": "Swap", "agent": "a", "deps": [{"node": "a/stop-for-update", "edge": "AfterOk"}]},
                {"id": "a/reconcile", "kind": "Reconcile", "agent": "a", "deps": [{"node": "a/swap", "edge": "AfterAny"}]}
            ])
        );
        assert_eq!(
            wire(meta_lock(&["hive".into()], None, false)),
            json!([{"id": "meta-lock", "kind": "MetaLock", "params": {"inputs": ["hive"]}}])
        );
    }

    #[test]
    fn every_shape_validates_as_a_job() {
        use JobTemplate::*;
        for template in [Rebuild, Start, Stop, Restart, Kill, Spawn, Reconcile, PermChange] {
            let mut job = hive_api::Job::new("j", hive_api::job::JobSpec { template, ..Default::default() });
            job.spec.nodes = build(template, &[agent("a", true, true, true), agent("b", false, true, false)]);
            let errors = hive_api::resource::validate(&job);
            assert!(errors.is_empty(), "{template:?}: {errors:?}");
        }
    }
}
