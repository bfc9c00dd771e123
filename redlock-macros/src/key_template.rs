//! The key template: `key = "buy_<goods_id>"`.
//!
//! The literal is scanned into text and placeholder pieces (`<name>`,
//! `<name.field.field>`, `<self.field>`; `<<` is a literal `<`). Each
//! placeholder's root name is resolved against the function's parameters,
//! including the bindings inside destructuring patterns (`Path(id): Path<u64>`
//! gives `<id>`). Errors are spanned inside the literal where the compiler can
//! point there, at the whole literal otherwise.
//!
//! The hash tag rule: a template that contains `{...}` is used as written;
//! otherwise the part from the start of the first placeholder to the end of the
//! last one is wrapped in `{}` (`"buy_<goods_id>"` → `buy_{42}`), so every key of
//! one template lands in one Redis Cluster slot per value. A template without
//! placeholders is used as written: `key = "nightly_report"` is the lock
//! `locks.lock("nightly_report")` takes. `redlock::key!` renders a template with the
//! same code, from the variables in scope, for code that takes the lock by hand.

use std::collections::BTreeSet;

use proc_macro2::{Span, TokenStream};
use quote::{quote, quote_spanned};
use syn::ext::IdentExt;
use syn::parse::Parser;
use syn::visit_mut::VisitMut;
use syn::{Block, Expr, FnArg, Ident, ItemFn, LitStr, Member, Pat, Path, Stmt};

use crate::ctxt::Ctxt;

/// Capacity reserved per placeholder when sizing the key buffer (a `u64` is at
/// most 20 digits).
const PLACEHOLDER_HINT: usize = 20;

/// The names a placeholder may start with.
pub(crate) struct Scope {
    /// `None` for `key!`, whose placeholders name any variable in scope.
    fn_name: Option<Ident>,
    /// The span of the `self` token, if the function has a receiver.
    receiver: Option<Span>,
    bindings: Vec<Binding>,
}

/// A name bound by a parameter.
struct Binding {
    /// The binding as declared (its span carries the name's hygiene).
    ident: Ident,
    source: Source,
}

/// Where a binding can be read at the point the key is built.
enum Source {
    /// In scope as it is.
    InScope,
    /// Bound by `let PAT = PARAM;` inside an `#[async_trait]` body: the key
    /// destructures `&PARAM` with the same pattern to reach it.
    Destructure { param: Ident, pat: Box<Pat> },
}

impl Scope {
    /// The names of `func`'s parameters. `async_trait_block` is the body of an
    /// `#[async_trait]`-transformed method, whose parameters with patterns
    /// were renamed `__argN` in the signature and destructured in the body.
    pub(crate) fn from_fn(func: &ItemFn, async_trait_block: Option<&Block>) -> Scope {
        let mut scope = Scope {
            fn_name: Some(func.sig.ident.clone()),
            receiver: None,
            bindings: Vec::new(),
        };
        let mut params = Vec::new();
        for input in &func.sig.inputs {
            match input {
                FnArg::Receiver(receiver) => scope.receiver = Some(receiver.self_token.span),
                FnArg::Typed(typed) => {
                    if let Pat::Ident(pat) = &*typed.pat {
                        params.push(pat.ident.clone());
                    }
                    for ident in pat_bindings(&typed.pat) {
                        scope.bindings.push(Binding {
                            ident,
                            source: Source::InScope,
                        });
                    }
                }
            }
        }
        let Some(block) = async_trait_block else {
            return scope;
        };
        for stmt in &block.stmts {
            let Stmt::Local(local) = stmt else { continue };
            let Some(init) = &local.init else { continue };
            if init.diverge.is_some() {
                continue;
            }
            let Some(param) = init_param(&init.expr, &params) else {
                continue;
            };
            if let Pat::Ident(pat) = &local.pat {
                if pat.ident == *param && pat.subpat.is_none() {
                    continue; // `let x = x;`
                }
            }
            for ident in pat_bindings(&local.pat) {
                scope.bindings.push(Binding {
                    ident,
                    source: Source::Destructure {
                        param: param.clone(),
                        pat: Box::new(local.pat.clone()),
                    },
                });
            }
        }
        scope
    }

