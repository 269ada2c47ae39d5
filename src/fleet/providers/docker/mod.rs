//! The `docker` provider's client: node containers on a Docker Engine, through
//! `bollard`. It owns the mapping from a fleet node to one container and the safety
//! rules around it; wiring it into the fleet executor is not its job.
//!
//! - **Labels are the record on the engine.** Every container carries the fleet label
//!   (the daemon's stable identity fingerprint), the run id, the node name, its logical
//!   id and the command that created it ([`node_labels`]). Listing by the fleet label is
//!   how a restarted daemon finds what to adopt and what is an orphan, and why two
//!   daemons sharing one engine never see each other's containers.
//! - **Deterministic names instead of idempotency keys.** A node's container is named
//!   `hive-<fleet-short>-<node>` ([`container_name`]), so a repeated create hits a name
//!   conflict (409) instead of making a second container. The existing container is
//!   adopted only when its labels say it is the same fleet, node and command; anything
//!   else is an error, never a silent takeover.
//! - **Gone is success.** Destroying a container that no longer exists (404 on stop or
//!   remove) is `Ok`: the wanted outcome already holds.
//!
//! `provider.rs` wires it into the fleet as a [`crate::fleet::providers::Provider`].

mod mapping;
pub mod provider;
#[cfg(test)]
mod tests;

pub use mapping::*;

use std::collections::HashMap;
use std::net::IpAddr;
use std::time::Duration;

use bollard::models::{
    ContainerCreateBody, EndpointSettings, HostConfig, NetworkCreateRequest, NetworkingConfig, RestartPolicy,
    RestartPolicyNameEnum,
};
use bollard::query_parameters::{
    CreateContainerOptionsBuilder, InspectContainerOptions, InspectNetworkOptions,
    ListContainersOptionsBuilder, LogsOptionsBuilder, RemoveContainerOptionsBuilder, StartContainerOptions,
    StopContainerOptionsBuilder,
};
use bollard::Docker;
use futures_util::StreamExt as _;

/// The engine address used when neither the Provider nor `DOCKER_HOST` names one.
pub const DEFAULT_HOST: &str = "unix:///var/run/docker.sock";
/// How long one request to the engine may take.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);
/// Seconds a stopping container gets between SIGTERM and SIGKILL.
pub const STOP_TIMEOUT_SECS: i32 = 10;

/// A client of one Docker Engine, holding the fleet's node containers.
#[derive(Clone, Debug)]
pub struct DockerNodes {
    docker: Docker,
    host: String,
}

/// What is needed to create one node's container.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeRequest {
    /// The fleet label: the daemon's stable identity fingerprint.
    pub fleet: String,
    /// The daemon run that creates the container.
    pub run_id: String,
    /// The node name, e.g. `node-3`.
    pub node: String,
    /// The node's logical id (monotonic, never reused).
    pub logical_id: u64,
    /// The id of the FleetCommand that asked for the node.
    pub command: String,
    /// The image to run.
    pub image: String,
    /// The container's whole command line: its first word replaces the image's
    /// ENTRYPOINT and the rest its CMD, so an image with an entrypoint of its own (the
    /// daemon's, `hive serve`) runs the worker all the same.
    pub cmd: Vec<String>,
    /// Environment variables of the container.
    pub env: Vec<(String, String)>,
    /// The network to attach the container to; `None` is the engine's default bridge.
    pub network: Option<String>,
    /// GPUs as `docker run --gpus` takes them: `all`, a count, or `device=0,1`.
    pub gpus: Option<String>,
    /// Keep the container's stdin open (and never attached), so a process that ends at
    /// stdin EOF keeps running. Needed by `hive fleet-worker` until it has a mode without
    /// stdin supervision.
    pub keep_stdin_open: bool,
}

/// A private bridge network and the address its containers reach the host at.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NetworkInfo {
    /// The network's name.
    pub name: String,
    /// The bridge's gateway: the host as the containers on the network see it.
    pub gateway: Option<IpAddr>,
}

