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

/// Runs an `async fn`'s body while holding a distributed lock.
///
/// The function acquires the lock named by `key` (waiting up to `wait`), runs
/// its body, and releases the lock on every way out: a normal return, an early
/// `return`, `?`, a panic, or the future being dropped. While the body runs the
/// manager's watchdog keeps the lock alive. If the lock cannot be had, the
/// function returns `Err(From::from(lock_error))` without running the body, so
/// the error type must implement `From<redlock::LockError>`.
///
/// ```ignore
/// use redlock::{distributed_lock, LockError};
///
/// #[derive(Debug)]
/// enum ShopError { SoldOut, Lock(LockError) }
/// impl From<LockError> for ShopError {
///     fn from(e: LockError) -> Self { ShopError::Lock(e) }
/// }
///
/// // Holds the Redis key "lock:buy_{42}" while buying goods 42.
/// #[distributed_lock(key = "buy_<goods_id>", ttl = "10s", wait = "2s")]
/// async fn buy(goods_id: u64, qty: u32) -> Result<Order, ShopError> {
///     let stock = load_stock(goods_id).await?;
///     if stock < qty {
///         return Err(ShopError::SoldOut); // releases the lock
///     }
///     save_stock(goods_id, stock - qty).await?;
///     Ok(Order { goods_id, qty })
/// }
/// ```
///
/// The function keeps its signature, documentation, attributes, visibility,
/// generics and where-clause. It must be `async` (or a method of an
/// `#[async_trait]` impl) and return `Result<_, E>` (any type spelled
/// `...::Result<...>`, such as `anyhow::Result<T>`, is accepted); its future is
/// `Send` whenever the body's is, so annotated axum handlers remain handlers.
///
/// # Options
///
/// | option | value | default |
/// |---|---|---|
/// | `key` | string template; this or `keys` is required | — |
/// | `keys` | list of string templates | — |
/// | `mode` | `"read"` / `"write"` / `"exclusive"` | `"exclusive"` |
/// | `permits` | integer, `1` ..= `u32::MAX` | — (an exclusive lock) |
/// | `ttl` | duration string, `1ms` ..= 30 days | the manager's `default_ttl` |
/// | `wait` | duration string, `"0s"` = one attempt | the manager's `default_wait` |
/// | `hold_at_least` | duration string, at most 30 days | none |
/// | `watchdog` | `true` / `false` | `true` |
/// | `manager` | expression | the global manager |
/// | `guard` | identifier | none |
/// | `on_lost` | `"abort"` / `"continue"` | `"abort"` |
/// | `crate` | path in a string | `"::redlock"` |
///
/// ## `key = "..."` (required)
///
/// Literal text plus placeholders, formatted with `Display`:
///
/// - `<name>`: a parameter, or a name bound by a parameter's pattern
///   (`Path(id): Path<u64>` gives `<id>`, `(a, b): (u32, u32)` gives `<a>` and
///   `<b>`, `Order { id, .. }: Order` gives `<id>`);
/// - `<name.field.field>`: a field of a parameter (`<req.user.id>`, `<pair.0>`);
/// - `<self.field>` (or `<self>`): a field of the receiver;
/// - `<<` is a literal `<`.
///
/// The manager's prefix (default `"lock:"`) goes in front. Hash tag rule, so
/// that every key a lock touches lands in one Redis Cluster slot: a template
/// that contains `{...}` is used as written; otherwise the part from the start
/// of the first placeholder to the end of the last one is wrapped in `{}`, and a
/// template without placeholders is wrapped whole.
///
/// ```text
/// "buy_<goods_id>"           goods_id = 42          -> lock:buy_{42}
/// "cart_<user>_<item>"       user = 7, item = 9     -> lock:cart_{7_9}
/// "order:{<region>}:<id>"    region = "eu", id = 5  -> lock:order:{eu}:5
/// "nightly_report"                                  -> lock:{nightly_report}
/// ```
///
/// The key is built once per call, into one `String` sized up front. An empty
/// key, an unclosed or malformed placeholder, and a placeholder naming no
/// parameter are compile errors.
///
/// ## `mode = "read" | "write" | "exclusive"`
///
/// `"read"` takes a read lock: any number of readers of the key at once, no
/// writer meanwhile. `"write"` and `"exclusive"` (the default) are the same
/// exclusive lock, which excludes readers too. Writer-preferring: once a writer
/// waits, new readers queue behind it.
///
/// ```ignore
/// #[distributed_lock(key = "report_<id>", mode = "read")]
/// async fn show(id: u64) -> Result<Report, AppError> { /* ... */ }
///
/// #[distributed_lock(key = "report_<id>", mode = "write")]
/// async fn rebuild(id: u64) -> Result<(), AppError> { /* ... */ }
/// ```
///
/// ## `permits = N`
///
/// At most `N` calls hold the key at once; each holds a permit of its own
/// (renewed by the watchdog, freed by its ttl if the holder dies). Callers that
/// disagree on `N` for one key are the caller's error. Not with `mode` or `keys`.
///
/// ```ignore
/// #[distributed_lock(key = "export", permits = 4)]
/// async fn export(id: u64) -> Result<(), AppError> { /* ... */ }
/// ```
///
/// ## `keys = ["...", "..."]`
///
/// Several exclusive locks at once, all or nothing, without deadlock whatever
/// the order callers name them in. Each template is a `key` template (same
/// placeholders, same hash tag rule); a template listed twice is a compile
/// error, and templates that give the same key at run time lock it once.
/// `guard = g` binds a `&MultiGuard`. Not with `key`, `mode` or `permits`.
///
/// ```ignore
/// #[distributed_lock(keys = ["account_<from>", "account_<to>"], guard = g)]
/// async fn transfer(from: u64, to: u64, amount: u64) -> Result<(), BankError> {
///     /* g.keys(), g.fencing_tokens() */
/// }
/// ```
///
/// ## `hold_at_least = "30s"`
///
/// On release, the key is kept until this long after the grant: at most one
/// run per period for a scheduled job (ShedLock's `lockAtLeastFor`). With
/// `wait = "0s"` the other instances skip the run instead of waiting.
///
/// ```ignore
/// #[distributed_lock(key = "nightly_report", hold_at_least = "5m", wait = "0s")]
/// async fn nightly_report() -> Result<(), AppError> { /* ... */ }
/// ```
///
/// ## `ttl = "30s"`, `wait = "2s"`
///
/// Durations are a whole number followed by `ms`, `s` or `m` (`"250ms"`,
/// `"10s"`, `"1m"`), checked at compile time. `ttl` is how long the lock lives
/// without renewal (between 1 ms and 30 days); `wait` is how long to wait for a
/// held lock before returning `LockError::Timeout`, and `wait = "0s"` makes one
/// attempt. Unset, both come from the manager.
///
/// ```ignore
/// #[distributed_lock(key = "report_<day>", ttl = "5m", wait = "0s")]
/// async fn build_report(day: u32) -> Result<(), LockError> { /* ... */ }
/// ```
///
/// ## `watchdog = false`
///
/// No renewal: the lock simply expires after `ttl`, even if the body is still
/// running. The default (`true`) renews the lock every `ttl / 3` while the body
/// runs.
///
/// ## `manager = <expr>`
///
/// The `LockManager` to use. The expansion takes `&(<expr>)` once per call, so
/// `<expr>` may be a `LockManager` value, a `&LockManager` parameter, or
/// anything that auto-derefs to one (`self.locks`, `state.locks`, an
/// `Arc<LockManager>`). The borrow ends once the lock is acquired, so the body
/// may still move what the expression borrowed. Without this option the global
/// manager (`LockManager::install_global`) is used; if none is installed the
/// call returns `LockError::NoManager`.
///
/// ```ignore
/// struct Tenants { locks: LockManager, tenant: String }
///
/// impl Tenants {
///     #[distributed_lock(key = "tenant_<self.tenant>_<user_id>", manager = self.locks)]
///     async fn rename(&mut self, user_id: u64, name: String) -> Result<(), LockError> {
///         /* ... */
///     }
/// }
/// ```
///
/// ## `guard = <ident>`
///
/// Binds `<ident>: &LockGuard` in the body (`&MultiGuard` with `keys`), for the
/// fencing token or the key:
///
/// ```ignore
/// #[distributed_lock(key = "ledger_<account>", guard = g)]
/// async fn append(account: u64, entry: Entry) -> Result<(), AppError> {
///     storage.write_if_newer(account, g.fencing_token(), entry).await
/// }
/// ```
///
/// ## `on_lost = "abort" | "continue"`
///
/// What happens when the lock is lost while the body runs (a renewal failed or
/// the lease ran out). `"abort"` (the default) drops the body's future at its
/// next `.await` and returns `Err(LockError::Lost.into())`; `"continue"` logs the
/// loss and returns the body's result unchanged.
///
/// ## `crate = "path"`
///
/// Where the `redlock` facade is, when it is re-exported under another name:
/// `crate = "::my_app::redlock"`. The expansion uses `<path>::LockManager`,
/// `<path>::LockGuard` and the hidden `<path>::__private` module.
///
/// # Shapes
///
/// Free functions, `&self` / `&mut self` / `self` methods, generic functions,
/// functions returning `Result<impl Trait, E>`, methods of `#[async_trait]`
/// impls (put `#[distributed_lock]` on the method inside the impl), axum
/// handlers, and functions that also carry `#[tracing::instrument]` (in either
/// order).
///
/// # Reentrancy
///
/// An annotated function called, directly or not, from the body of another one
/// that holds the same key on the same manager (or a clone of it) in the same
/// task does not wait for itself: it runs inside the outer lock, and only the
/// outermost call releases it. The same key on another manager is another lock.
/// Two annotated calls joined concurrently in one body (`tokio::join!`) share
/// the outer lock: they are not mutually excluded from each other.
///
/// Only an exclusive call re-enters, and only an exclusive holder: a
/// `mode = "read"`, `permits` or `keys` call always acquires, and its body's
/// calls do not re-enter its locks. An exclusive call on a key its caller reads
/// (or holds a permit or a `keys` lock of) waits like any other writer, until
/// its `wait` runs out. A re-entering call does not release, so its own
/// `hold_at_least` does not apply: the outermost call's does.
///
/// # Compile errors
///
/// All reported at once, each at the offending token: the function is not
/// `async`; it does not return `Result`; a placeholder names no parameter; a
/// duration is malformed or out of range; an option is unknown, duplicated or
/// has a value of the wrong kind; the key is empty or missing; both `key` and
/// `keys`; `keys = []` or a template listed twice; an unknown `mode`;
/// `permits = 0` or more than `u32::MAX`; `mode` with `permits`; `mode` or
/// `permits` with `keys`.
#[proc_macro_attribute]
pub fn distributed_lock(
    args: proc_macro::TokenStream,
    item: proc_macro::TokenStream,
) -> proc_macro::TokenStream {
    expand::expand(args.into(), item.into()).into()
}
