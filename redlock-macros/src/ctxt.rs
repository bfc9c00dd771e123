//! The error context every stage of the macro reports into.
//!
//! A stage records a problem and goes on, so that one compile pass shows every
//! mistake; [`Ctxt::check`] combines what was recorded once, at the end. A
//! `Ctxt` dropped without `check` is a bug in the macro (its errors would be
//! lost silently), so it panics, as serde_derive's does.

use std::cell::RefCell;
use std::fmt::Display;

use proc_macro2::Span;
use quote::ToTokens;

/// Collects every error of one expansion.
pub(crate) struct Ctxt {
    errors: RefCell<Vec<syn::Error>>,
    /// Set by [`Ctxt::check`]; `Drop` panics while it is false.
    checked: bool,
}

impl Ctxt {
    pub(crate) fn new() -> Self {
        Ctxt {
            errors: RefCell::new(Vec::new()),
            checked: false,
        }
    }

    /// An error spanned over the tokens of `obj` (first to last token).
    pub(crate) fn error_spanned_by<T: ToTokens, M: Display>(&self, obj: T, msg: M) {
        self.syn_error(syn::Error::new_spanned(obj.into_token_stream(), msg));
    }

    /// An error at one span.
    pub(crate) fn error_at<M: Display>(&self, span: Span, msg: M) {
        self.syn_error(syn::Error::new(span, msg));
    }

    /// A parse error from syn, kept as it is.
    pub(crate) fn syn_error(&self, err: syn::Error) {
        self.errors.borrow_mut().push(err);
    }

    /// Every error recorded, combined into one in the order they were recorded,
    /// or `Ok` if there were none. Consumes the context: nothing can be recorded
    /// after the check.
    pub(crate) fn check(mut self) -> syn::Result<()> {
        self.checked = true;
        let mut errors = self.errors.take().into_iter();
        let Some(mut combined) = errors.next() else {
            return Ok(());
        };
        for err in errors {
            combined.combine(err);
        }
        Err(combined)
    }
}

impl Drop for Ctxt {
    fn drop(&mut self) {
        // Not while unwinding: a second panic would abort and hide the first.
        if !self.checked && !std::thread::panicking() {
            panic!("#[distributed_lock]: an error context was dropped without `Ctxt::check`");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Ctxt;
    use proc_macro2::Span;

    #[test]
    fn check_combines_in_order() {
        let cx = Ctxt::new();
        cx.error_at(Span::call_site(), "first");
        cx.error_at(Span::call_site(), "second");
        let messages: Vec<String> = cx
            .check()
            .unwrap_err()
            .into_iter()
            .map(|e| e.to_string())
            .collect();
        assert_eq!(messages, ["first", "second"]);
        assert!(Ctxt::new().check().is_ok());
    }

    #[test]
    #[should_panic(expected = "without `Ctxt::check`")]
    fn unchecked_drop_panics() {
        let cx = Ctxt::new();
        cx.error_at(Span::call_site(), "lost");
    }
}