    /// The scope of `key!`: every name, `self` included, is looked up where the macro
    /// is called.
    pub(crate) fn call_site() -> Scope {
        Scope {
            fn_name: None,
            receiver: Some(Span::call_site()),
            bindings: Vec::new(),
        }
    }

    fn lookup(&self, name: &str) -> Option<&Binding> {
        self.bindings
            .iter()
            .rev()
            .find(|binding| binding.ident.unraw() == name)
    }

    /// The parameter names a user can write, for error messages.
    fn describe(&self) -> String {
        let mut names: Vec<String> = Vec::new();
        if self.receiver.is_some() {
            names.push("`self`".to_owned());
        }
        for binding in &self.bindings {
            let name = format!("`{}`", binding.ident.unraw());
            if !name.starts_with("`__") && !names.contains(&name) {
                names.push(name);
            }
        }
        let fn_name = self
            .fn_name
            .as_ref()
            .map_or_else(String::new, Ident::to_string);
        if names.is_empty() {
            format!("`{fn_name}` has no parameters")
        } else {
            format!("the parameters of `{fn_name}` are {}", names.join(", "))
        }
    }
}

/// `PARAM` in `let PAT = PARAM;`, or in `let PAT = { let PARAM = PARAM; PARAM };`
/// (what `#[async_trait]` writes), if `PARAM` is one of `params`.
fn init_param<'a>(expr: &Expr, params: &'a [Ident]) -> Option<&'a Ident> {
    let single_ident = |expr: &Expr| -> Option<Ident> {
        match expr {
            Expr::Path(path) if path.qself.is_none() => path.path.get_ident().cloned(),
            _ => None,
        }
    };
    let ident = match expr {
        Expr::Block(block) if block.block.stmts.len() == 2 => match block.block.stmts.last() {
            Some(Stmt::Expr(expr, None)) => single_ident(expr)?,
            _ => return None,
        },
        other => single_ident(other)?,
    };
    params.iter().find(|param| **param == ident)
}

/// Every name bound by a pattern, in order.
fn pat_bindings(pat: &Pat) -> Vec<Ident> {
    let mut out = Vec::new();
    collect_bindings(pat, &mut out);
    out
}

fn collect_bindings(pat: &Pat, out: &mut Vec<Ident>) {
    match pat {
        Pat::Ident(pat) => {
            out.push(pat.ident.clone());
            if let Some((_, sub)) = &pat.subpat {
                collect_bindings(sub, out);
            }
        }
        Pat::Tuple(tuple) => tuple.elems.iter().for_each(|p| collect_bindings(p, out)),
        Pat::TupleStruct(tuple) => tuple.elems.iter().for_each(|p| collect_bindings(p, out)),
        Pat::Struct(strukt) => strukt
            .fields
            .iter()
            .for_each(|field| collect_bindings(&field.pat, out)),
        Pat::Slice(slice) => slice.elems.iter().for_each(|p| collect_bindings(p, out)),
        Pat::Reference(reference) => collect_bindings(&reference.pat, out),
        Pat::Paren(paren) => collect_bindings(&paren.pat, out),
        Pat::Type(typed) => collect_bindings(&typed.pat, out),
        // Every alternative binds the same names.
        Pat::Or(or) => {
            if let Some(first) = or.cases.first() {
                collect_bindings(first, out);
            }
        }
        _ => {}
    }
}

/// A parsed key template whose placeholders all resolved.
pub(crate) struct KeyTemplate {
    lit: LitStr,
    pieces: Vec<Piece>,
    /// Whether the template already has a `{...}` hash tag.
    has_hash_tag: bool,
}

enum Piece {
    Text(String),
    Placeholder(Placeholder),
}

