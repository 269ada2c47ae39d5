//! The typed client inside the daemon, the way kube's `Api<K>` works: `get`, `list`,
//! `watch`, `create`, `replace`, `patch`, `patch_status` and `delete` of one kind `K`
//! over the local store. Every write is admitted exactly as an HTTP write is — the
//! kind's validation, and for a change of the main resource its update rules — so no
//! writer inside the daemon can store what the API would refuse. Read-modify-write
//! calls re-read and re-apply their change when a concurrent write wins the race.
//!
//! Architecture Invariant: every in-daemon reader and writer of a kind goes through
//! [`Api`]; nothing outside the server's patch machinery edits an object's JSON by hand.

pub mod events;
mod watch;

use std::marker::PhantomData;

use hive_api::resource::{validate, HasStatus};
use hive_api::validation::{summary, ValidationError};
use hive_api::{Object, Resource};
use serde_json::Value;

use crate::store::{self, Mutation, Obj, Outcome, Store, Subresource};

/// How many times a read-modify-write is re-read and re-applied after losing a race.
/// Each group commit lets one of N racing writers of one object through.
const RETRIES: usize = 8;

/// Why a typed read or write failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The object does not exist (any more).
    #[error("{kind}.hive.dev \"{name}\" not found")]
    NotFound {
        /// Plural resource name.
        kind: &'static str,
        /// Object name.
        name: String,
    },
    /// The write would store what the kind's validation refuses; nothing was written.
    #[error("{kind} \"{name}\" is invalid: {}", summary(.errors))]
    Invalid {
        /// Kind name, e.g. `Agent`.
        kind: &'static str,
        /// Object name.
        name: String,
        /// Every problem, each naming its field.
        errors: Vec<ValidationError>,
    },
    /// A stored object does not decode as its kind (written by an older version, say).
    #[error("stored {kind} {name:?} does not decode: {source}")]
    Decode {
        /// Kind name.
        kind: &'static str,
        /// Object name.
        name: String,
        /// What serde found wrong.
        #[source]
        source: serde_json::Error,
    },
    /// Every attempt of a read-modify-write lost a race with another writer.
    #[error("{kind}.hive.dev \"{name}\" kept changing: {RETRIES} writes in a row lost a race")]
    Contended {
        /// Plural resource name.
        kind: &'static str,
        /// Object name.
        name: String,
    },
    /// The store refused or failed the write.
    #[error(transparent)]
    Store(#[from] store::Error),
}

impl Error {
    /// True when the object is missing.
    pub fn is_not_found(&self) -> bool {
        matches!(self, Error::NotFound { .. } | Error::Store(store::Error::NotFound { .. }))
    }

    /// True when the store is shut down: the daemon is stopping, and a part still winding
    /// down (crash-watch seeing its agents stop, say) has nothing to warn about.
    pub fn is_shut_down(&self) -> bool {
        matches!(self, Error::Store(store::Error::Closed))
    }
}

/// A typed client result.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What a read-modify-write did.
#[derive(Clone, Debug, PartialEq)]
pub enum Patched<K> {
    /// The object was changed and stored; this is the stored object.
    Stored(K),
    /// The change left the object as it was; nothing was written.
    Unchanged(K),
}

impl<K> Patched<K> {
    /// The object after the call, whether or not it was written.
    pub fn into_inner(self) -> K {
        match self {
            Patched::Stored(k) | Patched::Unchanged(k) => k,
        }
    }

    /// True when a write happened.
    pub fn stored(&self) -> bool {
        matches!(self, Patched::Stored(_))
    }
}

/// A typed client of kind `K` over a [`Store`]. Cheap to clone.
pub struct Api<K> {
    store: Store,
    kind: PhantomData<fn() -> K>,
}

impl<K> Clone for Api<K> {
    fn clone(&self) -> Self {
        Api { store: self.store.clone(), kind: PhantomData }
    }
}

/// Decodes an object as `K`.
pub fn decode_value<K: Object>(object: &Value) -> Result<K> {
    K::deserialize(object).map_err(|source| Error::Decode {
        kind: K::KIND,
        name: hive_api::meta::name_of(object).to_string(),
        source,
    })
}

/// Decodes a stored object as `K`.
pub fn decode<K: Object>(object: &Obj) -> Result<K> {
    object.decode::<K>().map_err(|source| Error::Decode {
        kind: K::KIND,
        name: hive_api::meta::name_of(&object.value()).to_string(),
        source,
    })
}

impl<K: Resource> Api<K> {
    /// A client of `K` over `store`.
    pub fn new(store: &Store) -> Self {
        Api { store: store.clone(), kind: PhantomData }
    }

