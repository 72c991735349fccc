//! Set-up shared by the store rows: sessions registered straight through the
//! store, each with turn 1 open, as a process mid-turn leaves them.

use std::ops::Range;
use std::time::SystemTime;

use settle_store::{Applied, LifecycleWrite, NewSession, OwnerId, SessionId, SessionStore};

use crate::Result;

/// Registers one session of `owner` per index of `range` (named
/// `{prefix}-{i}`) in one batch, then opens turn 1 of each in another;
/// their ids, in order.
pub async fn sessions_mid_turn(
    store: &dyn SessionStore,
    owner: OwnerId,
    prefix: &str,
    range: Range<usize>,
) -> Result<Vec<SessionId>> {
    let batch = range
        .map(|i| LifecycleWrite::Register(NewSession::new(format!("{prefix}-{i}"), owner)))
        .collect();
    let ids = store
        .apply(batch)
        .await
        .into_iter()
        .map(|answer| match answer? {
            Applied::Registered(id) => Ok(id),
            other => Err(format!("a registration answered {other:?}").into()),
        })
        .collect::<Result<Vec<_>>>()?;
    let at = SystemTime::now();
    let starts = ids
        .iter()
        .map(|&session| LifecycleWrite::StartTurn {
            session,
            no: 1,
            input: None,
            at,
        })
        .collect();
    for answer in store.apply(starts).await {
        if !matches!(answer?, Applied::Done) {
            return Err("a turn start answered something else".into());
        }
    }
    Ok(ids)
}