/// A resolved placeholder.
struct Placeholder {
    /// The expression that is formatted with `Display`: `goods_id`, `self.tenant`.
    expr: TokenStream,
    /// The destructuring it needs first, if its root is bound in an
    /// `#[async_trait]` body: `(param, pattern)`.
    destructure: Option<(Ident, Box<Pat>)>,
    /// The binding it starts from, unless that is `self`.
    root: Option<Ident>,
}

impl KeyTemplate {
    /// Scans `lit` and resolves its placeholders in `scope`, reporting every
    /// problem in `cx`. `None` if there was any.
    pub(crate) fn parse(cx: &Ctxt, lit: &LitStr, scope: &Scope) -> Option<KeyTemplate> {
        let value = lit.value();
        let offset = source_offset(lit, &value);
        let span_of = |start: usize, end: usize| -> Span {
            offset
                .and_then(|offset| lit.token().subspan(offset + start..offset + end))
                .unwrap_or_else(|| lit.span())
        };

        let mut ok = true;
        let mut pieces = Vec::new();
        let mut text = String::new();
        let mut rest = value.char_indices().peekable();
        while let Some((start, c)) = rest.next() {
            if c != '<' {
                text.push(c);
                continue;
            }
            if let Some((_, '<')) = rest.peek() {
                rest.next();
                text.push('<');
                continue;
            }
            let Some(len) = value[start + 1..].find('>') else {
                cx.error_at(
                    span_of(start, value.len()),
                    format_args!(
                        "unclosed placeholder in key \"{value}\": `<` without a matching `>` \
                         (write `<<` for a literal `<`)"
                    ),
                );
                ok = false;
                break;
            };
            let end = start + 1 + len + 1;
            let inner = &value[start + 1..end - 1];
            // Skip the placeholder's characters.
            while rest.peek().is_some_and(|(i, _)| *i < end) {
                rest.next();
            }
            if !text.is_empty() {
                pieces.push(Piece::Text(std::mem::take(&mut text)));
            }
            match resolve(inner, span_of(start, end), scope) {
                Ok(placeholder) => pieces.push(Piece::Placeholder(placeholder)),
                Err(err) => {
                    cx.syn_error(err);
                    ok = false;
                }
            }
        }
        if !text.is_empty() {
            pieces.push(Piece::Text(text));
        }
        if !ok {
            return None;
        }

        // A hash tag is a `{` with a `}` somewhere after it, in the text pieces.
        let mut flat = String::new();
        for piece in &pieces {
            match piece {
                Piece::Text(text) => flat.push_str(text),
                Piece::Placeholder(_) => flat.push('_'),
            }
        }
        let has_hash_tag = flat
            .find('{')
            .is_some_and(|open| flat[open + 1..].contains('}'));
        Some(KeyTemplate {
            lit: lit.clone(),
            pieces,
            has_hash_tag,
        })
    }

