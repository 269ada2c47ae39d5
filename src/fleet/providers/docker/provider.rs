//! The `docker` provider as the fleet uses it: a node is a labelled container on the
//! Provider's network, its worker dialling the daemon at the network's gateway.

use std::sync::Arc;

use futures_util::future::BoxFuture;
use hive_api::node::ProviderRef;
use hive_api::provider::{DockerProvider, ProviderState};

use super::{DockerNodes, NodeRequest};
use crate::fleet::error::{Error, Result};
use crate::fleet::providers::{
    worker_args, Created, Found, Launch, Lifetime, Provider, Readiness, JOIN_TOKEN_ENV,
};
use crate::fleet::DOCKER_READY_TIMEOUT;

/// Serializes creating Docker networks in this daemon: the engine allows two networks of
/// one name, so concurrent creates must not race.
static NETWORKS: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The nodes of one `docker` Provider.
pub struct DockerFleet {
    docker: DockerNodes,
    /// The Provider's image at the check, for the readiness message.
    image: String,
}

impl DockerFleet {
    /// Connects to the engine `settings` name; the readiness to record when it cannot.
    pub async fn connect(settings: &DockerProvider) -> std::result::Result<Arc<dyn Provider>, Readiness> {
        match DockerNodes::connect(settings.host.as_deref()).await {
            Ok(docker) => Ok(Arc::new(DockerFleet { docker, image: settings.image.clone() })),
            Err(err) => Err(Readiness { state: ProviderState::ConfigurationError, message: err.to_string() }),
        }
    }
}

impl Provider for DockerFleet {
    fn check(&self) -> BoxFuture<'_, Readiness> {
        Box::pin(async move {
            match self.docker.ping().await {
                Err(err) => Readiness { state: ProviderState::ConfigurationError, message: err.to_string() },
                Ok(()) => Readiness {
                    state: ProviderState::Ready,
                    message: format!("Docker Engine answers; image {}", self.image),
                },
            }
        })
    }

    fn create<'a>(&'a self, launch: &'a Launch<'a>) -> BoxFuture<'a, Result<Created>> {
        Box::pin(async move {
            let node = launch.node;
            let settings = launch.spec()?.docker.clone().unwrap_or_default();
            let network_name = settings.network.clone().unwrap_or_else(|| launch.docker_network.to_string());
            let network = {
                let _serial = NETWORKS.lock().await;
                self.docker.ensure_network(&network_name).await?
            };
            if launch.net.bound_addrs().iter().all(|a| a.ip().is_loopback()) {
                return Err(Error::LoopbackOnly);
            }
            let Some(gateway) = network.gateway else {
                return Err(Error::NoGateway { network: network_name });
            };
            let mut cmd =
                vec!["hive".to_string(), "fleet-worker".into(), "--node".into(), node.metadata.name.clone()];
            cmd.extend(worker_args(node, launch.net.control_target(Some(gateway))));
            cmd.extend(["--supervise".into(), "none".into()]);
            let request = NodeRequest {
                fleet: launch.fleet_label.to_string(),
                run_id: launch.run_id.to_string(),
                node: node.metadata.name.clone(),
                logical_id: node.spec.logical_id,
                command: node.spec.command.clone().unwrap_or_default(),
                image: launch.image(Some(&settings.image))?,
                cmd,
                env: vec![
                    ("MYELIN_AGENT_ONLY".into(), "1".into()),
                    (JOIN_TOKEN_ENV.into(), launch.token.into()),
                ],
                network: Some(network_name),
                gpus: settings.gpus.clone(),
                keep_stdin_open: false,
            };
            let id = self.docker.create_node(&request).await?;
            Ok(Created {
                reference: ProviderRef { container_id: Some(id), ..Default::default() },
                ready: None,
                join_timeout: DOCKER_READY_TIMEOUT,
            })
        })
    }

    fn destroy<'a>(&'a self, _node: &'a str, reference: &'a ProviderRef) -> BoxFuture<'a, Result<String>> {
        Box::pin(async move {
            match &reference.container_id {
                None => Ok("no container".into()),
                Some(id) => {
                    self.docker.destroy(id).await?;
                    Ok(format!("container {id} removed"))
                }
            }
        })
    }

    fn list<'a>(&'a self, fleet: &'a str) -> BoxFuture<'a, Result<Vec<Found>>> {
        Box::pin(async move {
            let containers = self.docker.list_managed(fleet).await?;
            Ok(containers
                .into_iter()
                .map(|c| Found {
                    node: c.node().map(str::to_string),
                    logical_id: c.logical_id(),
                    command: c.command().map(str::to_string),
                    reference: ProviderRef { container_id: Some(c.id.clone()), ..Default::default() },
                    running: c.running,
                    state: c.status.clone(),
                })
                .collect())
        })
    }

    fn lifetime(&self) -> Lifetime {
        Lifetime::Detached
    }
}
