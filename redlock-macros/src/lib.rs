//! The `#[distributed_lock]` attribute macro of the [`redlock`] crate (package `redlock-guard`).
//!
//! Use it through `redlock::distributed_lock`: the expansion names the runtime
//! by the path `::redlock::__private` (or the `crate = "..."` option), so the
//! facade is the only dependency a user needs.
//!
//! The macro is a one-way pipeline driven by `expand`: parse the options
//! (`attr`), check them against each other and check the function (`valid`),
//! recognise an `#[async_trait]` body (`async_trait`), scan and resolve the key
//! templates (`key_template`), then write the expansion. Every stage records
//! its errors in one `ctxt::Ctxt` and goes on, so one compile pass reports
//! every mistake, next to the function as it was written.
//!
//! [`redlock`]: https://docs.rs/redlock-guard

#![warn(missing_docs, unreachable_pub)]

mod async_trait;
mod attr;
mod ctxt;
mod expand;
mod key_template;
mod valid;

#[doc = include_str!("distributed_lock.md")]
#[proc_macro_attribute]
pub fn distributed_lock(
    args: proc_macro::TokenStream,
    item: proc_macro::TokenStream,
) -> proc_macro::TokenStream {
    expand::expand(args.into(), item.into()).into()
}
