//! The one integration test binary: starts the real `hive` daemon and drives it with
//! the REST API, stock kubectl and the hive CLI.

// The suite is an outside client, not hive: it reads its own switches
// (`HIVE_DOCKER_TESTS`, `CARGO_TARGET_DIR` …) and wall time directly. clippy.toml's blessed
// paths bind the daemon and the CLI.
#![allow(clippy::disallowed_methods)]

mod agent_contract;
mod agent_logs;
mod agents;
mod api;
mod approvals;
mod architecture;
mod audit;
mod auth;
mod bench;
mod browser;
mod cli;
mod cli_habits;
mod contract;
mod contract_model;
mod crash;
mod cut_fs;
mod deploy;
mod deploy_paths;
mod fault_agents;
mod fault_connections;
mod fault_inputs;
mod fault_power;
mod fault_provider_keys;
mod fault_schemathesis;
mod fault_store;
mod fleet;
mod fleet_docker;
mod fleet_docker_daemon;
mod fleet_intake;
mod fleet_myelin;
mod fleet_vastai;
mod generated;
mod go_clients;
mod ha;
mod ha_docker;
mod ha_fleet;
mod ha_meta;
mod ha_sessions;
mod harness;
mod heap;
mod http2;
mod intake;
mod job_features;
mod jobs;
mod kubectl;
mod linearizable;
mod manifests;
mod mcp;
mod metrics;
mod placement;
mod placement_surfaces;
mod placement_survival;
mod power;
mod pty;
mod quotas;
mod readme;
mod stream_limits;
mod top;
mod vastai;
mod why_failing;
