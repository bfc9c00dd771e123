//! Code generation: the annotated function, rewritten to run its body while
//! holding the lock.
//!
//! For an `async fn` the expansion has this shape (`<crate>` is `::redlock` or
//! the `crate = "..."` path; `__redlock_*` locals are hygienic, invisible to the
//! body):
//!
//! ```text
//! #[attrs] vis async fn buy(goods_id: u64, qty: u32) -> Result<Order, ShopError> where ... {
//!     // only with `manager = EXPR`, evaluated once:
//!     let __redlock_manager_ref: &<crate>::LockManager = &(EXPR);
//!     let __redlock_manager: <crate>::LockManager = // a clone, the explicit one or the global
//!         match <crate>::__private::resolve_manager(Some(__redlock_manager_ref) /* or None */) {
//!             Ok(m) => m,
//!             Err(e) => return Err(From::from(e)),
//!         };
//!     let __redlock_key = {
//!         let mut __redlock_k = <crate>::__private::key_buffer(&__redlock_manager, HINT);
//!         let _ = Write::write_fmt(&mut __redlock_k, format_args!("buy_{{{}}}", goods_id));
//!         __redlock_k
//!     };
//!     let __redlock_call = match <crate>::__private::enter(
//!         __redlock_manager,
//!         __redlock_key,
//!         CallOptions {
//!             kind: Mode::Exclusive, // `Read` (mode = "read"), `Fair` (mode = "fair"), `Permit(4u32)` (permits = 4)
//!             ttl: Some(Duration::from_millis(10000u64)),
//!             wait: None,
//!             hold_at_least: None,
//!             watchdog: true,
//!             abort_on_lost: true,
//!             name: "buy_<goods_id>", // the key template(s), for the metrics
//!         },
//!     ).await {
//!         Ok(c) => c,
//!         Err(e) => return Err(From::from(e)),
//!     };
//!     let g: &<crate>::LockGuard = __redlock_call.guard(); // only with `guard = g`
//!     let __redlock_result = __redlock_call.run(async move {
//!         if let Some(__redlock_ret) = None::<RET> { return __redlock_ret; } // fixes the type early
//!         let __redlock_ret: RET = BODY; // `return` and `?` in BODY leave this block
//!         __redlock_ret
//!     }).await;
//!     __redlock_call.finish().await;
//!     __redlock_result
//! }
//! ```
//!
//! With `keys = ["account_<from>", "account_<to>"]`, `__redlock_key` is an
//! array of such key blocks, `enter_all` takes it in place of `enter`, and
//! `guard = g` is a `&<crate>::MultiGuard`.
//!
//! `RET` is the declared return type with any `impl Trait` replaced by `_`.
//! The manager borrow ends at `resolve_manager` and the key's at `enter`, so the
//! body may move `self` or any parameter the manager expression or the key borrowed.
//!
//! A method already transformed by `#[async_trait]` is a plain `fn` whose body
//! ends in `Box::pin(async move { ... })`; the prelude then goes at the start of
//! a new `async move` block given to the same `Box::pin`, and the original block
//! is the future passed to `run`:
//!
//! ```text
//! fn m<'life0, 'async_trait>(&'life0 self, ...) -> Pin<Box<dyn Future<Output = RET> + Send + 'async_trait>> {
//!     Box::pin(async move {
//!         if let Some(__redlock_ret) = None::<RET> { return __redlock_ret; }
//!         PRELUDE
//!         let __redlock_result = __redlock_call.run(async move {
//!             /* as #[async_trait] wrote it, with `let _ = (&id,);` (the key's
//!                bindings) just before the body */
//!         }).await;
//!         __redlock_call.finish().await;
//!         __redlock_result
//!     })
//! }
//! ```

use proc_macro2::{Literal, Span, TokenStream};
use quote::{quote, quote_spanned, ToTokens};
use syn::spanned::Spanned;
use syn::visit_mut::VisitMut;
use syn::{parse_quote, AttrStyle, Attribute, ExprAsync, Ident, ItemFn, LitStr, Path, Stmt, Type};

use crate::async_trait::AsyncTraitBody;
use crate::attr::{DurationLit, Mode, OnLost, Options};
use crate::ctxt::Ctxt;
use crate::key_template::{KeyTemplate, Scope};
use crate::valid;

