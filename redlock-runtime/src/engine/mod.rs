//! The engine: the state a manager's handles, guards and background task share
//! ([`Shared`], in `state`); that background task (`watchdog`: renewals, background
//! releases and withdrawals, the end of a key's channel interest); and the one drop guard
//! ([`Armed`], in `armed`) that hands a cut-short request's leftovers to that task. It
//! sits between the API (`manager`) and the stores (`backend`), and imports nothing from
//! the API.

mod armed;
pub(crate) mod path;
mod state;
mod watchdog;

pub(crate) use armed::Armed;
pub(crate) use state::Shared;
pub(crate) use watchdog::{run, Job};