/// A container as the engine reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Observed {
    /// The container id.
    pub id: String,
    /// The container name, without the engine's leading `/`.
    pub name: String,
    /// The engine's state: `created`, `running`, `paused`, `restarting`, `removing`,
    /// `exited` or `dead`.
    pub status: String,
    /// Whether it is running.
    pub running: bool,
    /// Its address on the node's network (the network it was created on).
    pub ip: Option<IpAddr>,
    /// Its labels.
    pub labels: HashMap<String, String>,
}

impl Observed {
    /// The node name its labels record.
    pub fn node(&self) -> Option<&str> {
        self.labels.get(LABEL_NODE).map(String::as_str)
    }

    /// The logical id its labels record.
    pub fn logical_id(&self) -> Option<u64> {
        self.labels.get(LABEL_LOGICAL_ID).and_then(|v| v.parse().ok())
    }

    /// The command id its labels record.
    pub fn command(&self) -> Option<&str> {
        self.labels.get(LABEL_COMMAND).map(String::as_str)
    }
}

/// Errors of the Docker client. Each names the operation and, where there is one, the
/// node or container.
#[derive(Debug, thiserror::Error)]
pub enum DockerError {
    /// The engine address is not usable by this build (a scheme it cannot speak, an
    /// empty address).
    #[error("Docker Engine address {host:?}: {detail}")]
    Address {
        /// The address given.
        host: String,
        /// What is wrong with it.
        detail: String,
    },
    /// The image of a node does not exist on the engine (create answered 404).
    #[error("creating container for {node}: image {image:?} not found (pull or build it first)")]
    ImageNotFound {
        /// The node.
        node: String,
        /// The image asked for.
        image: String,
    },
    /// A container with the node's deterministic name exists but is not this node of
    /// this fleet and command, so it was not adopted.
    #[error(
        "creating container for {node}: a container named {name} already exists and is {found}; \
         it was not adopted (remove it, or check for a second daemon with the same identity)"
    )]
    NameTaken {
        /// The node.
        node: String,
        /// The container name.
        name: String,
        /// Whose it is, from its labels.
        found: String,
    },
    /// A request was invalid before anything was sent (e.g. a malformed `gpus`).
    #[error("{what}: {detail}")]
    Invalid {
        /// The operation.
        what: String,
        /// What is wrong.
        detail: String,
    },
    /// The engine answered an error.
    #[error("{what}: {message} (HTTP {status})")]
    Engine {
        /// The operation, e.g. `starting container 3f2a… for node-3`.
        what: String,
        /// The HTTP status.
        status: u16,
        /// What the engine said.
        message: String,
    },
    /// The engine could not be reached or answered something unreadable. The text holds
    /// the client error's whole chain of causes (e.g. `Connection refused`), since it is
    /// what a Provider's `ConfigurationError` condition shows.
    #[error("{what}: {}", causes(error))]
    Transport {
        /// The operation.
        what: String,
        /// The client's error.
        error: bollard::errors::Error,
    },
}

impl DockerError {
    /// The HTTP status the engine answered, if it answered one.
    pub fn status(&self) -> Option<u16> {
        match self {
            DockerError::Engine { status, .. } => Some(*status),
            DockerError::ImageNotFound { .. } => Some(404),
            DockerError::NameTaken { .. } => Some(409),
            _ => None,
        }
    }
}

type Result<T, E = DockerError> = std::result::Result<T, E>;

impl DockerNodes {
    /// Connects to the engine at `host` (`unix://PATH` or a bare socket path; `None`
    /// means `DOCKER_HOST`, else [`DEFAULT_HOST`]) and negotiates the API version, so the
    /// engine must be up. `tcp://` and `http://` need bollard's `http` feature, which
    /// this build does not enable: they are an [`DockerError::Address`] error.
    pub async fn connect(host: Option<&str>) -> Result<DockerNodes> {
        let env = crate::host::env::var("DOCKER_HOST");
        let endpoint = engine_endpoint(host, env.as_deref())?;
        let docker = match &endpoint {
            Endpoint::Unix(path) => {
                Docker::connect_with_unix(path, REQUEST_TIMEOUT.as_secs(), bollard::API_DEFAULT_VERSION)
            }
            Endpoint::Http(url) => Docker::connect_with_host(url),
        };
        let host = endpoint.to_string();
        let docker = docker.map_err(|e| match e {
            bollard::errors::Error::UnsupportedURISchemeError { .. } => DockerError::Address {
                host: host.clone(),
                detail: "this build speaks only unix:// to the engine (bollard's `http` feature is off)"
                    .into(),
            },
            e => transport(format!("connecting to the Docker Engine at {host}"))(e),
        })?;
        let docker = docker
            .with_timeout(REQUEST_TIMEOUT)
            .negotiate_version()
            .await
            .map_err(engine(format!("negotiating the API version with the Docker Engine at {host}")))?;
        Ok(DockerNodes { docker, host })
    }

