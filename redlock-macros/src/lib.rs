//! The `#[distributed_lock]` attribute macro (implemented in its own issue).