    /// The store behind this client.
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// The object called `name`, if it exists.
    pub fn get(&self, name: &str) -> Result<Option<K>> {
        self.store.get(K::PLURAL, name).map(|o| decode(&o)).transpose()
    }

    /// The object called `name`; a missing one is [`Error::NotFound`].
    pub fn get_existing(&self, name: &str) -> Result<K> {
        self.get(name)?.ok_or_else(|| Error::NotFound { kind: K::PLURAL, name: name.to_string() })
    }

    /// The names of every object of the kind, sorted, without decoding any.
    pub fn names(&self) -> Vec<std::sync::Arc<str>> {
        self.store.list_after(K::PLURAL, None).1.into_iter().map(|(name, _)| name).collect()
    }

    /// The stored JSON of `name`, as the API serves it (for the event recorder, which
    /// refers to any kind's object).
    pub fn get_raw(&self, name: &str) -> Option<Obj> {
        self.store.get(K::PLURAL, name)
    }

    /// Every object of the kind with the revision the list was read at. An object that
    /// does not decode is skipped with a warning, so one bad record does not blind a
    /// controller to every other.
    pub fn list(&self) -> (u64, Vec<K>) {
        let (revision, objects) = self.store.list(K::PLURAL);
        let items = objects
            .iter()
            .filter_map(|o| match decode::<K>(o) {
                Ok(k) => Some(k),
                Err(err) => {
                    tracing::warn!(error = %err, "skipping an object that does not decode");
                    None
                }
            })
            .collect();
        (revision, items)
    }

    /// The mutation that creates `object`, admitted as an HTTP create is; for writes that
    /// must commit together with others ([`Store::commit_all`]).
    pub fn create_mutation(&self, object: &K) -> Result<Mutation> {
        Ok(Mutation::Create { kind: K::PLURAL, object: admitted(object)? })
    }

    /// The mutation that replaces the main resource of `old` with `new` (spec and
    /// user-owned metadata; `status` is kept), admitted as an HTTP update is: the kind's
    /// validation and its update rules. `new`'s `resourceVersion`, when set, is a
    /// precondition.
    pub fn replace_mutation(&self, new: &K, old: &K) -> Result<Mutation> {
        let mut errors = hive_api::validation::Errors::default();
        new.validate_update(old, &mut errors);
        if !errors.0.is_empty() {
            return Err(invalid(new, errors.0));
        }
        Ok(Mutation::Update { kind: K::PLURAL, object: admitted(new)?, subresource: Subresource::Main })
    }

    /// Creates `object`; returns it as stored.
    pub async fn create(&self, object: &K) -> Result<K> {
        self.create_opts(object, false).await
    }

    /// [`Api::create`], or with `dry_run` what it would store, writing nothing.
    pub async fn create_opts(&self, object: &K, dry_run: bool) -> Result<K> {
        let mutation = self.create_mutation(object)?;
        self.commit(mutation, dry_run).await
    }

    /// Replaces the main resource of `object` (its `resourceVersion`, when set, must be
    /// current); returns it as stored.
    pub async fn replace(&self, object: &K) -> Result<K> {
        let old = self.get_existing(&object.metadata().name)?;
        let mutation = self.replace_mutation(object, &old)?;
        self.commit(mutation, false).await
    }

    /// Deletes `name` (or marks it for deletion while finalizers remain). Returns its last
    /// state, or `None` when it did not exist.
    pub async fn delete(&self, name: &str) -> Result<Option<K>> {
        let mutation =
            Mutation::Delete { kind: K::PLURAL, name: name.to_string(), uid: None, resource_version: None };
        match self.store.commit(mutation, false).await {
            Ok(outcome) => Ok(Some(decode(outcome.object())?)),
            Err(store::Error::NotFound { .. }) => Ok(None),
            Err(err) => Err(err.into()),
        }
    }

    /// Deletes exactly this version of `object` (its uid and resourceVersion are
    /// preconditions). Returns false when it is gone or changed meanwhile.
    pub async fn delete_version(&self, object: &K) -> Result<bool> {
        self.delete_exact(object.metadata()).await
    }

    /// [`Api::delete_version`] of the object `meta` describes: its name, with its uid and
    /// resourceVersion as preconditions (for a caller that kept only those).
    pub async fn delete_exact(&self, meta: &hive_api::ObjectMeta) -> Result<bool> {
        let mutation = Mutation::Delete {
            kind: K::PLURAL,
            name: meta.name.clone(),
            uid: meta.uid.clone(),
            resource_version: meta.resource_version.clone(),
        };
        match self.store.commit(mutation, false).await {
            Ok(_) => Ok(true),
            Err(store::Error::NotFound { .. } | store::Error::Conflict { .. }) => Ok(false),
            Err(err) => Err(err.into()),
        }
    }