/// Expands `#[distributed_lock(args)] item`.
pub(crate) fn expand(args: TokenStream, item: TokenStream) -> TokenStream {
    let cx = Ctxt::new();
    let options = Options::parse(&cx, args);
    valid::check_options(&cx, &options);
    let func: ItemFn = match syn::parse2(item.clone()) {
        Ok(func) => func,
        Err(_) => {
            not_a_function(&cx, item.clone());
            return with_errors(cx, item);
        }
    };

    let async_trait = AsyncTraitBody::from_fn(&func);
    let ret = valid::check_function(&cx, &func, async_trait.as_ref());
    let scope = Scope::from_fn(&func, async_trait.as_ref().map(|body| &body.future.block));
    let keys = Keys::parse(&cx, &options, &scope);
    let krate: Path = match options.krate.get() {
        Some(path) => path.clone(),
        None => parse_quote!(::redlock),
    };

    if let Err(err) = cx.check() {
        return error_output(err, &func, &options, &krate);
    }
    let (Some(ret), Some(keys)) = (ret, keys) else {
        // Unreachable: a missing return type or key has been reported above.
        let err = syn::Error::new(Span::call_site(), "#[distributed_lock]: invalid input");
        return error_output(err, &func, &options, &krate);
    };

    let expansion = Expansion::new(krate, &options, keys, ret);
    match &async_trait {
        None => expansion.async_fn(&func),
        Some(body) => expansion.async_trait_fn(&func, body),
    }
}

/// The locks one call takes.
enum Keys {
    /// `key = "..."`: one lock, of the kind `mode` or `permits` asks for.
    One(KeyTemplate),
    /// `keys = [...]`: every key, exclusively, all or nothing.
    All(Vec<KeyTemplate>),
}

impl Keys {
    /// Scans `key` or every template of `keys` (all of them, even after one
    /// failed, so that each one's mistakes are reported).
    fn parse(cx: &Ctxt, options: &Options, scope: &Scope) -> Option<Keys> {
        let one = options
            .key
            .get()
            .map(|lit| KeyTemplate::parse(cx, lit, scope));
        let all = options.keys.get().map(|lits| {
            lits.iter()
                .map(|lit| KeyTemplate::parse(cx, lit, scope))
                .collect::<Vec<_>>()
        });
        match (one, all) {
            (Some(one), _) => one.map(Keys::One),
            (None, Some(all)) => all.into_iter().collect::<Option<_>>().map(Keys::All),
            (None, None) => None,
        }
    }

    fn templates(&self) -> &[KeyTemplate] {
        match self {
            Keys::One(template) => std::slice::from_ref(template),
            Keys::All(templates) => templates,
        }
    }
}

/// The error for an item that is not a function with a body.
fn not_a_function(cx: &Ctxt, item: TokenStream) {
    if let Ok(decl) = syn::parse2::<syn::TraitItemFn>(item) {
        if decl.default.is_none() {
            cx.error_spanned_by(
                &decl.sig,
                "#[distributed_lock] needs the function's body: put it on the method in the \
                 `impl`, not on the trait's declaration",
            );
            return;
        }
    }
    cx.error_at(
        Span::call_site(),
        "#[distributed_lock] can only be used on an `async fn`",
    );
}