    /// The engine address this client talks to.
    pub fn host(&self) -> &str {
        &self.host
    }

    /// The underlying bollard client, for what this type does not cover.
    pub fn engine(&self) -> &Docker {
        &self.docker
    }

    /// Checks that the engine answers. The error's text is what a Provider's
    /// `ConfigurationError` condition should say.
    pub async fn ping(&self) -> Result<()> {
        self.docker.ping().await.map_err(engine(format!("pinging the Docker Engine at {}", self.host)))?;
        Ok(())
    }

    /// Creates the bridge network `name` unless it exists, and returns its gateway.
    pub async fn ensure_network(&self, name: &str) -> Result<NetworkInfo> {
        let what = || format!("creating network {name}");
        match self.network(name).await? {
            Some(info) => return Ok(info),
            None => {
                let request = NetworkCreateRequest {
                    name: name.to_string(),
                    driver: Some("bridge".into()),
                    attachable: Some(true),
                    labels: Some(HashMap::from([(LABEL_MANAGED.to_string(), "true".to_string())])),
                    ..Default::default()
                };
                match self.docker.create_network(request).await {
                    Ok(_) => {}
                    // Created meanwhile by someone else: the network exists, which is the point.
                    Err(e) if status_of(&e) == Some(409) => {}
                    Err(e) => return Err(engine(what())(e)),
                }
            }
        }
        self.network(name).await?.ok_or_else(|| DockerError::Engine {
            what: what(),
            status: 404,
            message: "the network vanished right after it was created".into(),
        })
    }

    /// The network `name` and its gateway; `None` if it does not exist.
    pub async fn network(&self, name: &str) -> Result<Option<NetworkInfo>> {
        match self.docker.inspect_network(name, None::<InspectNetworkOptions>).await {
            Ok(net) => {
                let gateway = net
                    .ipam
                    .and_then(|ipam| ipam.config)
                    .unwrap_or_default()
                    .iter()
                    .filter_map(|c| c.gateway.as_deref().and_then(parse_ip))
                    .min_by_key(|ip| ip.is_ipv6());
                Ok(Some(NetworkInfo { name: net.name.unwrap_or_else(|| name.to_string()), gateway }))
            }
            Err(e) if status_of(&e) == Some(404) => Ok(None),
            Err(e) => Err(engine(format!("inspecting network {name}"))(e)),
        }
    }

    /// Removes the network `name`; one that does not exist is already removed.
    pub async fn remove_network(&self, name: &str) -> Result<()> {
        match self.docker.remove_network(name).await {
            Ok(()) => Ok(()),
            Err(e) if status_of(&e) == Some(404) => Ok(()),
            Err(e) => Err(engine(format!("removing network {name}"))(e)),
        }
    }

