//! [`Owners`]: which principal each session belongs to, and how many live
//! sessions and holds each principal has.
//!
//! A session belongs to the principal whose connection created it. Another
//! principal is told `not_found` for it by every method and does not see it
//! in `sessions.list`: to it, the session does not exist. A session the
//! gateway's principals did not create (one the embedding program
//! registered) has no recorded owner: it is the anonymous principal's,
//! so a gateway without tokens serves every session as it always did, and
//! a gateway with tokens serves such a session to nobody.
//!
//! Ownership is recorded in the store ([`principals`](crate::principals)),
//! and kept here as a cache of it, so that a restarted process, and the
//! process of a fleet (SPEC §12) that adopts a session, enforce it. A named principal's finalized sessions
//! stay recorded (a few bytes each), so that they go on answering their
//! owner and nobody else; the anonymous principal's are forgotten at their
//! finalize, since an unrecorded session is its anyway.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard, PoisonError};

use settle_runtime::SessionId;

use crate::auth::Principal;

/// Who owns which session.
#[derive(Debug, Default)]
pub(crate) struct Owners {
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    sessions: HashMap<SessionId, Owned>,
    /// Live sessions (and reservations) per principal.
    live: HashMap<Principal, usize>,
    /// The holds a principal placed on each session, until released or
    /// the session is finalized.
    holds: HashMap<SessionId, (Principal, usize)>,
    /// Holds (and hold reservations) per principal.
    held: HashMap<Principal, usize>,
}

#[derive(Debug)]
struct Owned {
    principal: Principal,
    live: bool,
}

/// A place for one more session of a principal, taken before the session
/// is registered so that two creates racing cannot both pass the limit.
/// Given back when dropped, unless [`own`](Reservation::own) made it a
/// session's.
#[derive(Debug)]
pub(crate) struct Reservation<'a> {
    owners: &'a Owners,
    principal: Principal,
    spent: bool,
}

impl Owners {
    fn inner(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether `principal` may use session `id`.
    pub fn may_use(&self, principal: &Principal, id: SessionId) -> bool {
        match self.inner().sessions.get(&id) {
            Some(owned) => owned.principal == *principal,
            None => principal.is_anonymous(),
        }
    }

    /// A place for one more live session of `principal`, if it has fewer
    /// than `max`; else the number it has.
    pub fn reserve(
        &self,
        principal: &Principal,
        max: Option<usize>,
    ) -> Result<Reservation<'_>, usize> {
        let mut inner = self.inner();
        let live = inner.live.entry(principal.clone()).or_default();
        if max.is_some_and(|max| *live >= max) {
            return Err(*live);
        }
        *live += 1;
        Ok(Reservation {
            owners: self,
            principal: principal.clone(),
            spent: false,
        })
    }

    /// A place for one more hold of `principal`, if it has fewer than
    /// `max`; else the number it has. Taken before the hold is asked of the
    /// kernel, given back when dropped unless [`HoldPlace::keep`] kept it.
    pub fn reserve_hold(
        &self,
        principal: &Principal,
        max: Option<usize>,
    ) -> Result<HoldPlace<'_>, usize> {
        let mut inner = self.inner();
        let held = inner.held.entry(principal.clone()).or_default();
        if max.is_some_and(|max| *held >= max) {
            return Err(*held);
        }
        *held += 1;
        Ok(HoldPlace {
            owners: self,
            principal: principal.clone(),
            kept: false,
        })
    }

    /// A hold on session `id` was released: its place is given back.
    pub fn released_hold(&self, id: SessionId) {
        let mut inner = self.inner();
        let Some((principal, count)) = inner.holds.get_mut(&id) else {
            return;
        };
        let principal = principal.clone();
        *count -= 1;
        if *count == 0 {
            inner.holds.remove(&id);
        }
        inner.unhold(&principal, 1);
    }

    /// Session `id`, adopted from another process of the fleet, belongs to
    /// `principal`, as the store recorded where it was created (SPEC §12).
    /// Counted as one of its live sessions, and the `holds` it came with as
    /// its holds, past its limits if need be: they exist already.
    pub fn adopted(&self, principal: Principal, id: SessionId, holds: usize) {
        let mut inner = self.inner();
        if inner.sessions.contains_key(&id) {
            return;
        }
        if holds > 0 {
            *inner.held.entry(principal.clone()).or_default() += holds;
            inner.holds.insert(id, (principal.clone(), holds));
        }
        *inner.live.entry(principal.clone()).or_default() += 1;
        inner.sessions.insert(
            id,
            Owned {
                principal,
                live: true,
            },
        );
    }

    /// Session `id`, whose owner this process did not know, belongs to
    /// `principal`, as the store recorded where it was created: a finalized
    /// session of an earlier process or of another of the fleet, or a live
    /// one this process's kernel keeps (its embedding program's). Not one
    /// of its live sessions here: none of them is counted against a limit.
    /// The anonymous principal's are not kept: an unknown session is its.
    pub fn recorded(&self, principal: Principal, id: SessionId) {
        if principal.is_anonymous() {
            return;
        }
        self.inner().sessions.entry(id).or_insert(Owned {
            principal,
            live: false,
        });
    }

    /// Whether the owner of session `id` is known here.
    pub fn knows(&self, id: SessionId) -> bool {
        self.inner().sessions.contains_key(&id)
    }

    /// Session `id` is finalized: its place and its holds' are given back.
    pub fn finished(&self, id: SessionId) {
        let mut inner = self.inner();
        if let Some((principal, count)) = inner.holds.remove(&id) {
            inner.unhold(&principal, count);
        }
        let Some(owned) = inner.sessions.get_mut(&id) else {
            return;
        };
        if !std::mem::replace(&mut owned.live, false) {
            return;
        }
        let principal = owned.principal.clone();
        if principal.is_anonymous() {
            inner.sessions.remove(&id);
        }
        inner.release(&principal);
    }
}

