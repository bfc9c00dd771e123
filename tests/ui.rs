//! Compile-time tests of `#[distributed_lock]`: the misuses it must reject (with
//! their exact diagnostics, `tests/ui/fail/*.stderr`) and every function shape it
//! must accept (`tests/ui/pass`).
//!
//! Diagnostics change between compiler releases: the `.stderr` files are for the
//! stable toolchain; regenerate them with `TRYBUILD=overwrite cargo test --test ui`.

#[test]
fn ui() {
    let t = trybuild::TestCases::new();
    t.compile_fail("tests/ui/fail/*.rs");
    t.pass("tests/ui/pass/*.rs");
}
