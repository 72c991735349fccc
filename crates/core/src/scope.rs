use std::fmt;

/// Whose a session is, as far as the LRU cap is concerned: a registration
/// at the cap evicts only idle sessions of its own scope, so that one
/// tenant's new sessions never end another's (SPEC §5's LRU cap, per
/// scope). With none of its own to evict it is refused with
/// [`Error::OverCapacity`](crate::Error::OverCapacity), whoever else is idle.
///
/// A program with one tenant puts every session in [`Scope::SHARED`] and
/// the cap evicts the least recently active idle session of all. The
/// gateway gives each principal a scope of its own. The number means
/// nothing to the core but which sessions share it.
///
/// ```
/// use settle_core::{Core, Event, Error, Handled, Policy, Scope, SessionId};
/// # let now = std::time::Instant::now();
/// let mut core = Core::new(Policy::default().lru_cap(Some(1)));
/// let (a, b) = (Scope(1), Scope(2));
/// core.handle(now, Event::Register { session: SessionId(1), parent: None, scope: Some(a) })?;
/// // B's registration may not end A's idle session.
/// let refused = core.handle(now, Event::Register { session: SessionId(2), parent: None, scope: Some(b) });
/// assert_eq!(refused, Err(Error::OverCapacity { cap: 1 }));
/// // A's may: its own least recently active one goes, once the new
/// // registration is committed (a refused one is withdrawn instead).
/// assert_eq!(
///     core.handle(now, Event::Register { session: SessionId(3), parent: None, scope: Some(a) }),
///     Ok(Handled::EvictsOnCommit),
/// );
/// assert_eq!(core.state(SessionId(1)), Some(settle_core::State::Registered));
/// core.handle(now, Event::Committed { session: SessionId(3) })?;
/// # while core.poll_effect().is_some() {}
/// assert_eq!(core.state(SessionId(1)), Some(settle_core::State::Finalized));
/// # Ok::<(), Error>(())
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Serialize, serde::Deserialize),
    serde(transparent)
)]
pub struct Scope(pub u64);

impl Scope {
    /// The scope of a program with one tenant, and of every session no
    /// tenant was named for.
    pub const SHARED: Scope = Scope(0);
}

impl fmt::Display for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}
