//! [`Api`] as the controller runtime's [`Client`]: it reads exactly what the API serves —
//! the cache for lists, the event log for watches, with the same 410 on a compacted
//! revision — so a controller behaves the same in-process as over HTTP.

use futures_util::stream::BoxStream;
use futures_util::StreamExt;
use hive_api::Resource;
use hive_controllers::{Client, ClientError, ObjectList, WatchEvent};

use super::{decode, Api};
use crate::store::{self, EventType, Obj};

fn typed<K: Resource>(object: &Obj) -> Result<K, ClientError> {
    decode::<K>(object).map_err(|e| ClientError::transport(e.to_string()))
}

impl<K: Resource> Client<K> for Api<K> {
    fn is_shutting_down(&self) -> bool {
        self.store.is_shut_down()
    }

    async fn list(&self) -> Result<ObjectList<K>, ClientError> {
        let (revision, objects) = self.store.list(K::PLURAL);
        let items = objects.iter().map(typed::<K>).collect::<Result<_, _>>()?;
        Ok(ObjectList { items, resource_version: revision.to_string() })
    }

    async fn watch(
        &self,
        resource_version: &str,
    ) -> Result<BoxStream<'static, Result<WatchEvent<K>, ClientError>>, ClientError> {
        let after: u64 = resource_version
            .parse()
            .map_err(|_| ClientError::transport(format!("invalid resourceVersion {resource_version:?}")))?;
        let watch = self.store.watch(K::PLURAL, after).map_err(|e| match e {
            store::Error::Expired { requested, oldest } => {
                ClientError::Expired(format!("too old resource version: {requested} ({oldest})"))
            }
            other => client_error(other),
        })?;
        Ok(watch
            .map(|event| match event {
                Ok(event) => Ok(match event.type_ {
                    EventType::Added => WatchEvent::Added(typed(&event.object)?),
                    EventType::Modified => WatchEvent::Modified(typed(&event.object)?),
                    EventType::Deleted => WatchEvent::Deleted(typed(&event.object)?),
                }),
                // A watcher that fell behind must re-list, exactly as after a 410.
                Err(store::Error::WatchOverflow) => {
                    Ok(WatchEvent::Error(ClientError::Expired("the watch fell behind".into())))
                }
                Err(other) => Err(client_error(other)),
            })
            .boxed())
    }
}

/// A store error as the controller runtime reads it: a store that is shut down is the
/// daemon stopping, said as such (logged quietly), anything else a transport error.
fn client_error(err: store::Error) -> ClientError {
    match err {
        store::Error::Closed => ClientError::ShuttingDown(err.to_string()),
        other => ClientError::transport(other.to_string()),
    }
}
