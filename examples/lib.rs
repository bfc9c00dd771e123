//! The runnable examples of `redlock-guard`: no library of their own. Each example file
//! says how to run it, e.g. `cargo run --example quickstart` from the repository's root.
