//! The engine: the state a manager's handles, guards and background task share
//! ([`Shared`], in `state`), and that background task (`watchdog`: renewals, background
//! releases and withdrawals, the end of a key's channel interest). It sits between the
//! API (`manager`) and the stores (`backend`), and imports nothing from the API.

mod state;
mod watchdog;

pub(crate) use state::Shared;
pub(crate) use watchdog::{run, Job};
