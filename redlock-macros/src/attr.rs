//! The attribute's options: `#[distributed_lock(key = "...", ttl = "10s", ...)]`.
//!
//! Every option is parsed on its own: a malformed value, an unknown option or a
//! duplicate is recorded in the [`Ctxt`] and parsing goes on with the next
//! option, so one compile pass reports every mistake. Each option keeps the
//! tokens it was written with, for error spans.

use proc_macro2::{TokenStream, TokenTree};
use quote::ToTokens;
use syn::buffer::Cursor;
use syn::ext::IdentExt;
use syn::parse::{Parse, ParseStream, Parser};
use syn::punctuated::Punctuated;
use syn::{bracketed, token, Expr, Ident, LitBool, LitInt, LitStr, Path, Token};

use crate::ctxt::Ctxt;

/// The custom keywords of the attribute (`crate` is a real keyword, `Token![crate]`).
pub(crate) mod kw {
    syn::custom_keyword!(key);
    syn::custom_keyword!(keys);
    syn::custom_keyword!(mode);
    syn::custom_keyword!(permits);
    syn::custom_keyword!(hold_at_least);
    syn::custom_keyword!(ttl);
    syn::custom_keyword!(wait);
    syn::custom_keyword!(watchdog);
    syn::custom_keyword!(manager);
    syn::custom_keyword!(guard);
    syn::custom_keyword!(on_lost);
}

/// Every option name, in the order the docs list them (for "expected one of").
const OPTION_NAMES: &str = "`key`, `keys`, `mode`, `permits`, `ttl`, `wait`, `hold_at_least`, \
                            `watchdog`, `manager`, `guard`, `on_lost`, `crate`";

/// The longest `ttl` (and `hold_at_least`) the runtime accepts: 30 days.
const MAX_TTL_MILLIS: u64 = 30 * 24 * 60 * 60 * 1000;

/// One option: where it was first written (its `name = value` tokens) and its
/// value, if the value was valid.
pub(crate) struct Attr<T> {
    name: &'static str,
    tokens: Option<TokenStream>,
    value: Option<T>,
}

impl<T> Attr<T> {
    fn none(name: &'static str) -> Self {
        Attr {
            name,
            tokens: None,
            value: None,
        }
    }

    /// Records that the option was written with `tokens`. A second occurrence is
    /// a "duplicate" error spanned at the second one; the first one wins.
    /// Returns whether this is the first occurrence.
    fn seen(&mut self, cx: &Ctxt, tokens: &TokenStream) -> bool {
        if self.tokens.is_some() {
            cx.error_spanned_by(
                tokens,
                format_args!("duplicate option `{}`: it is already set above", self.name),
            );
            false
        } else {
            self.tokens = Some(tokens.clone());
            true
        }
    }

    /// Whether the option was written at all (even with an invalid value).
    pub(crate) fn is_written(&self) -> bool {
        self.tokens.is_some()
    }

    /// The valid value, if any.
    pub(crate) fn get(&self) -> Option<&T> {
        self.value.as_ref()
    }

    /// The option's `name = value` tokens as first written, for spanning an
    /// error about the option as a whole.
    pub(crate) fn tokens(&self) -> Option<&TokenStream> {
        self.tokens.as_ref()
    }
}

/// A duration literal such as `"10s"`, checked at compile time.
pub(crate) struct DurationLit {
    /// The duration in whole milliseconds.
    pub(crate) millis: u64,
    /// The literal as written, for spans.
    pub(crate) lit: LitStr,
}

/// What happens when the lock is lost while the body runs.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum OnLost {
    /// Drop the body and return `Err(LockError::Lost.into())` (the default).
    Abort,
    /// Log and let the body finish.
    Continue,
}

/// Which kind of lock `mode = "..."` asks for.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    /// `"read"`: shared with other readers of the key, excluding writers.
    Read,
    /// `"write"` or `"exclusive"` (the default): one holder.
    Exclusive,
    /// `"fair"`: one holder, in the order of arrival across every process.
    Fair,
}

/// `keys = ["...", "..."]`: the templates of a call that locks several keys.
struct KeyList {
    bracket: token::Bracket,
    templates: Punctuated<LitStr, Token![,]>,
}