impl Inner {
    fn unhold(&mut self, principal: &Principal, count: usize) {
        if let Some(held) = self.held.get_mut(principal) {
            *held = held.saturating_sub(count);
            if *held == 0 {
                self.held.remove(principal);
            }
        }
    }

    fn release(&mut self, principal: &Principal) {
        if let Some(live) = self.live.get_mut(principal) {
            *live = live.saturating_sub(1);
            if *live == 0 {
                self.live.remove(principal);
            }
        }
    }
}

impl Reservation<'_> {
    /// The place is session `id`'s, which now belongs to the principal.
    pub fn own(mut self, id: SessionId) {
        self.spent = true;
        self.owners.inner().sessions.insert(
            id,
            Owned {
                principal: self.principal.clone(),
                live: true,
            },
        );
    }
}

/// A place for one more hold of a principal: see [`Owners::reserve_hold`].
#[derive(Debug)]
pub(crate) struct HoldPlace<'a> {
    owners: &'a Owners,
    principal: Principal,
    kept: bool,
}

impl HoldPlace<'_> {
    /// The place is a hold on session `id` now.
    pub fn keep(mut self, id: SessionId) {
        self.kept = true;
        let mut inner = self.owners.inner();
        let entry = inner
            .holds
            .entry(id)
            .or_insert_with(|| (self.principal.clone(), 0));
        entry.1 += 1;
    }
}

impl Drop for HoldPlace<'_> {
    fn drop(&mut self) {
        if !self.kept {
            self.owners.inner().unhold(&self.principal, 1);
        }
    }
}

impl Drop for Reservation<'_> {
    fn drop(&mut self) {
        if !self.spent {
            self.owners.inner().release(&self.principal);
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::auth::Tokens;
    use axum::http::{header::AUTHORIZATION, HeaderMap, HeaderValue};

    fn principal(tokens: &Tokens, token: &str) -> Principal {
        let mut headers = HeaderMap::new();
        let value = HeaderValue::from_str(&format!("Bearer {token}")).unwrap();
        headers.insert(AUTHORIZATION, value);
        crate::auth::authenticate(Some(tokens), &headers).unwrap()
    }

    #[test]
    fn a_session_is_its_owners_alone_and_the_limit_counts_live_ones() {
        let tokens = Tokens::parse("a aaaaaaaaaaaaaaaa\nb bbbbbbbbbbbbbbbb\n").unwrap();
        let (a, b) = (
            principal(&tokens, "aaaaaaaaaaaaaaaa"),
            principal(&tokens, "bbbbbbbbbbbbbbbb"),
        );
        let owners = Owners::default();
        owners.reserve(&a, Some(2)).unwrap().own(SessionId(1));
        assert!(owners.may_use(&a, SessionId(1)));
        assert!(!owners.may_use(&b, SessionId(1)));
        assert!(
            !owners.may_use(&a, SessionId(9)),
            "unrecorded: nobody named"
        );
        assert!(owners.may_use(&Principal::ANONYMOUS, SessionId(9)));

        // A dropped reservation gives its place back; a second session fills the limit.
        drop(owners.reserve(&a, Some(2)).unwrap());
        owners.reserve(&a, Some(2)).unwrap().own(SessionId(2));
        assert_eq!(owners.reserve(&a, Some(2)).unwrap_err(), 2);
        assert!(
            owners.reserve(&b, Some(2)).is_ok(),
            "another principal's count"
        );

        // Finalized: the place is back, the session still a's alone.
        owners.finished(SessionId(1));
        owners.finished(SessionId(1));
        assert!(owners.reserve(&a, Some(2)).is_ok());
        assert!(!owners.may_use(&b, SessionId(1)));
        assert!(owners.may_use(&a, SessionId(1)));
    }

    #[test]
    fn an_adopted_sessions_holds_count_as_its_principals_until_released() {
        let tokens = Tokens::parse("a aaaaaaaaaaaaaaaa\n").unwrap();
        let a = principal(&tokens, "aaaaaaaaaaaaaaaa");
        let owners = Owners::default();
        owners.adopted(a.clone(), SessionId(7), 2);
        assert!(owners.may_use(&a, SessionId(7)));
        assert_eq!(owners.reserve_hold(&a, Some(2)).err(), Some(2));
        owners.released_hold(SessionId(7));
        owners.reserve_hold(&a, Some(2)).unwrap().keep(SessionId(8));
        assert_eq!(owners.reserve_hold(&a, Some(2)).err(), Some(2));
        // Finalized: its hold's place is back.
        owners.finished(SessionId(7));
        assert!(owners.reserve_hold(&a, Some(2)).is_ok());
    }
}