    /// Creates and starts the container of `req.node`, returning its id. A container of
    /// the same name that is this node (same fleet, node and command) is adopted and
    /// started if needed; one that is not is [`DockerError::NameTaken`]. A container this
    /// call created but could not start is removed again.
    pub async fn create_node(&self, req: &NodeRequest) -> Result<String> {
        let name = container_name(&req.fleet, &req.node);
        let body = create_body(req)?;
        let options = CreateContainerOptionsBuilder::default().name(&name).build();
        let (id, created) = match self.docker.create_container(Some(options), body).await {
            Ok(response) => (response.id, true),
            Err(e) => match status_of(&e) {
                Some(404) => {
                    return Err(DockerError::ImageNotFound {
                        node: req.node.clone(),
                        image: req.image.clone(),
                    })
                }
                Some(409) => (self.adopt(req, &name).await?, false),
                _ => return Err(engine(format!("creating container for {}", req.node))(e)),
            },
        };
        if let Err(e) = self.docker.start_container(&id, None::<StartContainerOptions>).await {
            let err = engine(format!("starting container {} for {}", short(&id), req.node))(e);
            if created {
                // Leave nothing half-made behind: a retry creates the container afresh.
                if let Err(cleanup) = self.destroy(&id).await {
                    tracing::warn!(node = %req.node, error = %cleanup, "removing a container that did not start");
                }
            }
            return Err(err);
        }
        Ok(id)
    }

    /// The id of the existing container `name`, if its labels say it is `req`'s node.
    async fn adopt(&self, req: &NodeRequest, name: &str) -> Result<String> {
        let what = || format!("creating container for {}: inspecting the existing {name}", req.node);
        let existing = self
            .docker
            .inspect_container(name, None::<InspectContainerOptions>)
            .await
            .map_err(engine(what()))?;
        let labels = existing.config.and_then(|c| c.labels).unwrap_or_default();
        if let Some(found) = foreign(&labels, req) {
            return Err(DockerError::NameTaken { node: req.node.clone(), name: name.to_string(), found });
        }
        existing.id.ok_or_else(|| DockerError::Engine {
            what: what(),
            status: 200,
            message: "the engine reported no container id".into(),
        })
    }

    /// The container `id` (or name); `None` if it does not exist.
    pub async fn inspect(&self, id: &str) -> Result<Option<Observed>> {
        let c = match self.docker.inspect_container(id, None::<InspectContainerOptions>).await {
            Ok(c) => c,
            Err(e) if status_of(&e) == Some(404) => return Ok(None),
            Err(e) => return Err(engine(format!("inspecting container {}", short(id)))(e)),
        };
        let state = c.state.unwrap_or_default();
        let network_mode = c.host_config.and_then(|h| h.network_mode);
        let networks = c.network_settings.and_then(|n| n.networks);
        Ok(Some(Observed {
            id: c.id.unwrap_or_else(|| id.to_string()),
            name: c.name.unwrap_or_default().trim_start_matches('/').to_string(),
            status: state.status.map(|s| s.to_string()).unwrap_or_default(),
            running: state.running.unwrap_or(false),
            ip: node_ip(network_mode.as_deref(), networks.as_ref()),
            labels: c.config.and_then(|c| c.labels).unwrap_or_default(),
        }))
    }

    /// Stops (SIGTERM, then SIGKILL after [`STOP_TIMEOUT_SECS`]) and removes the
    /// container `id` with its anonymous volumes. A container that is already gone is
    /// `Ok`.
    pub async fn destroy(&self, id: &str) -> Result<()> {
        let stop = StopContainerOptionsBuilder::default().t(STOP_TIMEOUT_SECS).build();
        match self.docker.stop_container(id, Some(stop)).await {
            Ok(()) => {}
            Err(e) if status_of(&e) == Some(404) => return Ok(()),
            Err(e) => return Err(engine(format!("stopping container {}", short(id)))(e)),
        }
        let remove = RemoveContainerOptionsBuilder::default().force(true).v(true).build();
        match self.docker.remove_container(id, Some(remove)).await {
            Ok(()) => Ok(()),
            Err(e) if status_of(&e) == Some(404) => Ok(()),
            Err(e) => Err(engine(format!("removing container {}", short(id)))(e)),
        }
    }