impl Parse for KeyList {
    fn parse(input: ParseStream) -> syn::Result<Self> {
        let content;
        let bracket = bracketed!(content in input);
        let templates = content.parse_terminated(|input| input.parse::<LitStr>(), Token![,])?;
        Ok(KeyList { bracket, templates })
    }
}

/// All options of one attribute.
pub(crate) struct Options {
    pub(crate) key: Attr<LitStr>,
    pub(crate) keys: Attr<Vec<LitStr>>,
    pub(crate) mode: Attr<Mode>,
    pub(crate) permits: Attr<u32>,
    pub(crate) hold_at_least: Attr<DurationLit>,
    pub(crate) ttl: Attr<DurationLit>,
    pub(crate) wait: Attr<DurationLit>,
    pub(crate) watchdog: Attr<LitBool>,
    pub(crate) manager: Attr<Expr>,
    pub(crate) guard: Attr<Ident>,
    pub(crate) on_lost: Attr<OnLost>,
    pub(crate) krate: Attr<Path>,
}

impl Options {
    /// Parses the attribute's arguments, recording every problem in `cx`.
    pub(crate) fn parse(cx: &Ctxt, args: TokenStream) -> Options {
        let mut options = Options {
            key: Attr::none("key"),
            keys: Attr::none("keys"),
            mode: Attr::none("mode"),
            permits: Attr::none("permits"),
            hold_at_least: Attr::none("hold_at_least"),
            ttl: Attr::none("ttl"),
            wait: Attr::none("wait"),
            watchdog: Attr::none("watchdog"),
            manager: Attr::none("manager"),
            guard: Attr::none("guard"),
            on_lost: Attr::none("on_lost"),
            krate: Attr::none("crate"),
        };
        let parser = |input: ParseStream| -> syn::Result<()> {
            while !input.is_empty() {
                match options.parse_one(cx, input) {
                    Ok(()) if input.is_empty() || input.peek(Token![,]) => {}
                    Ok(()) => {
                        cx.syn_error(input.error("expected `,` between options"));
                        skip_to_comma(input)?;
                    }
                    Err(err) => {
                        cx.syn_error(err);
                        skip_to_comma(input)?;
                    }
                }
                if !input.is_empty() {
                    input.parse::<Token![,]>()?;
                }
            }
            Ok(())
        };
        if let Err(err) = parser.parse2(args) {
            cx.syn_error(err);
        }
        options
    }

    /// Parses one `name = value` option: its name picks the function that
    /// parses its value.
    fn parse_one(&mut self, cx: &Ctxt, input: ParseStream) -> syn::Result<()> {
        let option = OptionInput {
            cx,
            input,
            start: input.cursor(),
        };
        let lookahead = input.lookahead1();
        if lookahead.peek(kw::key) {
            input.parse::<kw::key>()?;
            self.key_option(&option)
        } else if lookahead.peek(kw::keys) {
            input.parse::<kw::keys>()?;
            self.keys_option(&option)
        } else if lookahead.peek(kw::mode) {
            input.parse::<kw::mode>()?;
            self.mode_option(&option)
        } else if lookahead.peek(kw::permits) {
            input.parse::<kw::permits>()?;
            self.permits_option(&option)
        } else if lookahead.peek(kw::hold_at_least) {
            input.parse::<kw::hold_at_least>()?;
            self.duration_option(&option, DurationKind::HoldAtLeast)
        } else if lookahead.peek(kw::ttl) {
            input.parse::<kw::ttl>()?;
            self.duration_option(&option, DurationKind::Ttl)
        } else if lookahead.peek(kw::wait) {
            input.parse::<kw::wait>()?;
            self.duration_option(&option, DurationKind::Wait)
        } else if lookahead.peek(kw::watchdog) {
            input.parse::<kw::watchdog>()?;
            option.keep(&mut self.watchdog, "`true` or `false`")
        } else if lookahead.peek(kw::manager) {
            input.parse::<kw::manager>()?;
            option.keep(
                &mut self.manager,
                "an expression that evaluates to a `LockManager`",
            )
        } else if lookahead.peek(kw::guard) {
            input.parse::<kw::guard>()?;
            option.keep(&mut self.guard, "an identifier to bind the `&LockGuard` to")
        } else if lookahead.peek(kw::on_lost) {
            input.parse::<kw::on_lost>()?;
            self.on_lost_option(&option)
        } else if lookahead.peek(Token![crate]) {
            input.parse::<Token![crate]>()?;
            self.crate_option(&option)
        } else if input.peek(Ident::peek_any) {
            unknown_option(cx, input)
        } else {
            Err(lookahead.error())
        }
    }