    /// Statements appending the key (after the manager's prefix) to `buffer`, a
    /// `String`; `krate` is the path to the facade.
    pub(crate) fn write_to(&self, krate: &Path, buffer: &Ident) -> TokenStream {
        let span = self.lit.span();
        let placeholders: Vec<&Placeholder> = self
            .pieces
            .iter()
            .filter_map(|piece| match piece {
                Piece::Placeholder(placeholder) => Some(placeholder),
                Piece::Text(_) => None,
            })
            .collect();

        if placeholders.is_empty() {
            let key = LitStr::new(&self.format_string(), span);
            return quote_spanned! {Span::mixed_site()=>
                #krate::__private::std::string::String::push_str(&mut #buffer, #key);
            };
        }
        let format = self.format_string();
        let format = LitStr::new(&format, span);

        let mut destructured = BTreeSet::new();
        let destructures = placeholders.iter().filter_map(|placeholder| {
            let (param, pat) = placeholder.destructure.as_ref()?;
            if !destructured.insert(param.to_string()) {
                return None;
            }
            let mut pat = (**pat).clone();
            StripBindingModes.visit_pat_mut(&mut pat);
            Some(quote! {
                #[allow(unused_variables)]
                let #pat = &#param;
            })
        });
        let destructures: Vec<TokenStream> = destructures.collect();
        let args = placeholders.iter().map(|placeholder| &placeholder.expr);
        let write = quote_spanned! {Span::mixed_site()=>
            let _ = #krate::__private::core::fmt::Write::write_fmt(
                &mut #buffer,
                #krate::__private::core::format_args!(#format, #(#args),*),
            );
        };
        if destructures.is_empty() {
            write
        } else {
            quote! {{
                #(#destructures)*
                #write
            }}
        }
    }

    /// The key as a `format_args!` string with one `{}` per placeholder and the
    /// hash tag added (`"buy_{{{}}}"`); without placeholders, the key itself, as
    /// written (`"nightly_report"`).
    fn format_string(&self) -> String {
        let first = self
            .pieces
            .iter()
            .position(|piece| matches!(piece, Piece::Placeholder(_)));
        let Some(first) = first else {
            return self
                .pieces
                .iter()
                .map(|piece| match piece {
                    Piece::Text(text) => text.as_str(),
                    Piece::Placeholder(_) => "",
                })
                .collect();
        };
        let last = self
            .pieces
            .iter()
            .rposition(|piece| matches!(piece, Piece::Placeholder(_)))
            .unwrap_or(first);
        let mut format = String::new();
        for (i, piece) in self.pieces.iter().enumerate() {
            if !self.has_hash_tag && i == first {
                format.push_str("{{");
            }
            match piece {
                Piece::Text(text) => {
                    format.push_str(&text.replace('{', "{{").replace('}', "}}"));
                }
                Piece::Placeholder(_) => format.push_str("{}"),
            }
            if !self.has_hash_tag && i == last {
                format.push_str("}}");
            }
        }
        format
    }

    /// The template as written (`"buy_<goods_id>"`).
    pub(crate) fn text(&self) -> String {
        self.lit.value()
    }

    /// How many bytes to reserve for the key after the prefix.
    pub(crate) fn capacity_hint(&self) -> usize {
        self.pieces
            .iter()
            .map(|piece| match piece {
                Piece::Text(text) => text.len(),
                Piece::Placeholder(_) => PLACEHOLDER_HINT,
            })
            .sum::<usize>()
            + if self.has_hash_tag { 0 } else { 2 }
    }

    /// `key!`'s expansion: the rendered key as a `String`, built by the same
    /// [`write_to`](Self::write_to) the attribute's expansion uses.
    pub(crate) fn render(&self, krate: &Path) -> TokenStream {
        let buffer = Ident::new("__redlock_key", Span::mixed_site());
        let hint = proc_macro2::Literal::usize_unsuffixed(self.capacity_hint());
        let write = self.write_to(krate, &buffer);
        quote_spanned! {Span::mixed_site()=> {
            let mut #buffer = #krate::__private::std::string::String::with_capacity(#hint);
            #write
            #buffer
        }}
    }

    /// The bindings the placeholders start from, `self` excepted, each once.
    pub(crate) fn roots(&self) -> Vec<&Ident> {
        let mut seen = BTreeSet::new();
        self.pieces
            .iter()
            .filter_map(|piece| match piece {
                Piece::Placeholder(placeholder) => placeholder.root.as_ref(),
                Piece::Text(_) => None,
            })
            .filter(|root| seen.insert(root.to_string()))
            .collect()
    }
}

/// Where the literal's value starts in its source text, when value bytes map
/// one to one onto source bytes (no escapes, no suffix); `None` otherwise.
fn source_offset(lit: &LitStr, value: &str) -> Option<usize> {
    if !lit.suffix().is_empty() {
        return None;
    }
    let source = lit.token().to_string();
    let offset = if source.starts_with('"') {
        1
    } else if let Some(raw) = source.strip_prefix('r') {
        let hashes = raw.bytes().take_while(|b| *b == b'#').count();
        2 + hashes
    } else {
        return None;
    };
    let content = source.get(offset..source.len().checked_sub(offset)?)?;
    (content == value).then_some(offset)
}

