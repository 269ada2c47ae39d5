//! Cancelling a Job, whatever wrote it, only while none of its nodes has started:
//! either the scheduler has it, or it still waits for a claim and is cancelled in the
//! store (it never wrote an intent). A cancelled power Job reverts its agents' intent to
//! what they are observed doing: a cancel means "don't do it", not "do it later".

use hive_api::agent::Wanted;

use super::engine::Engine;
use super::error::Result;
use super::intake;
use crate::store::Store;
use crate::submit::LiveState as _;

/// How often a cancel looks again for a Job claimed between its two looks.
const LOOKS: usize = 3;

/// Cancels Job `name` (with `children`, the Jobs it started too) through `engine`'s
/// scheduler, or in the store while it waits for a claim. The names cancelled; none when
/// it cannot be cancelled now.
pub async fn cancel(engine: &Engine, name: &str, children: bool) -> Result<Vec<String>> {
    // Either the scheduler has the Job, or it is still waiting for a claim; a claim may
    // land between the two looks, so look again (a cancel of the waiting Job is a write
    // conditional on its version: it never cancels one a scheduler took meanwhile).
    for _ in 0..LOOKS {
        let asked = if children {
            engine.scheduler.cancel_children(name).await
        } else {
            engine.scheduler.cancel(name).await.map(|c| vec![c])
        };
        match asked {
            Ok(cancelled) => {
                for job in &cancelled {
                    if crate::submit::shapes::intent(job.template).is_some() {
                        for agent in &job.agents {
                            revert_intent(engine, agent).await?;
                        }
                    }
                }
                return Ok(cancelled.into_iter().map(|c| c.name).collect());
            }
            Err(crate::scheduler::Error::NotFound { .. }) => {}
            Err(err) => return Err(err.into()),
        }
        if let Some(cancelled) = intake::cancel_unclaimed(&engine.store, name).await? {
            engine.scheduler.settled_elsewhere(vec![intake::settled(&cancelled)]);
            return Ok(vec![name.to_string()]);
        }
        // Claimed: the scheduler has it, or is about to.
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    Ok(Vec::new())
}

/// Cancels Job `name` in `store` while it waits for a claim, where no scheduler runs
/// (a server embedded without one).
pub async fn cancel_waiting(store: &Store, name: &str) -> Result<Vec<String>> {
    Ok(intake::cancel_unclaimed(store, name).await?.map(|_| vec![name.to_string()]).unwrap_or_default())
}

async fn revert_intent(engine: &Engine, agent: &str) -> Result<()> {
    let observed = if engine.is_running(agent) { Wanted::Up } else { Wanted::Offline };
    match engine.agents().patch(agent, |a| a.spec.wanted = observed).await {
        Ok(_) => Ok(()),
        Err(err) if err.is_not_found() => Ok(()),
        Err(err) => Err(err.into()),
    }
}
