//! Recognising a method body already transformed by `#[async_trait]`.
//!
//! `#[async_trait]` runs first when it is written above the impl, so the macro
//! sees a plain `fn` returning `Pin<Box<dyn Future<Output = T> + Send + '_>>`
//! whose last expression is `Box::pin(async move { ... })`. The lock then goes
//! around that `async move` block (found the way tracing-attributes' `AsyncInfo`
//! finds it).

use syn::TypeParamBound;
use syn::{Expr, ExprAsync, GenericArgument, ItemFn, Pat, PathArguments, ReturnType, Stmt, Type};

/// A method body as `#[async_trait]` writes it: a non-`async` fn whose last
/// expression is `Box::pin(async move { ... })` and whose return type is a
/// boxed `Future<Output = T>`.
pub(crate) struct AsyncTraitBody<'a> {
    /// The `T` of `Future<Output = T>`.
    pub(crate) output: &'a Type,
    /// The position of the `Box::pin(...)` statement in the fn's block.
    pub(crate) stmt_index: usize,
    /// The `Box::pin` path, kept as written.
    pub(crate) box_pin: &'a Expr,
    /// The `async move { ... }` argument.
    pub(crate) future: &'a ExprAsync,
}

impl<'a> AsyncTraitBody<'a> {
    /// The `#[async_trait]` shape of `func`, if it has it.
    pub(crate) fn from_fn(func: &'a ItemFn) -> Option<Self> {
        if func.sig.asyncness.is_some() {
            return None;
        }
        let ReturnType::Type(_, ret) = &func.sig.output else {
            return None;
        };
        let output = future_output(ret)?;
        let (stmt_index, last) =
            func.block
                .stmts
                .iter()
                .enumerate()
                .next_back()
                .and_then(|(i, stmt)| match stmt {
                    Stmt::Expr(expr, None) => Some((i, expr)),
                    _ => None,
                })?;
        let Expr::Call(call) = last else {
            return None;
        };
        let Expr::Path(path) = &*call.func else {
            return None;
        };
        let mut segments = path.path.segments.iter().rev();
        let is_box_pin = segments.next().is_some_and(|s| s.ident == "pin")
            && segments.next().is_some_and(|s| s.ident == "Box");
        if !is_box_pin || call.args.len() != 1 {
            return None;
        }
        let Some(Expr::Async(future)) = call.args.first() else {
            return None;
        };
        Some(AsyncTraitBody {
            output,
            stmt_index,
            box_pin: &call.func,
            future,
        })
    }

    /// Where, in the future's block, `#[async_trait]` put the original body
    /// (the `let __ret: RET = { ... };` statement), after its parameter moves.
    pub(crate) fn body_index(&self) -> Option<usize> {
        self.future.block.stmts.iter().position(is_ret_binding)
    }
}

/// `let __ret: RET = BLOCK;`, the statement where `#[async_trait]` puts the body.
fn is_ret_binding(stmt: &Stmt) -> bool {
    let Stmt::Local(local) = stmt else {
        return false;
    };
    let pat = match &local.pat {
        Pat::Type(typed) => &*typed.pat,
        other => other,
    };
    matches!(pat, Pat::Ident(pat) if pat.ident == "__ret")
}

/// The `Output = T` of the `Future` in an `#[async_trait]` return type
/// (`Pin<Box<dyn Future<Output = T> + Send + 'async_trait>>`).
fn future_output(ty: &Type) -> Option<&Type> {
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
