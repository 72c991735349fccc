//! The lease renewer: keeps this process's lease on its sessions alive, and
//! says so loudly when it cannot (G8).

use std::sync::Arc;
use std::time::Duration;

use settle_store::{OwnerId, SessionStore, StoreError};
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::bus::EventBus;
use crate::command::Command;
use crate::event::LifecycleEvent;

/// How many renewals a lease gets in its TTL, and how much sooner than
/// that a failed one is tried again: the last success before an outage is
/// at most a tenth of the TTL old when it begins, and the first try after
/// it comes at most a thirtieth of the TTL after it ends, so an outage of
/// all but those (26 s of 30) is always ridden out. (With a renewal every
/// third of the TTL, as at first, an outage of two thirds of it could stop
/// the kernel, against its documented bound.)
const RENEWALS_PER_TTL: u32 = 10;
const RETRIES_PER_RENEWAL: u32 = 3;

/// Renews the lease every tenth of its TTL, a failed renewal tried again
/// after a thirtieth. The lease counts as lost when
/// the store says it expired, or once no renewal has succeeded for a whole
/// TTL (measured from the last success's request, so the local view is
/// never more optimistic than the store's), at that instant, whether or not
/// a renewal is in flight: then the driver is told, which stops starting
/// anything and cancels every work, and the loop ends.
pub(crate) async fn renew(
    store: Arc<dyn SessionStore>,
    owner: OwnerId,
    ttl: Duration,
    commands: mpsc::WeakUnboundedSender<Command>,
    events: EventBus,
    why: Arc<std::sync::OnceLock<String>>,
) {
    let every = (ttl / RENEWALS_PER_TTL).max(Duration::from_millis(10));
    let again = every / RETRIES_PER_RENEWAL;
    let mut tick = tokio::time::interval_at(Instant::now() + every, every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut valid_until = Instant::now() + ttl;
    // What the store said to the last renewals that failed: a lease found
    // expired after them (the store came back, or answers reads only) is
    // told with their cause, a full disk say, not as an expiry alone.
    let mut failing: Option<String> = None;
    // With no renewal failing, the lease can only run out between two
    // ticks when this process did not run for most of a TTL (stopped by a
    // signal, a machine paused, a runtime blocked by a caller's work): no
    // renewal was asked, so the store is not to blame.
    let expired = |failing: &Option<String>| match failing {
        Some(cause) => format!("the lease could not be renewed before it expired: {cause}"),
        None => {
            "the lease could not be renewed before it expired: this process did not run in time \
                 to renew it, as when it is stopped, its machine paused or its runtime blocked"
                .to_owned()
        }
    };
    loop {
        tokio::select! {
            // Biased: on waking after such a pause, the tick and the
            // lease's end are both due; a renewal asked then would be past
            // the end at once, and said as a store that did not answer.
            biased;
            () = tokio::time::sleep_until(valid_until) => {
                // Between two renewals: the last ones failed, or none
                // could be asked in time.
                let message = expired(&failing);
                return lost(message, &why, &events, &commands);
            }
            _ = tick.tick() => {}
        }
        let asked = Instant::now();
        // Not past the lease's end: a renewal that has not answered by then
        // is too late, whatever it says after.
        let answer_by = (asked + every).min(valid_until);
        let message = match tokio::time::timeout_at(answer_by, store.renew_lease(owner, ttl)).await {
            Ok(Ok(_)) => {
                crate::meter::lease_renewal(true);
                valid_until = asked + ttl;
                failing = None;
                continue;
            }
            Ok(Err(error @ StoreError::LeaseLost(_))) => {
                crate::meter::lease_renewal(false);
                match failing.take() {
                    Some(cause) => format!("{error}, after renewals that failed: {cause}"),
                    None => error.to_string(),
                }
            }
            Ok(Err(error)) if Instant::now() >= valid_until => {
                crate::meter::lease_renewal(false);
                format!("the lease could not be renewed before it expired: {error}")
            }
            Err(_) if Instant::now() >= valid_until => format!(
                "the lease could not be renewed before it expired: the store did not answer within {:?}",
                crate::clock::to_millis(answer_by.saturating_duration_since(asked))
            ),
            Ok(Err(error)) => {
                crate::meter::lease_renewal(false);
                tracing::warn!(%error, "failed to renew this process's lease; trying again");
                failing = Some(error.to_string());
                tick.reset_after(again);
                continue;
            }
            Err(_) => {
                tracing::warn!(?every, "the store did not answer a lease renewal in time; trying again");
                failing = Some(format!("the store did not answer within {every:?}"));
                tick.reset_after(again);
                continue;
            }
        };
        return lost(message, &why, &events, &commands);
    }
}

/// Says the lease is lost, once, and tells the driver.
fn lost(
    message: String,
    why: &std::sync::OnceLock<String>,
    events: &EventBus,
    commands: &mpsc::WeakUnboundedSender<Command>,
) {
    tracing::error!(%message, "this process lost its lease on its sessions");
    let _ = why.set(message.clone());
    events.emit(None, || LifecycleEvent::LeaseLost {
        message: message.clone(),
    });
    if let Some(commands) = commands.upgrade() {
        let _ = commands.send(Command::LeaseLost);
    }
}
