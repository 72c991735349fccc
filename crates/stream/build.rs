//! Declares the `settle_loom` cfg that switches the force-close protocol to
//! loom's primitives. It is not `cfg(loom)` because that one, set for the
//! whole build, also removes `tokio::net`, which the HTTP provider needs.

fn main() {
    println!("cargo::rustc-check-cfg=cfg(settle_loom)");
}
