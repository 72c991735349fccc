//! [`Scopes`]: the LRU cap's [`Scope`] of each principal a kernel serves,
//! so that one principal's new sessions never evict another's.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use settle_core::Scope;

/// The scope of each named principal, numbered in the order they are first
/// asked for; a session of no principal is in [`Scope::SHARED`]. Kept for
/// the kernel's life: a few bytes per principal, and a principal's
/// sessions (registered or adopted) always meet in one scope.
#[derive(Debug, Default)]
pub(crate) struct Scopes {
    named: Mutex<HashMap<Arc<str>, Scope>>,
}

impl Scopes {
    /// The scope of `principal`'s sessions.
    pub fn of(&self, principal: Option<&str>) -> Scope {
        let Some(name) = principal else {
            return Scope::SHARED;
        };
        let mut named = self.named.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(scope) = named.get(name) {
            return *scope;
        }
        // Numbered from 1: 0 is the shared scope.
        let scope = Scope(named.len() as u64 + 1);
        named.insert(name.into(), scope);
        scope
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_principal_has_one_scope_of_its_own_and_no_principal_the_shared_one() {
        let scopes = Scopes::default();
        let a = scopes.of(Some("alice"));
        let b = scopes.of(Some("bob"));
        assert_ne!(a, b);
        assert_ne!(a, Scope::SHARED);
        assert_ne!(b, Scope::SHARED);
        assert_eq!(scopes.of(Some("alice")), a);
        assert_eq!(scopes.of(None), Scope::SHARED);
        // A name is not the shared scope, even an empty one.
        assert_ne!(scopes.of(Some("")), Scope::SHARED);
    }
}