/// Parses `name`, `name.field.0` or `self.field` and resolves the root name.
fn resolve(inner: &str, span: Span, scope: &Scope) -> syn::Result<Placeholder> {
    let invalid = || {
        syn::Error::new(
            span,
            format_args!(
                "invalid placeholder `<{inner}>`: expected `<name>`, `<name.field>` or \
                 `<self.field>` naming a parameter"
            ),
        )
    };
    if inner.is_empty() {
        return Err(syn::Error::new(
            span,
            "empty placeholder `<>`: expected `<name>` naming a parameter (write `<<` for a \
             literal `<`)",
        ));
    }
    let mut parts = inner.split('.');
    let root = parts.next().ok_or_else(invalid)?;
    let (mut expr, destructure, root) = if root == "self" {
        let Some(self_span) = scope.receiver else {
            return Err(syn::Error::new(
                span,
                format_args!(
                    "unknown placeholder `<{inner}>`: `{}` has no `self` parameter",
                    scope
                        .fn_name
                        .as_ref()
                        .map_or_else(String::new, Ident::to_string)
                ),
            ));
        };
        let ident = Ident::new("self", span.resolved_at(self_span));
        (quote!(#ident), None, None)
    } else {
        // Keywords are allowed, for raw identifiers: `<type>` names `r#type`.
        let name = Ident::parse_any.parse_str(root).map_err(|_| invalid())?;
        if scope.fn_name.is_none() {
            // `key!`: the variable of that name where the macro is called.
            let mut ident = name;
            ident.set_span(span);
            (quote!(#ident), None, Some(ident.clone()))
        } else {
            let name = name.unraw().to_string();
            let Some(binding) = scope.lookup(&name) else {
                return Err(syn::Error::new(
                    span,
                    format_args!(
                        "unknown placeholder `<{inner}>`: no parameter named `{name}`; {}",
                        scope.describe()
                    ),
                ));
            };
            let mut ident = binding.ident.clone();
            ident.set_span(span.resolved_at(binding.ident.span()));
            let destructure = match &binding.source {
                Source::InScope => None,
                Source::Destructure { param, pat } => Some((param.clone(), pat.clone())),
            };
            (quote!(#ident), destructure, Some(binding.ident.clone()))
        }
    };
    for field in parts {
        let member = if !field.is_empty() && field.bytes().all(|b| b.is_ascii_digit()) {
            let index: u32 = field.parse().map_err(|_| invalid())?;
            Member::Unnamed(syn::Index { index, span })
        } else {
            Member::Named(field_ident(field, span).ok_or_else(invalid)?)
        };
        expr = quote!(#expr.#member);
    }
    Ok(Placeholder {
        expr,
        destructure,
        root,
    })
}

/// The identifier of a named field: `id`, or `r#type` for `type`.
fn field_ident(field: &str, span: Span) -> Option<Ident> {
    if let Ok(mut ident) = syn::parse_str::<Ident>(field) {
        ident.set_span(span);
        return Some(ident);
    }
    let keyword = Ident::parse_any.parse_str(field).ok()?;
    let name = keyword.unraw().to_string();
    // These can't be raw identifiers (and no field is named so).
    if ["self", "Self", "super", "crate", "_"].contains(&name.as_str()) {
        return None;
    }
    Some(Ident::new_raw(&name, span))
}

/// Removes `ref`/`mut` from bindings, so that a pattern can match a reference
/// with default binding modes.
struct StripBindingModes;

impl VisitMut for StripBindingModes {
    fn visit_pat_ident_mut(&mut self, pat: &mut syn::PatIdent) {
        pat.by_ref = None;
        pat.mutability = None;
        syn::visit_mut::visit_pat_ident_mut(self, pat);
    }
}

#[cfg(test)]
mod tests {
    use super::{KeyTemplate, Scope};
    use crate::ctxt::Ctxt;
    use syn::{ItemFn, LitStr};

    /// The format string of `key` on `func`, or the errors.
    fn format(key: &str, func: &str) -> Result<String, String> {
        let func: ItemFn = syn::parse_str(func).map_err(|e| e.to_string())?;
        let lit: LitStr = syn::parse_str(&format!("{key:?}")).map_err(|e| e.to_string())?;
        let cx = Ctxt::new();
        let template = KeyTemplate::parse(&cx, &lit, &Scope::from_fn(&func, None));
        cx.check().map_err(|e| {
            e.into_iter()
                .map(|e| e.to_string())
                .collect::<Vec<_>>()
                .join("\n")
        })?;
        template
            .map(|t| t.format_string())
            .ok_or_else(|| "no template".to_owned())
    }

    const BUY: &str = "async fn buy(goods_id: u64, qty: u32) {}";

    #[test]
    fn hash_tag_wraps_the_placeholders() {
        assert_eq!(format("buy_<goods_id>", BUY).as_deref(), Ok("buy_{{{}}}"));
        assert_eq!(
            format("cart_<goods_id>_<qty>_x", BUY).as_deref(),
            Ok("cart_{{{}_{}}}_x")
        );
        assert_eq!(format("<goods_id>", BUY).as_deref(), Ok("{{{}}}"));
    }

    #[test]
    fn hash_tag_as_written() {
        assert_eq!(
            format("order:{<goods_id>}:<qty>", BUY).as_deref(),
            Ok("order:{{{}}}:{}")
        );
        assert_eq!(format("{fixed}_<qty>", BUY).as_deref(), Ok("{{fixed}}_{}"));
        assert_eq!(format("{global}", BUY).as_deref(), Ok("{global}"));
    }

    #[test]
    fn no_placeholder_is_used_as_written() {
        // Issue 24, item 1: `key = "nightly_report"` locked `lock:{nightly_report}`,
        // while `locks.lock("nightly_report")` locks `lock:nightly_report`.
        assert_eq!(format("nightly", BUY).as_deref(), Ok("nightly"));
        // A lone brace is no hash tag, and is not escaped in a plain key.
        assert_eq!(format("a}b{", BUY).as_deref(), Ok("a}b{"));
        assert_eq!(format("a}b{_<qty>", BUY).as_deref(), Ok("a}}b{{_{{{}}}"));
    }

    #[test]
    fn escapes_and_fields() {
        assert_eq!(format("a<<b_<qty>", BUY).as_deref(), Ok("a<b_{{{}}}"));
        assert_eq!(format("x_<qty.0>", BUY).as_deref(), Ok("x_{{{}}}"));
        assert_eq!(
            format("x_<self.tenant>", "async fn f(&self) {}").as_deref(),
            Ok("x_{{{}}}")
        );
    }

    #[test]
    fn pattern_bindings() {
        let func = "async fn f(Path((a, mut b)): Path<(u8, u8)>, S { c, d: e }: S) {}";
        assert_eq!(
            format("<a>_<b>_<c>_<e>", func).as_deref(),
            Ok("{{{}_{}_{}_{}}}")
        );
        assert!(format("<d>", func).is_err());
    }

    #[test]
    fn errors() {
        let err = format("buy_<goods>", BUY).unwrap_err();
        assert!(err.contains("unknown placeholder `<goods>`"), "{err}");
        assert!(err.contains("`goods_id`, `qty`"), "{err}");
        assert!(format("buy_<self.x>", BUY)
            .unwrap_err()
            .contains("has no `self`"));
        assert!(format("buy_<>", BUY)
            .unwrap_err()
            .contains("empty placeholder"));
        assert!(format("buy_<qty", BUY).unwrap_err().contains("unclosed"));
        assert!(format("buy_<q ty>", BUY).unwrap_err().contains("invalid"));
        assert!(format("buy_<qty.>", BUY).unwrap_err().contains("invalid"));
        // Every bad placeholder is reported, not only the first.
        let err = format("<a>_<b>", BUY).unwrap_err();
        assert_eq!(err.lines().count(), 2, "{err}");
    }
}