/// Every recorded error, then `item` untouched.
fn with_errors(cx: Ctxt, item: TokenStream) -> TokenStream {
    let errors = cx.check().err().map(|err| err.to_compile_error());
    quote!(#errors #item)
}

/// The errors, then the function as it was written, so that the only errors
/// the user sees are the real ones. With `guard = g`, the body still gets a `g`
/// (of the right type, never evaluated), so that its uses are not reported too.
fn error_output(err: syn::Error, func: &ItemFn, options: &Options, krate: &Path) -> TokenStream {
    let errors = err.to_compile_error();
    let Some(guard) = options.guard.get() else {
        return quote!(#errors #func);
    };
    let guard_type = if options.keys.is_written() && !options.key.is_written() {
        quote!(MultiGuard)
    } else {
        quote!(LockGuard)
    };
    let dummy = syn::parse2::<Stmt>(quote! {
        #[allow(unused_variables, unreachable_code)]
        let #guard: &#krate::#guard_type = {
            fn __redlock_never<T>() -> T {
                ::core::unreachable!()
            }
            __redlock_never()
        };
    });
    let Ok(dummy) = dummy else {
        return quote!(#errors #func);
    };
    let mut func = func.clone();
    func.block.stmts.insert(0, dummy);
    quote!(#errors #func)
}

/// Everything needed to write the expansion of a valid input.
struct Expansion<'a> {
    krate: Path,
    options: &'a Options,
    keys: Keys,
    /// The body's output type, `impl Trait` erased to `_`.
    ret: Type,
    /// `if let Some(r) = None::<RET> { return r; }`: an unreachable `return`
    /// of the declared type at the start of the future that holds the body,
    /// so that the compiler knows the future's output type before it checks
    /// the body (a body ending in `Ok(x)` or only `?`-returning errors needs
    /// it). Written once here, put where each shape's future starts.
    fake_return: TokenStream,
}

/// The hygienic name of one of the expansion's locals.
fn local(name: &str) -> Ident {
    Ident::new(name, Span::mixed_site())
}

impl<'a> Expansion<'a> {
    fn new(krate: Path, options: &'a Options, keys: Keys, ret: &Type) -> Self {
        let ret = erase_impl_trait(ret);
        let core = quote!(#krate::__private::core);
        let ret_value = local("__redlock_ret");
        let fake_return = quote_spanned! {Span::mixed_site()=>
            if let #core::option::Option::Some(#ret_value) = #core::option::Option::None::<#ret> {
                #[allow(unreachable_code)]
                return #ret_value;
            }
        };
        Expansion {
            krate,
            options,
            keys,
            ret,
            fake_return,
        }
    }

    /// An `async fn`: the prelude, then the body in `run`.
    fn async_fn(&self, func: &ItemFn) -> TokenStream {
        let (outer_attrs, inner_attrs) = split_attrs(&func.attrs);
        let vis = &func.vis;
        let sig = &func.sig;
        let ret = &self.ret;
        let body = &func.block;
        let prelude = self.prelude();
        let call = local("__redlock_call");
        let result = local("__redlock_result");
        let ret_value = local("__redlock_ret");
        let fake_return = &self.fake_return;
        let body_future = quote_spanned! {Span::mixed_site()=>
            async move {
                #fake_return
                // A body that is only `todo!()` or `panic!()` is fine.
                #[allow(clippy::diverging_sub_expression)]
                let #ret_value: #ret = #body;
                #[allow(unreachable_code)]
                #ret_value
            }
        };
        let run = quote_spanned! {Span::mixed_site()=>
            let #result = #call.run(#body_future).await;
            #call.finish().await;
            #result
        };
        quote! {
            #(#outer_attrs)*
            #vis #sig {
                #(#inner_attrs)*
                #prelude
                #run
            }
        }
    }

    /// A method transformed by `#[async_trait]`: the prelude at the start of a
    /// new `async move` block, the original block given to `run`.
    fn async_trait_fn(&self, func: &ItemFn, body: &AsyncTraitBody<'_>) -> TokenStream {
        let (outer_attrs, inner_attrs) = split_attrs(&func.attrs);
        let vis = &func.vis;
        let sig = &func.sig;
        let before = &func.block.stmts[..body.stmt_index.min(func.block.stmts.len())];
        let box_pin = body.box_pin;
        let future = self.use_key_roots(body);
        let prelude = self.prelude();
        let call = local("__redlock_call");
        let result = local("__redlock_result");
        let fake_return = &self.fake_return;
        let locked = quote_spanned! {Span::mixed_site()=>
            async move {
                #fake_return
                #prelude
                let #result = #call.run(#future).await;
                #call.finish().await;
                #result
            }
        };
        quote! {
            #(#outer_attrs)*
            #vis #sig {
                #(#inner_attrs)*
                #(#before)*
                #box_pin(#locked)
            }
        }
    }

    /// `#[async_trait]` moves each by-value parameter into its future
    /// (`let id = id;`), where one read only by the key (which is built before
    /// the future) would be reported unused: the future reads the key's
    /// bindings once, before the body (`let _ = (&id,);`).
    fn use_key_roots(&self, body: &AsyncTraitBody<'_>) -> ExprAsync {
        let mut future = body.future.clone();
        let mut roots: Vec<&Ident> = Vec::new();
        for root in self.keys.templates().iter().flat_map(KeyTemplate::roots) {
            if !roots.contains(&root) {
                roots.push(root);
            }
        }
        let body_at = body.body_index();
        if let (false, Some(index)) = (roots.is_empty(), body_at) {
            let stmt: Stmt = parse_quote!(let _ = (#(&#roots,)*););
            future.block.stmts.insert(index, stmt);
        }
        future
    }

    /// `<crate>::__private::core`.
    fn core(&self) -> TokenStream {
        let krate = &self.krate;
        quote!(#krate::__private::core)
    }

    /// Resolves the manager, builds the key, enters the lock and binds the
    /// guard; an error returns `Err(From::from(error))` from the enclosing body.
    fn prelude(&self) -> TokenStream {
        let krate = &self.krate;
        let core = self.core();
        let manager = local("__redlock_manager");
        let key = local("__redlock_key");
        let call = local("__redlock_call");
        let value = local("__redlock_value");
        let error = local("__redlock_error");

        let (manager_ref_stmt, explicit) = self.explicit_manager();
        let (key_value, enter, guard_type) = self.key_and_enter();
        let call_options = self.call_options();
        let guard = self.bind_guard(&guard_type);
        let bail = quote_spanned! {Span::mixed_site()=>
            return #core::result::Result::Err(#core::convert::From::from(#error))
        };

        quote_spanned! {Span::mixed_site()=>
            #manager_ref_stmt
            let #manager: #krate::LockManager = match #krate::__private::resolve_manager(#explicit) {
                #core::result::Result::Ok(#value) => #value,
                #core::result::Result::Err(#error) => #bail,
            };
            let #key = #key_value;
            let #call = match #krate::__private::#enter(
                #manager,
                #key,
                #call_options,
            )
            .await
            {
                #core::result::Result::Ok(#value) => #value,
                #core::result::Result::Err(#error) => #bail,
            };
            #guard
        }
    }

    /// With `manager = EXPR`: the statement that borrows the manager once, and
    /// `Some(that borrow)` for `resolve_manager`. Without it: nothing, and
    /// `None` (the global manager).
    fn explicit_manager(&self) -> (TokenStream, TokenStream) {
        let krate = &self.krate;
        let core = self.core();
        let manager_ref = local("__redlock_manager_ref");
        match self.options.manager.get() {
            Some(expr) => {
                let stmt = quote_spanned! {expr.span()=>
                    let #manager_ref: &#krate::LockManager = &(#expr);
                };
                let explicit = quote_spanned! {Span::mixed_site()=>
                    #core::option::Option::Some(#manager_ref)
                };
                (stmt, explicit)
            }
            None => (
                TokenStream::new(),
                quote_spanned!(Span::mixed_site()=> #core::option::Option::None),
            ),
        }
    }

    /// The key (or the array of keys), the `__private` function that enters
    /// the lock with it, and the type of the guard that function gives.
    fn key_and_enter(&self) -> (TokenStream, TokenStream, TokenStream) {
        // `enter` takes one key, `enter_all` an array of them; the guard type
        // follows.
        match &self.keys {
            Keys::One(template) => (self.key_expr(template), quote!(enter), quote!(LockGuard)),
            Keys::All(templates) => {
                let keys = templates.iter().map(|template| self.key_expr(template));
                (
                    quote_spanned!(Span::mixed_site()=> [#(#keys),*]),
                    quote!(enter_all),
                    quote!(MultiGuard),
                )
            }
        }
    }

    /// A block that renders one key template into a buffer sized for it.
    fn key_expr(&self, template: &KeyTemplate) -> TokenStream {
        let krate = &self.krate;
        let manager = local("__redlock_manager");
        let buffer = local("__redlock_k");
        let hint = Literal::usize_unsuffixed(template.capacity_hint());
        let write = template.write_to(krate, &buffer);
        quote_spanned! {Span::mixed_site()=>
            {
                let mut #buffer = #krate::__private::key_buffer(&#manager, #hint);
                #write
                #buffer
            }
        }
    }

    /// The `CallOptions` the options ask for, each absent one at its default.
    fn call_options(&self) -> TokenStream {
        let krate = &self.krate;
        let kind = self.call_kind();
        let ttl = self.duration(self.options.ttl.get());
        let wait = self.duration(self.options.wait.get());
        let hold_at_least = self.duration(self.options.hold_at_least.get());
        let watchdog = match self.options.watchdog.get() {
            Some(lit) => lit.into_token_stream(),
            None => quote!(true),
        };
        let abort_on_lost = match self.options.on_lost.get() {
            Some(OnLost::Continue) => quote!(false),
            Some(OnLost::Abort) | None => quote!(true),
        };
        let name = self.metrics_name();
        quote_spanned! {Span::mixed_site()=>
            #krate::__private::CallOptions {
                kind: #krate::__private::Mode::#kind,
                ttl: #ttl,
                wait: #wait,
                hold_at_least: #hold_at_least,
                watchdog: #watchdog,
                abort_on_lost: #abort_on_lost,
                name: #name,
            }
        }
    }

    /// The runtime's `Mode` variant: `Permit(N)`, `Read`, `Fair` or `Exclusive`.
    fn call_kind(&self) -> TokenStream {
        match (self.options.permits.get(), self.options.mode.get()) {
            (Some(&permits), _) => {
                let permits = Literal::u32_suffixed(permits);
                quote!(Permit(#permits))
            }
            (None, Some(Mode::Read)) => quote!(Read),
            (None, Some(Mode::Fair)) => quote!(Fair),
            (None, Some(Mode::Exclusive) | None) => quote!(Exclusive),
        }
    }

    /// A duration option as an `Option<Duration>`, spanned at its literal.
    fn duration(&self, lit: Option<&DurationLit>) -> TokenStream {
        let core = self.core();
        match lit {
            Some(duration) => {
                let millis = Literal::u64_suffixed(duration.millis);
                quote_spanned! {duration.lit.span()=>
                    #core::option::Option::Some(#core::time::Duration::from_millis(#millis))
                }
            }
            None => quote_spanned!(Span::mixed_site()=> #core::option::Option::None),
        }
    }

    /// The metrics' `name`: the template as written, never the concrete key.
    fn metrics_name(&self) -> String {
        self.keys
            .templates()
            .iter()
            .map(KeyTemplate::text)
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// With `guard = g`: `let g: &<crate>::GUARD_TYPE = __redlock_call.guard();`.
    fn bind_guard(&self, guard_type: &TokenStream) -> Option<TokenStream> {
        let krate = &self.krate;
        let call = local("__redlock_call");
        self.options.guard.get().map(|guard| {
            quote_spanned! {Span::mixed_site()=>
                let #guard: &#krate::#guard_type = #call.guard();
            }
        })
    }
}

/// Splits a function's attributes into the outer ones and the inner ones
/// (`#![...]` at the top of the body, which syn keeps with the outer ones).
fn split_attrs(attrs: &[Attribute]) -> (Vec<&Attribute>, Vec<&Attribute>) {
    attrs
        .iter()
        .partition(|attr| matches!(attr.style, AttrStyle::Outer))
}

/// `ty` with every `impl Trait` replaced by `_`, so that it can annotate a `let`.
fn erase_impl_trait(ty: &Type) -> Type {
    struct Eraser;
    impl VisitMut for Eraser {
        fn visit_type_mut(&mut self, ty: &mut Type) {
            if let Type::ImplTrait(imp) = ty {
                *ty = Type::Infer(syn::TypeInfer {
                    underscore_token: syn::Token![_](imp.span()),
                });
            } else {
                syn::visit_mut::visit_type_mut(self, ty);
            }
        }
    }
    let mut ty = ty.clone();
    Eraser.visit_type_mut(&mut ty);
    ty
}

/// `key!("template")`: the template rendered from the variables in scope.
pub(crate) fn key(input: TokenStream) -> TokenStream {
    let lit: LitStr = match syn::parse2(input) {
        Ok(lit) => lit,
        Err(err) => return err.to_compile_error(),
    };
    let cx = Ctxt::new();
    if lit.value().is_empty() {
        cx.error_spanned_by(&lit, "empty key template");
    }
    let template = KeyTemplate::parse(&cx, &lit, &Scope::call_site());
    if let Err(err) = cx.check() {
        return err.to_compile_error();
    }
    let krate: Path = parse_quote!(::redlock);
    template.map_or_else(TokenStream::new, |t| t.render(&krate))
}
