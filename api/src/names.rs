//! The well-known names hive writes into objects' metadata: annotations the server owns,
//! labels the fleet sets, and finalizers. One place, so every writer and reader agrees.

/// Annotation holding the token name that decided an approval (server-set).
pub const DECIDED_BY: &str = "hive.dev/decided-by";
/// Annotation holding when an approval was decided, RFC 3339 (server-set).
pub const DECIDED_AT: &str = "hive.dev/decided-at";
/// Annotation on a Node naming the Kill command that stopped it.
pub const KILLED_BY: &str = "hive.dev/killed-by";
/// Label on a Node naming the Provision command that created it.
pub const FLEET_COMMAND_LABEL: &str = "hive.dev/fleet-command";
/// Label on a Node recovery found at a provider without a record (left untouched).
pub const ORPHAN_LABEL: &str = "hive.dev/orphan";
/// The finalizer that makes an Agent's delete wait until it is stopped and removed.
pub const AGENT_FINALIZER: &str = "hive.dev/agent-runtime";
/// Annotation on an Agent created by a Spawn approval, naming the approval.
pub const APPROVAL: &str = "hive.dev/approval";
/// Annotation on a Job the submit layer stored together with its agents' intent
/// (`spec.wanted`): its claim writes no intent again, so a client's write between the
/// submit and the claim stands.
pub const INTENT_WRITTEN: &str = "hive.dev/intent-written";
