//! The `vastai` provider as the fleet uses it: a node is an instance leased on exactly
//! the offer its Provision selected, labelled `hive:<fleet>:<command>:<node>`, its
//! worker configured by the instance's environment and dialling the daemon's advertised
//! address.

use std::sync::Arc;
use std::time::Duration;

use futures_util::future::BoxFuture;
use hive_api::node::ProviderRef;
use hive_api::provider::{ProviderState, VastaiProvider};

use super::{instance_label, ApiKey, CreateRequest, InstanceId, RetryPolicy, VastClient, VastConfig};
use super::{DEFAULT_DISK_GB, LABEL_PREFIX};
use crate::fleet::error::{Error, Result};
use crate::fleet::providers::{Created, Found, Launch, Lifetime, Provider, Readiness, JOIN_TOKEN_ENV};
use crate::fleet::VASTAI_READY_TIMEOUT;

/// The on-start script of Vast.ai nodes when neither the command nor the Provider gives
/// one: the image's `hive` runs the worker, configured by the instance's environment.
pub const DEFAULT_ONSTART: &str = "exec hive fleet-worker --supervise none";

/// The nodes of one `vastai` Provider.
pub struct VastFleet {
    /// The client of leases, destroys and listings, with the patient retry policy.
    client: VastClient,
    /// The client of the credential check, which answers an operator who is waiting:
    /// one quick retry.
    checker: VastClient,
}

impl VastFleet {
    /// The clients of `settings` with `key`; the readiness to record when they cannot
    /// be built.
    pub fn connect(
        settings: &VastaiProvider,
        key: ApiKey,
    ) -> std::result::Result<Arc<dyn Provider>, Readiness> {
        let config = VastConfig::from_settings(settings, key);
        let mut quick = config.clone();
        quick.retry =
            RetryPolicy { max_attempts: 2, base_delay: Duration::from_millis(500), ..Default::default() };
        quick.connect_timeout = Duration::from_secs(5);
        quick.request_timeout = Duration::from_secs(15);
        match VastClient::new(quick)
            .and_then(|checker| VastClient::new(config).map(|client| (checker, client)))
        {
            Ok((checker, client)) => Ok(Arc::new(VastFleet { client, checker })),
            Err(err) => Err(Readiness { state: ProviderState::ConfigurationError, message: err.to_string() }),
        }
    }
}

impl Provider for VastFleet {
    fn check(&self) -> BoxFuture<'_, Readiness> {
        Box::pin(self.checker.validate())
    }

    fn create<'a>(&'a self, launch: &'a Launch<'a>) -> BoxFuture<'a, Result<Created>> {
        Box::pin(async move {
            let node = launch.node;
            let settings = launch.spec()?.vastai.clone().unwrap_or_default();
            let Some(offer) = node.spec.offer_id else {
                return Err(Error::NoOffer);
            };
            let control = launch.net.control_target_at(launch.advertise);
            // hive:<fleet>:<command>:<node>: the fleet label keeps two daemons sharing one
            // Vast.ai account out of each other's recovery.
            let scoped =
                format!("{}:{}", launch.fleet_label, node.spec.command.as_deref().unwrap_or_default());
            let label = instance_label(&scoped, &node.metadata.name);
            let onstart = node
                .spec
                .bootstrap
                .clone()
                .or(settings.onstart.clone())
                .unwrap_or_else(|| DEFAULT_ONSTART.into());
            let mut request =
                CreateRequest::new(offer, label, launch.image(settings.image.as_deref())?, Some(onstart));
            request.disk_gb = settings.disk_gb.unwrap_or(DEFAULT_DISK_GB);
            request.env = [
                ("MYELIN_AGENT_ONLY", "1".to_string()),
                ("HIVE_NODE", node.metadata.name.clone()),
                ("HIVE_LOGICAL_ID", node.spec.logical_id.to_string()),
                ("HIVE_CONTROL", control),
                (JOIN_TOKEN_ENV, launch.token.to_string()),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect();
            let created = self.client.create_instance(&request).await?;
            if !created.duplicates.is_empty() {
                tracing::warn!(node = node.metadata.name, duplicates = ?created.duplicates, "vast.ai: other instances carry this node's label; left alone");
            }
            Ok(Created {
                reference: ProviderRef { instance_id: Some(created.id.0), ..Default::default() },
                ready: None,
                join_timeout: VASTAI_READY_TIMEOUT,
            })
        })
    }

    fn destroy<'a>(&'a self, _node: &'a str, reference: &'a ProviderRef) -> BoxFuture<'a, Result<String>> {
        Box::pin(async move {
            match reference.instance_id {
                None => Ok("no instance".into()),
                Some(id) => {
                    let outcome = self.client.destroy(InstanceId(id)).await?;
                    Ok(format!("instance {id}: {outcome:?}"))
                }
            }
        })
    }

    fn list<'a>(&'a self, fleet: &'a str) -> BoxFuture<'a, Result<Vec<Found>>> {
        Box::pin(async move {
            // Only this fleet's instances: hive:<fleet>:<command>:<node>.
            let prefix = format!("{LABEL_PREFIX}{fleet}:");
            let instances = self.client.list_by_label(&prefix).await?;
            Ok(instances
                .into_iter()
                .map(|i| {
                    // <command>:<node>, after the prefix
                    let label = i.label.clone().unwrap_or_default();
                    let mut parts = label.strip_prefix(&prefix).unwrap_or_default().rsplitn(2, ':');
                    let node = parts.next().map(str::to_string);
                    let command = parts.next().map(str::to_string);
                    let state = i.actual_status.clone().unwrap_or_else(|| "provisioning".into());
                    Found {
                        logical_id: node.as_deref().and_then(|n| n.strip_prefix("node-")?.parse().ok()),
                        node,
                        command,
                        reference: ProviderRef { instance_id: Some(i.id.0), ..Default::default() },
                        running: !matches!(state.as_str(), "stopped" | "exited" | "offline"),
                        state,
                    }
                })
                .collect())
        })
    }

    fn lifetime(&self) -> Lifetime {
        Lifetime::Detached
    }

    fn vast(&self) -> Option<VastClient> {
        Some(self.client.clone())
    }
}
