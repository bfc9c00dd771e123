//! Checks on the annotated function as a whole (is it `async`, does it return a
//! `Result`), and the error context every part of the macro reports into.

use std::cell::RefCell;
use std::fmt::Display;

use proc_macro2::Span;
use quote::ToTokens;
use syn::ext::IdentExt;
use syn::{GenericArgument, ItemFn, PathArguments, ReturnType, Type, TypeParamBound};

use crate::expand::AsyncTraitBody;

/// Collects every error of one expansion, so that all of them are reported in
/// one pass; [`Ctxt::check`] combines them once at the end.
pub(crate) struct Ctxt {
    errors: RefCell<Vec<syn::Error>>,
}

impl Ctxt {
    pub(crate) fn new() -> Self {
        Ctxt {
            errors: RefCell::new(Vec::new()),
        }
    }

    /// An error spanned over the tokens of `obj` (first to last token).
    pub(crate) fn error_spanned_by<T: ToTokens, M: Display>(&self, obj: T, msg: M) {
        self.errors
            .borrow_mut()
            .push(syn::Error::new_spanned(obj.into_token_stream(), msg));
    }

    /// An error at one span.
    pub(crate) fn error_at<M: Display>(&self, span: Span, msg: M) {
        self.errors.borrow_mut().push(syn::Error::new(span, msg));
    }

    /// A parse error from syn, kept as it is.
    pub(crate) fn syn_error(&self, err: syn::Error) {
        self.errors.borrow_mut().push(err);
    }

    /// All errors so far, combined into one, or `Ok` if there were none.
    pub(crate) fn check(self) -> syn::Result<()> {
        let mut errors = self.errors.into_inner().into_iter();
        let Some(mut combined) = errors.next() else {
            return Ok(());
        };
        for err in errors {
            combined.combine(err);
        }
        Err(combined)
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
        Some(body) => Some(body.output()),
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

/// The `Output = T` of the `Future` in an `#[async_trait]` return type
/// (`Pin<Box<dyn Future<Output = T> + Send + 'async_trait>>`).
pub(crate) fn future_output(ty: &Type) -> Option<&Type> {
    match ty {
        Type::Path(path) => path
            .path
            .segments
            .iter()
            .find_map(|segment| args_output(&segment.arguments)),
        Type::TraitObject(object) => bounds_output(object.bounds.iter()),
        Type::ImplTrait(imp) => bounds_output(imp.bounds.iter()),
        Type::Paren(paren) => future_output(&paren.elem),
        Type::Group(group) => future_output(&group.elem),
        _ => None,
    }
}

fn bounds_output<'a>(mut bounds: impl Iterator<Item = &'a TypeParamBound>) -> Option<&'a Type> {
    bounds.find_map(|bound| match bound {
        TypeParamBound::Trait(bound) => bound
            .path
            .segments
            .iter()
            .find_map(|segment| args_output(&segment.arguments)),
        _ => None,
    })
}

fn args_output(args: &PathArguments) -> Option<&Type> {
    let PathArguments::AngleBracketed(args) = args else {
        return None;
    };
    args.args.iter().find_map(|arg| match arg {
        GenericArgument::AssocType(assoc) if assoc.ident == "Output" => Some(&assoc.ty),
        GenericArgument::Type(ty) => future_output(ty),
        _ => None,
    })
}
