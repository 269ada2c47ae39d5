//! The DAG shape of every power and lifecycle operation, per agent, from the agent's
//! live state — the coordinator document's "Every operation as a DAG". Pure: the
//! caller reads live state; this module only decides nodes and edges.
//!
//! The head `SetWanted` (intent) and the tail `Reconcile` (convergence) are always
//! present in the power shapes; only the mechanical nodes (Signal, Drain,
//! StopForUpdate) depend on whether the agent runs. A multi-agent operation is one
//! DAG with an independent subgraph per agent.

use hive_api::agent::Wanted;
use hive_api::job::{Edge, JobNode, JobNodeKind, JobTemplate};
use serde_json::json;

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

/// A SetWanted node's `wanted` parameter (`Up` when absent).
pub fn wanted_param(params: &serde_json::Map<String, serde_json::Value>) -> Result<Wanted, String> {
    match params.get("wanted").and_then(|v| v.as_str()) {
        Some("Offline") => Ok(Wanted::Offline),
        Some("Up") | None => Ok(Wanted::Up),
        Some(other) => Err(format!("SetWanted: unknown wanted {other:?}")),
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
    chain.rebuild();
    chain.nodes[0].params.insert("relock".into(), json!(false));
    chain.nodes
}

/// An approved `ApplyCommit` / `MergeConfigPr`: one ApprovalDeploy node on the target,
/// carrying the approval's name (the executor reads the change from it).
pub fn approval_deploy(agent: &str, approval: &str) -> Vec<JobNode> {
    let mut chain = Chain::new(agent);
    chain
        .then("approval-deploy", JobNodeKind::ApprovalDeploy)
        .params
        .insert("approval".into(), json!(approval));
    chain.nodes
}

/// The one MetaLock node of a meta-update or the boot sweep: bump `inputs` (`hive` is
/// the hive base input; any other name is an agent's config input), then fan out
/// rebuilds. `fan_out`: the exact agents to rebuild, in order (the boot sweep's stale,
/// wanted-up agents, parents first); `None` lets the executor rebuild every installed
/// agent whose input changed. `non_fatal`: a failed bump is reported in the step label
/// and the rebuilds still fan out (the boot sweep must not strand stale agents).
pub fn meta_lock(inputs: &[String], fan_out: Option<&[String]>, non_fatal: bool) -> Vec<JobNode> {
    let mut node = JobNode::new("meta-lock".to_string(), JobNodeKind::MetaLock, None::<&str>);
    node.params.insert("inputs".into(), json!(inputs));
    if let Some(agents) = fan_out {
        node.params.insert("agents".into(), json!(agents));
    }
    if non_fatal {
        node.params.insert("nonFatal".into(), json!(true));
    }
    vec![node]
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

    fn push(&mut self, step: &str, kind: JobNodeKind, edge: Edge) -> &mut JobNode {
        let mut node = JobNode::new(self.id(step), kind, Some(self.agent));
        if let Some(prev) = self.nodes.last() {
            node = node.after(prev.id.clone(), edge);
        }
        self.nodes.push(node);
        self.nodes.last_mut().expect("just pushed")
    }

    fn then(&mut self, step: &str, kind: JobNodeKind) -> &mut JobNode {
        self.push(step, kind, Edge::AfterOk)
    }

    fn set_wanted(&mut self, wanted: Wanted) {
        let value = match wanted {
            Wanted::Up => "Up",
            Wanted::Offline => "Offline",
        };
        self.then("set-wanted", JobNodeKind::SetWanted).params.insert("wanted".into(), json!(value));
    }

    /// Prebuild → StopForUpdate → Swap →(AfterAny) Reconcile: the one rebuild shape.
    /// The AfterAny edge brings a wanted-up agent back on its old config when the swap
    /// fails.
    fn rebuild(&mut self) {
        self.then("prebuild", JobNodeKind::Prebuild);
        self.then("stop-for-update", JobNodeKind::StopForUpdate);
        self.then("swap", JobNodeKind::Swap);
        self.push("reconcile", JobNodeKind::Reconcile, Edge::AfterAny);
    }

    fn quiesce(&mut self, agent: &AgentState) {
        if agent.running && agent.graceful {
            self.then("signal", JobNodeKind::Signal);
            self.then("drain", JobNodeKind::Drain);
        }
    }
}

fn subgraph(template: JobTemplate, agent: &AgentState) -> Vec<JobNode> {
    let mut chain = Chain::new(&agent.name);
    match template {
        JobTemplate::Rebuild => chain.rebuild(),
        JobTemplate::Stop => {
            chain.set_wanted(Wanted::Offline);
            chain.quiesce(agent);
            chain.then("reconcile", JobNodeKind::Reconcile);
        }
        JobTemplate::Kill => {
            chain.set_wanted(Wanted::Offline);
            chain.then("reconcile", JobNodeKind::Reconcile).params.insert("kill".into(), json!(true));
        }
        JobTemplate::Restart => {
            chain.set_wanted(Wanted::Up);
            if agent.running {
                chain.quiesce(agent);
                chain.then("stop-for-update", JobNodeKind::StopForUpdate);
            }
            chain.then("reconcile", JobNodeKind::Reconcile);
        }
        JobTemplate::Start => {
            chain.set_wanted(Wanted::Up);
            if !agent.running && agent.stale {
                // The upgrade builds against the lock as it is (the coordinator
                // document's "build against the bumped lock"): a start never moves the
                // agent to a newer commit of its branch; only a rebuild, an approved
                // deploy or a meta-update does.
                let at = chain.nodes.len();
                chain.rebuild();
                chain.nodes[at].params.insert("relock".into(), json!(false));
            } else {
                chain.then("reconcile", JobNodeKind::Reconcile);
            }
        }
        JobTemplate::PermChange => {
            chain.then("write-perm-file", JobNodeKind::WritePermFile);
            chain.rebuild();
        }
        JobTemplate::Spawn => {
            chain.then("create", JobNodeKind::Create);
            chain.then("write-dropin", JobNodeKind::WriteDropin);
            chain.then("reconcile", JobNodeKind::Reconcile);
        }
        _ => {
            chain.then("reconcile", JobNodeKind::Reconcile);
        }
    }
    chain.nodes
}

#[cfg(test)]
mod tests {
    use super::*;

    fn agent(name: &str, running: bool, stale: bool, graceful: bool) -> AgentState {
        AgentState { name: name.into(), running, stale, graceful }
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
        assert_eq!(nodes[0].params["wanted"], "Offline");
    }

    #[test]
    fn fan_out_meta_and_approval_shapes() {
        let child = rebuild_locked("a");
        assert_eq!(
            render(&child),
            "prebuild stop-for-update(prebuild) swap(stop-for-update) reconcile(swap~)"
        );
        assert_eq!(child[0].params["relock"], false, "children must not revert the bump");
        let deploy = approval_deploy("a", "apr-1");
        assert_eq!(
            (deploy.len(), deploy[0].kind, deploy[0].params["approval"].as_str()),
            (1, JobNodeKind::ApprovalDeploy, Some("apr-1"))
        );
        let lock = meta_lock(&["hive".into()], Some(&["p".into(), "c".into()]), true);
        assert_eq!(lock[0].agent, None);
        assert_eq!(lock[0].params["agents"], json!(["p", "c"]));
        assert_eq!(lock[0].params["nonFatal"], true);
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
        assert_eq!(nodes[1].params["kill"], true);
        assert_eq!(intent(JobTemplate::Kill), Some(Wanted::Offline));
        assert_eq!(intent(JobTemplate::Restart), Some(Wanted::Up));
        assert_eq!(intent(JobTemplate::Rebuild), None);
        assert_eq!(intent(JobTemplate::Spawn), None, "a spawn keeps the wanted it was created with");
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