    /// Applies `change` to the object's spec and metadata (its `status` is not written),
    /// re-reading and re-applying on a lost race. `change` may run several times, each
    /// time on a fresh copy. A change that leaves the object as it was writes nothing.
    pub async fn patch(&self, name: &str, mut change: impl FnMut(&mut K)) -> Result<Patched<K>> {
        for _ in 0..RETRIES {
            let current = self.get_existing(name)?;
            let mut object = current.clone();
            change(&mut object);
            if object == current {
                return Ok(Patched::Unchanged(current));
            }
            let mutation = self.replace_mutation(&object, &current)?;
            match self.commit(mutation, false).await {
                Ok(stored) => return Ok(Patched::Stored(stored)),
                Err(Error::Store(store::Error::Conflict { .. })) => continue,
                Err(err) => return Err(missing::<K>(err, name)),
            }
        }
        Err(Error::Contended { kind: K::PLURAL, name: name.to_string() })
    }

    /// Commits one admitted mutation and decodes what was stored.
    async fn commit(&self, mutation: Mutation, dry_run: bool) -> Result<K> {
        let name = match &mutation {
            Mutation::Create { object, .. } | Mutation::Update { object, .. } => {
                hive_api::meta::name_of(object).to_string()
            }
            Mutation::Delete { name, .. } => name.clone(),
        };
        let outcome =
            self.store.commit(mutation, dry_run).await.map_err(|e| missing::<K>(e.into(), &name))?;
        match outcome {
            Outcome::Created(o)
            | Outcome::Updated(o)
            | Outcome::Unchanged(o)
            | Outcome::Deleting(o)
            | Outcome::Deleted(o) => decode(&o),
        }
    }
}

impl<K: Resource + HasStatus> Api<K> {
    /// The mutation that writes `object`'s status through `/status`, validated as an
    /// HTTP status write is. Its `resourceVersion`, when set, is a precondition: a
    /// compare-and-swap that fails with a store `Conflict` if anyone wrote the object
    /// since it was read.
    pub fn status_mutation(&self, object: &K) -> Result<Mutation> {
        let mut object = object.clone();
        object.derive_status();
        Ok(Mutation::Update { kind: K::PLURAL, object: admitted(&object)?, subresource: Subresource::Status })
    }

    /// Applies `change` to the object's status through the `/status` subresource,
    /// re-reading and re-applying on a lost race; `change` may run several times, each
    /// time on a fresh copy. A change that leaves the status as it was writes nothing.
    /// The whole object is validated as an HTTP status write is.
    pub async fn patch_status(
        &self,
        name: &str,
        mut change: impl FnMut(&mut K::Status),
    ) -> Result<Patched<K>> {
        for _ in 0..RETRIES {
            let current = self.get_existing(name)?;
            let mut object = current.clone();
            change(object.status_mut());
            if object.status() == current.status() {
                return Ok(Patched::Unchanged(current));
            }
            // A derived field (an Agent's phase) moves with what it is derived from, in
            // the same write.
            object.derive_status();
            let mutation = Mutation::Update {
                kind: K::PLURAL,
                object: admitted(&object)?,
                subresource: Subresource::Status,
            };
            match self.commit(mutation, false).await {
                Ok(stored) => return Ok(Patched::Stored(stored)),
                Err(Error::Store(store::Error::Conflict { .. })) => continue,
                Err(err) => return Err(missing::<K>(err, name)),
            }
        }
        Err(Error::Contended { kind: K::PLURAL, name: name.to_string() })
    }
}

/// A store `NotFound` as the typed client's own.
fn missing<K: Object>(err: Error, name: &str) -> Error {
    match err {
        Error::Store(store::Error::NotFound { .. }) => {
            Error::NotFound { kind: K::PLURAL, name: name.to_string() }
        }
        other => other,
    }
}

fn invalid<K: Object>(object: &K, errors: Vec<ValidationError>) -> Error {
    Error::Invalid { kind: K::KIND, name: object.metadata().name.clone(), errors }
}

/// `object` validated as the API validates it, serialized with `apiVersion` and `kind`.
fn admitted<K: Resource>(object: &K) -> Result<Value> {
    let errors = validate(object);
    if !errors.is_empty() {
        return Err(invalid(object, errors));
    }
    let mut value = serde_json::to_value(object).map_err(|source| Error::Decode {
        kind: K::KIND,
        name: object.metadata().name.clone(),
        source,
    })?;
    if let Value::Object(map) = &mut value {
        map.insert("apiVersion".into(), Value::String(K::API_VERSION.into()));
        map.insert("kind".into(), Value::String(K::KIND.into()));
    }
    Ok(value)
}

#[cfg(test)]
mod tests;