    /// `key = "..."`: one template, which must not be empty.
    fn key_option(&mut self, option: &OptionInput) -> syn::Result<()> {
        let expected = "a string literal such as \"order_<id>\"";
        if let Some(lit) = option.read::<LitStr, _>(&mut self.key, expected)? {
            if lit.value().is_empty() {
                option
                    .cx
                    .error_spanned_by(&lit, "the lock key must not be empty");
            } else {
                self.key.value = Some(lit);
            }
        }
        Ok(())
    }

    /// `keys = ["...", ...]`: the templates of a call that locks several keys.
    fn keys_option(&mut self, option: &OptionInput) -> syn::Result<()> {
        let expected = "a list of key templates such as [\"account_<from>\", \"account_<to>\"]";
        if let Some(list) = option.read::<KeyList, _>(&mut self.keys, expected)? {
            self.keys.value = key_list(option.cx, list);
        }
        Ok(())
    }

    /// `mode = "read" | "write" | "exclusive" | "fair"`.
    fn mode_option(&mut self, option: &OptionInput) -> syn::Result<()> {
        let expected = "\"read\", \"write\", \"exclusive\" or \"fair\"";
        if let Some(lit) = option.read::<LitStr, _>(&mut self.mode, expected)? {
            match lit.value().as_str() {
                "read" => self.mode.value = Some(Mode::Read),
                "write" | "exclusive" => self.mode.value = Some(Mode::Exclusive),
                "fair" => self.mode.value = Some(Mode::Fair),
                other => option.cx.error_spanned_by(
                    &lit,
                    format_args!(
                        "invalid `mode` value `{other}`: expected \"read\", \"write\", \
                         \"exclusive\" or \"fair\""
                    ),
                ),
            }
        }
        Ok(())
    }

    /// `permits = N`.
    fn permits_option(&mut self, option: &OptionInput) -> syn::Result<()> {
        let expected = "a whole number of permits such as 4";
        if let Some(lit) = option.read::<LitInt, _>(&mut self.permits, expected)? {
            self.permits.value = parse_permits(option.cx, &lit);
        }
        Ok(())
    }

    /// The duration options, `hold_at_least`, `ttl` and `wait = "..."`, each
    /// checked against its own bounds.
    fn duration_option(&mut self, option: &OptionInput, kind: DurationKind) -> syn::Result<()> {
        let (attr, expected) = match kind {
            DurationKind::HoldAtLeast => {
                (&mut self.hold_at_least, "a duration string such as \"30s\"")
            }
            DurationKind::Ttl => (&mut self.ttl, "a duration string such as \"10s\""),
            DurationKind::Wait => (&mut self.wait, "a duration string such as \"2s\""),
        };
        if let Some(lit) = option.read::<LitStr, _>(attr, expected)? {
            attr.value = parse_duration(option.cx, lit, kind);
        }
        Ok(())
    }

    /// `on_lost = "abort" | "continue"`.
    fn on_lost_option(&mut self, option: &OptionInput) -> syn::Result<()> {
        let expected = "\"abort\" or \"continue\"";
        if let Some(lit) = option.read::<LitStr, _>(&mut self.on_lost, expected)? {
            match lit.value().as_str() {
                "abort" => self.on_lost.value = Some(OnLost::Abort),
                "continue" => self.on_lost.value = Some(OnLost::Continue),
                other => option.cx.error_spanned_by(
                    &lit,
                    format_args!(
                        "invalid `on_lost` value `{other}`: expected \"abort\" or \"continue\""
                    ),
                ),
            }
        }
        Ok(())
    }

    /// `crate = "path"`: the path the expansion names the facade by.
    fn crate_option(&mut self, option: &OptionInput) -> syn::Result<()> {
        let expected = "a path in a string literal such as \"::redlock\"";
        if let Some(lit) = option.read::<LitStr, _>(&mut self.krate, expected)? {
            match lit.parse_with(Path::parse_mod_style) {
                Ok(path) => self.krate.value = Some(path),
                Err(_) => option.cx.error_spanned_by(
                    &lit,
                    format_args!(
                        "invalid `crate` path `{}`: expected a path such as \"::redlock\"",
                        lit.value()
                    ),
                ),
            }
        }
        Ok(())
    }
}

