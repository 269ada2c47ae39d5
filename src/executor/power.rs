//! The power actions: SetWanted (reports the intent written with the Job), Reconcile
//! (start, stop or kill to converge on `wanted`), StopForUpdate, and the graceful
//! quiesce — Signal and Drain, skipped when a client wrote another intent since.

use hive_api::agent::{Agent, Wanted};
use hive_api::job::NodeAction;

use super::{failed, NodeLines, RuntimeExecutor};
use crate::runtime::{BuildLog, Drain};
use crate::scheduler::{NodeContext, NodeError, NodeRun};

impl RuntimeExecutor {
    /// SetWanted writes nothing: the intent was written with the Job, in one
    /// transaction, when it was submitted or claimed (`submit`, `jobs::intake::claim`).
    /// Writing it again when the node finally runs would overwrite whatever a client
    /// wrote since — the last writer wins, whoever it is. The node reports the intent
    /// the rest of its chain converges to.
    pub(super) fn set_wanted(&self, name: &str, wanted: Wanted) -> Result<String, NodeError> {
        let current = self.agent(name)?.spec.wanted;
        Ok(if current == wanted {
            format!("wanted {wanted:?}")
        } else {
            format!("wanted {current:?}, written after this Job; converging to it")
        })
    }

    /// Reconcile: converges observed power to `wanted`; `kill` stops an agent wanted
    /// Offline with a kill instead of a graceful stop.
    pub(super) async fn reconcile(
        &self,
        ctx: &NodeContext,
        name: &str,
        kill: bool,
    ) -> Result<String, NodeError> {
        let agent = self.agent(name)?;
        let running = self.runtime.is_running(&agent).await.map_err(failed)?;
        Ok(match (agent.spec.wanted, running) {
            (Wanted::Up, false) => {
                ctx.set_step("starting");
                let started = self.runtime.start(&agent).await.map_err(failed)?;
                if let Some(first) = started.recovered_from {
                    NodeLines(ctx)
                        .line(&format!("the first start failed ({first}); a clean cold start succeeded"));
                }
                format!("started (pid {})", started.pid)
            }
            (Wanted::Offline, true) if kill => {
                ctx.set_step("killing");
                self.runtime.kill(&agent).await.map_err(failed)?;
                "killed".into()
            }
            (Wanted::Offline, true) => {
                ctx.set_step("stopping");
                self.runtime.stop(&agent).await.map_err(failed)?;
                "stopped".into()
            }
            (Wanted::Up, true) => "already running".into(),
            (Wanted::Offline, false) => "already stopped".into(),
        })
    }

    /// StopForUpdate: stops the agent for a profile swap, leaving `wanted` alone.
    pub(super) async fn stop_for_update(&self, ctx: &NodeContext, name: &str) -> Result<String, NodeError> {
        let agent = self.agent(name)?;
        ctx.set_step("stopping for the update");
        self.runtime.stop_for_update(&agent).await.map_err(failed)?;
        Ok("stopped for the update".into())
    }

    /// Signal: sets the graceful fence and kicks the harness.
    pub(super) async fn signal(&self, node: &NodeRun, name: &str) -> Result<String, NodeError> {
        let agent = self.agent(name)?;
        if let Some(wanted) = superseded(node, &agent) {
            return Ok(skipped(wanted));
        }
        let kick = self.runtime.signal(&agent).await.map_err(failed)?;
        Ok(format!("fence set; {kick}"))
    }

    /// Drain: waits for the harness to clear the fence, bounded by the graceful-stop
    /// timeout.
    pub(super) async fn drain(&self, node: &NodeRun, name: &str) -> Result<String, NodeError> {
        let agent = self.agent(name)?;
        if let Some(wanted) = superseded(node, &agent) {
            return Ok(skipped(wanted));
        }
        node.ctx.set_step("waiting for the harness to clear the fence");
        Ok(match self.runtime.drain(&agent).await.map_err(failed)? {
            Drain::Drained => "drained".into(),
            Drain::TimedOut => "drain timed out; stopping anyway".into(),
        })
    }
}

/// Whether a client wrote another `wanted` for `agent` after this Job was submitted:
/// the intent its own (last) SetWanted carries differs from the agent's now. Then the
/// Job's quiescing steps (Signal, Drain) have nothing to do and its Reconcile
/// converges to the newer intent.
fn superseded(node: &NodeRun, agent: &Agent) -> Option<Wanted> {
    let name = agent.metadata.name.as_str();
    let intended = node
        .spec
        .nodes
        .iter()
        .zip(node.actions.iter())
        .rev()
        .filter(|(n, _)| n.agent.as_deref() == Some(name))
        .find_map(|(_, action)| match action {
            Ok(NodeAction::SetWanted { wanted }) => Some(*wanted),
            _ => None,
        })?;
    (intended != agent.spec.wanted).then_some(agent.spec.wanted)
}

/// The step of a quiescing action with nothing to do: a client wrote `wanted` after
/// the Job.
fn skipped(wanted: Wanted) -> String {
    format!("skipped: wanted {wanted:?} was written after this Job")
}
