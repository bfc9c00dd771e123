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

/// The key a `#[distributed_lock(key = "...")]` template names, as a `String` (without
/// the manager's prefix), for code that takes the same lock by hand. It is rendered by
/// the code that renders the attribute's template, and its placeholders name the
/// variables in scope where it is called (`<goods_id>`, `<order.id>`, `<self.tenant>`):
///
/// - a template with a `{...}` hash tag is used as written;
/// - otherwise the part from the first placeholder to the end of the last is wrapped in
///   `{}`: `"buy_<goods_id>"` with `goods_id = 42` is `buy_{42}`;
/// - a template without placeholders is used as written: `key!("nightly_report")` is
///   `nightly_report`.
///
/// Values are formatted with `Display`; `<<` is a literal `<`.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), redlock::LockError> {
/// use redlock::{distributed_lock, key, LockError, LockManager, LockOptions};
///
/// #[distributed_lock(key = "buy_<goods_id>", manager = locks, wait = "0s")]
/// async fn buy(locks: &LockManager, goods_id: u64) -> Result<(), LockError> {
///     Ok(())
/// }
///
/// let locks = LockManager::builder().in_memory().build().await?;
/// let goods_id = 42;
/// assert_eq!(key!("buy_<goods_id>"), "buy_{42}");
/// let by_hand = locks.lock(&key!("buy_<goods_id>")).await?;
/// assert!(matches!(buy(&locks, 42).await, Err(LockError::Timeout { .. }))); // the same lock
/// by_hand.release().await?;
/// buy(&locks, 42).await?;
/// # Ok(()) }
/// ```
#[proc_macro]
pub fn key(input: proc_macro::TokenStream) -> proc_macro::TokenStream {
    expand::key(input.into()).into()
}

#[doc = include_str!("distributed_lock.md")]
#[proc_macro_attribute]
pub fn distributed_lock(
    args: proc_macro::TokenStream,
    item: proc_macro::TokenStream,
) -> proc_macro::TokenStream {
    expand::expand(args.into(), item.into()).into()
}