    /// Every container (running or not) carrying the fleet label `fleet`.
    pub async fn list_managed(&self, fleet: &str) -> Result<Vec<Observed>> {
        let filters = HashMap::from([("label", vec![format!("{LABEL_FLEET}={fleet}")])]);
        let options = ListContainersOptionsBuilder::default().all(true).filters(&filters).build();
        let list = self
            .docker
            .list_containers(Some(options))
            .await
            .map_err(engine(format!("listing the containers of fleet {fleet}")))?;
        Ok(list
            .into_iter()
            .map(|c| {
                let network_mode = c.host_config.and_then(|h| h.network_mode);
                let networks = c.network_settings.and_then(|n| n.networks);
                let status = c.state.map(|s| s.to_string()).unwrap_or_default();
                Observed {
                    id: c.id.unwrap_or_default(),
                    name: c
                        .names
                        .and_then(|n| n.into_iter().next())
                        .unwrap_or_default()
                        .trim_start_matches('/')
                        .to_string(),
                    running: status == "running",
                    status,
                    ip: node_ip(network_mode.as_deref(), networks.as_ref()),
                    labels: c.labels.unwrap_or_default(),
                }
            })
            .collect())
    }

    /// What the container `id` wrote to stdout and stderr so far (the last `tail` lines,
    /// or all).
    pub async fn logs(&self, id: &str, tail: Option<usize>) -> Result<String> {
        let tail = tail.map_or_else(|| "all".to_string(), |n| n.to_string());
        let options = LogsOptionsBuilder::default().stdout(true).stderr(true).tail(&tail).build();
        let mut stream = self.docker.logs(id, Some(options));
        let mut text = String::new();
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(engine(format!("reading the logs of container {}", short(id))))?;
            text.push_str(&String::from_utf8_lossy(chunk.as_ref()));
        }
        Ok(text)
    }
}

/// The create request of `req`'s container.
pub fn create_body(req: &NodeRequest) -> Result<ContainerCreateBody> {
    let device_requests = match &req.gpus {
        Some(gpus) => Some(vec![gpu_request(gpus).map_err(|detail| DockerError::Invalid {
            what: format!("creating container for {}", req.node),
            detail,
        })?]),
        None => None,
    };
    let networking_config = req.network.as_ref().map(|net| NetworkingConfig {
        endpoints_config: Some(HashMap::from([(net.clone(), EndpointSettings::default())])),
    });
    Ok(ContainerCreateBody {
        image: Some(req.image.clone()),
        entrypoint: req.cmd.first().map(|program| vec![program.clone()]),
        cmd: Some(req.cmd.iter().skip(1).cloned().collect()),
        env: Some(req.env.iter().map(|(k, v)| format!("{k}={v}")).collect()),
        labels: Some(node_labels(req)),
        tty: Some(false),
        open_stdin: Some(req.keep_stdin_open),
        stdin_once: Some(false),
        attach_stdin: Some(false),
        host_config: Some(HostConfig {
            init: Some(true),
            restart_policy: Some(RestartPolicy {
                name: Some(RestartPolicyNameEnum::NO),
                maximum_retry_count: None,
            }),
            network_mode: req.network.clone(),
            device_requests,
            ..Default::default()
        }),
        networking_config,
        ..Default::default()
    })
}

/// Maps a bollard error of the operation `what` to a [`DockerError`].
fn engine(what: String) -> impl FnOnce(bollard::errors::Error) -> DockerError {
    move |e| match e {
        bollard::errors::Error::DockerResponseServerError { status_code, message } => {
            DockerError::Engine { what, status: status_code, message: message.trim().to_string() }
        }
        e => DockerError::Transport { what, error: e },
    }
}

fn transport(what: String) -> impl FnOnce(bollard::errors::Error) -> DockerError {
    move |error| DockerError::Transport { what, error }
}

/// `error: cause: cause…`, without repeating a cause its parent already quotes.
fn causes(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut next = error.source();
    while let Some(cause) = next {
        let part = cause.to_string();
        if !text.contains(&part) {
            text.push_str(": ");
            text.push_str(&part);
        }
        next = cause.source();
    }
    text
}

/// The HTTP status of an engine error response.
fn status_of(e: &bollard::errors::Error) -> Option<u16> {
    match e {
        bollard::errors::Error::DockerResponseServerError { status_code, .. } => Some(*status_code),
        _ => None,
    }
}

/// A container id shortened as `docker ps` shows it.
fn short(id: &str) -> &str {
    id.get(..12).unwrap_or(id)
}
