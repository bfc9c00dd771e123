//! Cross-cutting checks: the options against each other (one of `key` and
//! `keys`, no `permits` with `mode`, ...) and the annotated function as a whole
//! (is it `async`, does it return a `Result`). Each check records into the
//! [`Ctxt`] and goes on.

use proc_macro2::Span;
use syn::ext::IdentExt;
use syn::{ItemFn, ReturnType, Type};

use crate::async_trait::AsyncTraitBody;
use crate::attr::Options;
use crate::ctxt::Ctxt;

/// Checks the options against each other: one of `key` and `keys`, and no
/// option that makes no sense with the kind of lock asked for. Each error is
/// spanned at the option that does not fit.
pub(crate) fn check_options(cx: &Ctxt, options: &Options) {
    match (options.key.tokens(), options.keys.tokens()) {
        (None, None) => cx.error_at(
            Span::call_site(),
            "missing required option `key` (or `keys` for several locks), e.g. \
             `#[distributed_lock(key = \"order_<id>\")]`",
        ),
        (Some(_), Some(keys)) => cx.error_spanned_by(
            keys,
            "`key` and `keys` cannot both be set: `key` names one lock, `keys` several",
        ),
        _ => {}
    }
    if let Some(mode) = options.mode.tokens() {
        if options.permits.is_written() {
            cx.error_spanned_by(
                mode,
                "`mode` cannot be used with `permits`: a permit is a kind of lock of its own, \
                 neither read nor write",
            );
        }
        if options.keys.is_written() {
            cx.error_spanned_by(
                mode,
                "`mode` cannot be used with `keys`: several keys are always locked exclusively",
            );
        }
    }
    if let (Some(permits), true) = (options.permits.tokens(), options.keys.is_written()) {
        cx.error_spanned_by(
            permits,
            "`permits` cannot be used with `keys`: several keys are always locked exclusively",
        );
    }
}

/// Checks that `func` is an `async fn` (or an `#[async_trait]`-transformed one)
/// returning `Result<_, _>`. Returns the declared return type when it is valid.
pub(crate) fn check_function<'a>(
    cx: &Ctxt,
    func: &'a ItemFn,
    async_trait: Option<&AsyncTraitBody<'a>>,
) -> Option<&'a Type> {
    let sig = &func.sig;
    let ret = match async_trait {
        Some(body) => Some(body.output),
        None => {
            if sig.asyncness.is_none() {
                cx.error_spanned_by(
                    sig.fn_token,
                    "#[distributed_lock] can only be used on an `async fn` (or on a method of an \
                     `#[async_trait]` impl): the lock is held across the body's `.await`s",
                );
            }
            match &sig.output {
                ReturnType::Type(_, ty) => Some(&**ty),
                ReturnType::Default => None,
            }
        }
    };
    match ret {
        Some(ty) if is_result(ty) => Some(ty),
        Some(ty) => {
            cx.error_spanned_by(
                ty,
                "#[distributed_lock] requires the function to return `Result<_, E>` with \
                 `E: From<LockError>`, so that a lock that cannot be had is returned as an error \
                 (an alias of `Result` must have a name ending in `Result`)",
            );
            None
        }
        None => {
            cx.error_spanned_by(
                &sig.ident,
                "#[distributed_lock] requires the function to return `Result<_, E>` with \
                 `E: From<LockError>`, so that a lock that cannot be had is returned as an error; \
                 this function returns `()`",
            );
            None
        }
    }
}

/// Whether `ty` is written as a `Result`: a path whose last segment's name ends
/// in `Result` (`Result<T, E>`, `io::Result<T>`, `anyhow::Result<T>`, an alias
/// such as `ShopResult<T>`). The macro only sees tokens, so this is how an alias
/// is told from a type that is surely not a `Result`.
fn is_result(ty: &Type) -> bool {
    match ty {
        Type::Path(path) if path.qself.is_none() => path
            .path
            .segments
            .last()
            .is_some_and(|segment| segment.ident.unraw().to_string().ends_with("Result")),
        Type::Paren(paren) => is_result(&paren.elem),
        Type::Group(group) => is_result(&group.elem),
        _ => false,
    }
}
