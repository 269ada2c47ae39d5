//! A POSTed Job, decided: a body without nodes is a template Job, checked field by field
//! and handed to the submit layer as a [`Request`], which writes the intent and the Job
//! in one transaction; a body with its nodes is a custom DAG, admitted like any Job and
//! stored as it is. Either way the stored Job is then taken by the intake's one `take`,
//! and the answer is the claimed Job. The server parses the body and its query; this
//! decides, so whatever answers a POST (this process, or one day the leader it reaches)
//! decides the same way.

use hive_api::{Duplicates, FieldValidation, Job};
use serde_json::Value;

use super::engine::Engine;
use super::error::{Error, Result};
use crate::client::{self, Api};
use crate::store;
use crate::submit::Request;

/// A POSTed Job, as the server parsed it.
#[derive(Clone, Debug)]
pub struct PostedJob {
    /// The body (named from `metadata.generateName` already, when it asks for that).
    pub object: Value,
    /// The keys the body gave twice.
    pub duplicates: Duplicates,
    /// `fieldValidation`.
    pub validation: FieldValidation,
    /// `dryRun`: store nothing, answer what would be stored (a custom DAG only).
    pub dry_run: bool,
    /// The names to try next, in order, when the body's generated name is taken; empty
    /// when the body named the Job itself.
    pub renames: Vec<String>,
}

/// The answer to a [`PostedJob`].
#[derive(Clone, Debug)]
pub struct Posted {
    /// The Job as the intake claimed it (as it would be stored, for a dry run).
    pub job: Job,
    /// The admission warnings to send with it.
    pub warnings: Vec<String>,
}

/// What a POSTed body is.
#[derive(Debug)]
pub enum Decision {
    /// A template Job: the submit layer expands it.
    Template(Request),
    /// A custom DAG, admitted, with its status cleared: stored as it is.
    Dag(Box<Job>),
}

fn invalid(name: &str, field: &str, message: impl Into<String>) -> Error {
    Error::Invalid {
        name: name.into(),
        errors: vec![hive_api::validation::ValidationError::new(
            field,
            hive_api::validation::Reason::Invalid,
            message,
        )],
    }
}

/// Decides what `posted` is (see the module documentation), with the warnings its body
/// earns. Writes nothing.
pub fn decide(posted: &PostedJob) -> Result<(Decision, Vec<String>)> {
    let value = &posted.object;
    let has_nodes = value.pointer("/spec/nodes").and_then(Value::as_array).is_some_and(|n| !n.is_empty());
    if has_nodes {
        let admitted = hive_api::admit_body(
            &hive_api::KindInfo::of::<Job>(),
            value.clone(),
            &posted.duplicates,
            posted.validation,
        )?;
        let mut job: Job = crate::client::decode_value(&admitted.object)?;
        job.status = Default::default();
        return Ok((Decision::Dag(Box::new(job)), admitted.warnings));
    }
    if posted.dry_run {
        return Err(Error::BadRequest("dryRun is not supported for template Jobs".into()));
    }
    // One typed decode names every malformed or unknown field, as for any Job.
    let (job, unknown) = hive_api::resource::decode::<Job>(value).map_err(|e| {
        let field = if e.field.is_empty() { "spec".to_string() } else { e.field };
        invalid("", &field, e.message)
    })?;
    let strict = posted.validation == FieldValidation::Strict;
    if strict && (!unknown.is_empty() || !posted.duplicates.is_empty()) {
        return Err(hive_api::AdmitError::Strict {
            kind: "Job",
            duplicates: posted.duplicates.clone(),
            fields: unknown,
        }
        .into());
    }
    let warnings =
        if posted.validation == FieldValidation::Warn { posted.duplicates.warnings() } else { Vec::new() };
    let scheduling = job.spec.scheduling();
    let (template, agents, source, reason) =
        (job.spec.template, job.spec.agents, job.spec.source, job.spec.reason);
    let name = Some(job.metadata.name).filter(|n| !n.is_empty());
    if let Some(name) = &name {
        if let Err(why) = hive_api::validation::dns1123_label(name) {
            return Err(invalid(name, "metadata.name", format!("{name:?}: {why}")));
        }
    }
    Ok((Decision::Template(Request { template, agents, source, reason, name, scheduling }), warnings))
}

/// Decides `posted`, stores it (under the next of its `renames` while its name is taken)
/// and takes it.
pub async fn post(engine: &Engine, posted: PostedJob) -> Result<Posted> {
    let (decision, warnings) = decide(&posted)?;
    let mut renames = posted.renames.into_iter();
    let job = match decision {
        Decision::Template(mut request) => loop {
            match engine.submit_request(&request).await.map_err(Error::from) {
                Err(Error::AlreadyExists { .. }) if renames.len() > 0 => request.name = renames.next(),
                submitted => break submitted?,
            }
        },
        Decision::Dag(job) => {
            let mut job = *job;
            let jobs = Api::<Job>::new(&engine.store);
            let stored = loop {
                match jobs.create_opts(&job, posted.dry_run).await {
                    Err(client::Error::Store(store::Error::AlreadyExists { .. })) if renames.len() > 0 => {
                        job.metadata.name = renames.next().unwrap_or_default();
                    }
                    stored => break stored.map_err(Error::from)?,
                }
            };
            if posted.dry_run {
                stored
            } else {
                engine.take(&stored.metadata.name).await?
            }
        }
    };
    Ok(Posted { job, warnings })
}