/// An option being parsed, after its name: where errors go, the input, and
/// where the option's tokens start (they span its errors).
struct OptionInput<'c, 'a> {
    cx: &'c Ctxt,
    input: ParseStream<'a>,
    start: Cursor<'a>,
}

impl OptionInput<'_, '_> {
    /// Parses the option's `= value` and records the option as written into
    /// `attr`. The value comes back only if it parsed and this is the option's
    /// first occurrence; the caller checks it and stores it.
    fn read<T: Parse, U>(&self, attr: &mut Attr<U>, expected: &str) -> syn::Result<Option<T>> {
        let parsed: T = value(attr, self.input, self.start, expected)?;
        let first = attr.seen(self.cx, &tokens_since(self.start, self.input));
        Ok(first.then_some(parsed))
    }

    /// Parses an option whose value is stored as written once it parses
    /// (`watchdog`, `manager`, `guard`).
    fn keep<T: Parse>(&self, attr: &mut Attr<T>, expected: &str) -> syn::Result<()> {
        if let Some(parsed) = self.read(attr, expected)? {
            attr.value = Some(parsed);
        }
        Ok(())
    }
}

/// An option name the attribute does not know: reported, and its `= value`
/// skipped so that the next option is still checked.
fn unknown_option(cx: &Ctxt, input: ParseStream) -> syn::Result<()> {
    let name = input.call(Ident::parse_any)?;
    cx.error_spanned_by(
        &name,
        format_args!("unknown option `{name}`: expected one of {OPTION_NAMES}"),
    );
    skip_to_comma(input)
}

/// The templates of `keys = [...]`, each once. An empty list, an empty template
/// and a template listed twice are errors; the other templates are kept, so
/// that their placeholders are checked too.
fn key_list(cx: &Ctxt, list: KeyList) -> Option<Vec<LitStr>> {
    if list.templates.is_empty() {
        cx.error_at(
            list.bracket.span.join(),
            "`keys` needs at least one key template, e.g. `keys = [\"account_<from>\", \
             \"account_<to>\"]`",
        );
        return None;
    }
    let mut templates: Vec<LitStr> = Vec::with_capacity(list.templates.len());
    for lit in list.templates {
        let text = lit.value();
        if text.is_empty() {
            cx.error_spanned_by(&lit, "the lock key must not be empty");
        } else if templates.iter().any(|seen| seen.value() == text) {
            cx.error_spanned_by(
                &lit,
                format_args!(
                    "duplicate key template \"{text}\" in `keys`: it is already listed, and a \
                     call locks each key once"
                ),
            );
        } else {
            templates.push(lit);
        }
    }
    Some(templates)
}

/// The number in `permits = N`: 1 ..= `u32::MAX`, unsuffixed or `u32`.
fn parse_permits(cx: &Ctxt, lit: &LitInt) -> Option<u32> {
    if !matches!(lit.suffix(), "" | "u32") {
        cx.error_spanned_by(
            lit,
            format_args!(
                "invalid `permits` value `{lit}`: expected a whole number without a type \
                 suffix, such as 4"
            ),
        );
        return None;
    }
    match lit.base10_parse::<u32>() {
        Ok(0) => {
            cx.error_spanned_by(
                lit,
                "`permits` must be at least 1: with 0 permits no call could ever run",
            );
            None
        }
        Ok(n) => Some(n),
        Err(_) => {
            cx.error_spanned_by(
                lit,
                format_args!(
                    "`permits` must be at most {} (`u32::MAX`), got {}",
                    u32::MAX,
                    lit.base10_digits()
                ),
            );
            None
        }
    }
}

/// Skips the rest of an option, up to (not including) the next top-level comma.
fn skip_to_comma(input: ParseStream) -> syn::Result<()> {
    while !input.is_empty() && !input.peek(Token![,]) {
        input.parse::<TokenTree>()?;
    }
    Ok(())
}

