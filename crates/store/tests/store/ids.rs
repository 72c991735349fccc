//! Session ids reserved in blocks ahead of need: never handed out twice,
//! whether given explicitly or allocated by a registration, alone or batched.

use settle_store::{Applied, LifecycleWrite, NewSession, SessionId, StoreError};

use crate::common::{rt, Backend, TestDb};
use crate::{open, owner, write, HOUR};

pub fn reserved_ids_are_never_handed_out_twice(b: Backend) {
    let Some(db) = TestDb::new(b) else { return };
    let rt = rt();
    let (one, two) = (open(&db), open(&db));
    rt.block_on(async {
        let o = owner(&*one, HOUR).await;
        // A session created before any reservation: the counter starts above it.
        let first = write::register(&*one, NewSession::new("first", o))
            .await
            .unwrap();
        let a = one.reserve_ids(10).await.unwrap();
        let b = two.reserve_ids(10).await.unwrap();
        assert_eq!(a.end - a.start, 10);
        assert_eq!(b.end - b.start, 10);
        assert!(a.start > first.0, "{a:?} after {first}");
        assert!(
            a.end <= b.start || b.end <= a.start,
            "{a:?} and {b:?} overlap"
        );
        // Reserved ids are used as given; allocated ones never collide with them.
        let given = SessionId(b.start + 3);
        let created = write::register(&*two, NewSession::new("given", o).with_id(given))
            .await
            .unwrap();
        assert_eq!(created, given);
        let fresh = write::register(&*one, NewSession::new("fresh", o))
            .await
            .unwrap();
        assert!(!a.contains(&fresh.0) && !b.contains(&fresh.0), "{fresh}");
        let again = write::register(&*one, NewSession::new("again", o).with_id(given)).await;
        assert!(
            matches!(again, Err(StoreError::DuplicateSession(id)) if id == given),
            "{again:?}"
        );
        // A batch registers under reserved ids too, and allocates the rest
        // from the same counter. An id taken, by a session or by a write
        // before it in the batch, is refused alone.
        let batched = SessionId(a.start + 1);
        let mut results = one
            .apply(vec![
                LifecycleWrite::Register(NewSession::new("batched", o).with_id(batched)),
                LifecycleWrite::Register(NewSession::new("twice", o).with_id(batched)),
                LifecycleWrite::Register(NewSession::new("allocated", o)),
                LifecycleWrite::Register(NewSession::new("taken", o).with_id(given)),
            ])
            .await;
        for (k, taken) in [(3, given), (1, batched)] {
            let refused = results.remove(k);
            assert!(
                matches!(refused, Err(StoreError::DuplicateSession(id)) if id == taken),
                "{k}: {refused:?}"
            );
        }
        let ids: Vec<SessionId> = results
            .into_iter()
            .map(|r| match r {
                Ok(Applied::Registered(id)) => id,
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(ids[0], batched);
        assert!(
            ![a.clone(), b.clone()].iter().any(|r| r.contains(&ids[1].0)),
            "{ids:?}"
        );
        assert!(ids[1] != fresh && ids[1] != first, "{ids:?}");
    });
}
