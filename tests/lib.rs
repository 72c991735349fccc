//! End-to-end tests of settle live in `tests/tests/`; this library holds their shared helpers.