/// Parses an option's `= value`, saying what was expected if it is not there.
/// An option with an invalid value still counts as written (no "missing key"
/// on top of "expected a string literal").
fn value<T: Parse, U>(
    attr: &mut Attr<U>,
    input: ParseStream,
    start: Cursor<'_>,
    expected: &str,
) -> syn::Result<T> {
    let parsed = input.parse::<Token![=]>().and_then(|_| {
        input
            .parse::<T>()
            .map_err(|err| syn::Error::new(err.span(), format_args!("expected {expected}")))
    });
    if parsed.is_err() && attr.tokens.is_none() {
        attr.tokens = Some(tokens_since(start, input));
    }
    parsed
}

/// The tokens consumed from `start` up to where `input` is now.
fn tokens_since(start: Cursor<'_>, input: ParseStream) -> TokenStream {
    let end = input.cursor();
    let mut tokens = TokenStream::new();
    let mut cursor = start;
    while cursor < end {
        match cursor.token_tree() {
            Some((tt, next)) => {
                tt.to_tokens(&mut tokens);
                cursor = next;
            }
            None => break,
        }
    }
    tokens
}

/// Which duration option is being parsed (they differ in their bounds).
#[derive(Clone, Copy)]
enum DurationKind {
    Ttl,
    Wait,
    HoldAtLeast,
}

/// Parses a duration literal (`"250ms"`, `"10s"`, `"1m"`, `"2h"`, `"30d"`), reporting
/// errors at the literal.
fn parse_duration(cx: &Ctxt, lit: LitStr, kind: DurationKind) -> Option<DurationLit> {
    let text = lit.value();
    let millis = match duration_millis(&text) {
        Ok(millis) => millis,
        Err(reason) => {
            cx.error_spanned_by(
                &lit,
                format_args!(
                    "invalid duration \"{text}\": {reason}; expected a whole number followed by \
                     `ms`, `s`, `m`, `h` or `d`, e.g. \"500ms\", \"10s\", \"1m\", \"2h\" or \"30d\""
                ),
            );
            return None;
        }
    };
    let name = match kind {
        DurationKind::Ttl => "ttl",
        DurationKind::HoldAtLeast => "hold_at_least",
        DurationKind::Wait => return Some(DurationLit { millis, lit }),
    };
    if millis == 0 && matches!(kind, DurationKind::Ttl) {
        cx.error_spanned_by(&lit, "`ttl` must be at least 1ms");
        return None;
    }
    if millis > MAX_TTL_MILLIS {
        cx.error_spanned_by(
            &lit,
            format_args!("`{name}` must be at most 30 days (\"30d\"), got \"{text}\""),
        );
        return None;
    }
    Some(DurationLit { millis, lit })
}

/// The milliseconds a duration literal stands for, or why it is invalid.
fn duration_millis(text: &str) -> Result<u64, &'static str> {
    let digits_end = text
        .char_indices()
        .find(|(_, c)| !c.is_ascii_digit())
        .map_or(text.len(), |(i, _)| i);
    let (digits, unit) = text.split_at(digits_end);
    if digits.is_empty() {
        return Err("it does not start with a number");
    }
    let factor = match unit {
        "ms" => 1,
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        "" => return Err("the unit is missing"),
        _ => return Err("unknown unit"),
    };
    digits
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(factor))
        .ok_or("the number is too large")
}

#[cfg(test)]
mod tests {
    use super::duration_millis;

    #[test]
    fn durations() {
        assert_eq!(duration_millis("10ms"), Ok(10));
        assert_eq!(duration_millis("2s"), Ok(2_000));
        assert_eq!(duration_millis("1m"), Ok(60_000));
        assert_eq!(duration_millis("0s"), Ok(0));
        assert!(duration_millis("10").is_err());
        assert!(duration_millis("s").is_err());
        // Regression (issue 14, item 8): 30 days had to be written "43200m".
        assert_eq!(duration_millis("2h"), Ok(7_200_000));
        assert_eq!(duration_millis("30d"), Ok(30 * 86_400_000));
        assert_eq!(duration_millis("30d"), duration_millis("43200m"));
        assert!(duration_millis("1w").is_err());
        assert!(duration_millis("1H").is_err());
        assert!(duration_millis("999999999999999d").is_err());
        assert!(duration_millis("1.5s").is_err());
        assert!(duration_millis("-1s").is_err());
        assert!(duration_millis(" 1s").is_err());
        assert!(duration_millis("99999999999999999999s").is_err());
        assert!(duration_millis("999999999999999999m").is_err());
    }
}
