//! Lock keys from requests: the [`KeyFn`] trait, and ready-made typed extractors for a
//! named route parameter (`path_param`, feature `axum`), a path segment by position
//! ([`path_segment`]) and a header ([`header`]).
//!
//! # Lock the value the handler uses, not the text the client sent
//!
//! A lock key must name the *resource*, and the handler finds the resource from the
//! parsed value, not from the request's text. axum's `Path<u64>` hands `/goods/42`,
//! `/goods/042`, `/goods/+42` and `/goods/%34%32` to the handler as the same `42`; a key
//! built from the raw text would lock four different keys for one goods, and four
//! concurrent purchases would all run at once and lose updates. So both extractors are
//! typed: they percent-decode the text (as axum does), parse it with the `FromStr` of the
//! type the handler extracts, and format the parsed value with its `Display`, so every
//! spelling of one value gives one key: `path_segment::<u64>` locks all four as
//! `goods_{42}` — the same key `#[distributed_lock(key = "goods_<id>")]` builds from
//! `id: u64`. A value that does not parse is rejected with `400 Bad Request` before the
//! inner service is called (the handler's extractor would refuse it too). The type is
//! required: name `String` only when the handler extracts the text itself
//! (`Path<String>`). A closure key function must do the same: parse, then format.
//!
//! Both extractors take a *template* with exactly one `{}`, which becomes the value in
//! braces — `"goods_{}"` and the value `42` make the key `goods_{42}` — so the value is
//! the key's Redis Cluster hash tag, the same rule `#[distributed_lock]` applies to
//! `"goods_<id>"`. The manager's prefix is put in front as for every key
//! (`lock:goods_{42}`). A template may hold its own `{tag}` before the placeholder to
//! choose another hash tag.

use std::any::type_name;
use std::fmt::{self, Display};
use std::marker::PhantomData;
use std::str::FromStr;

use http::header::HeaderName;
use http::Request;

use crate::LockError;

/// Derives the lock key of a request: `Ok(None)` lets the request through unlocked, an
/// error rejects it without calling the inner service (`InvalidKey` → `400 Bad
/// Request`).
///
/// Implemented by every `Fn(&http::Request<B>) -> Option<String>` (which never rejects)
/// and by the extractors of this module. The key gets the manager's prefix like any
/// other. The layer also needs the key function to be `Clone`, and `Send + Sync +
/// 'static` to be used with axum. A closure should build its key from the value the
/// handler will use, parsed and formatted back (see [the module docs](self)).
///
/// ```
/// use http::Request;
/// use redlock::tower::{key, KeyFn};
///
/// let by_tenant = |req: &Request<()>| {
///     let tenant: u64 = req.headers().get("x-tenant")?.to_str().ok()?.parse().ok()?;
///     Some(format!("tenant_{{{tenant}}}"))
/// };
/// let req = Request::builder().header("x-tenant", "007").body(())?;
/// assert_eq!(by_tenant.key(&req)?.as_deref(), Some("tenant_{7}"));
/// let typed = key::header::<u64>("x-tenant", "tenant_{}");
/// assert_eq!(typed.key(&req)?.as_deref(), Some("tenant_{7}"));
/// # Ok::<_, Box<dyn std::error::Error>>(())
/// ```
pub trait KeyFn<B> {
    /// The key for `request`, without the manager's prefix; `Ok(None)` for no lock.
    ///
    /// # Errors
    /// A request the key function refuses, answered with
    /// [`error_response`](super::error_response) of the error: [`LockError::InvalidKey`]
    /// is `400 Bad Request`.
    fn key(&self, request: &Request<B>) -> Result<Option<String>, LockError>;
}

impl<B, F> KeyFn<B> for F
where
    F: Fn(&Request<B>) -> Option<String>,
{
    fn key(&self, request: &Request<B>) -> Result<Option<String>, LockError> {
        Ok(self(request))
    }
}

/// A key template: the text around its one `{}` placeholder.
#[derive(Clone, PartialEq, Eq)]
struct Template {
    before: Box<str>,
    after: Box<str>,
}

impl Template {
    fn parse(template: &str) -> Self {
        let mut parts = template.split("{}");
        match (parts.next(), parts.next(), parts.next()) {
            (Some(before), Some(after), None) => Self {
                before: before.into(),
                after: after.into(),
            },
            _ => panic!("redlock key template {template:?} must contain exactly one `{{}}`"),
        }
    }

    fn render(&self, value: &str) -> String {
        let mut key = String::with_capacity(self.before.len() + value.len() + 2 + self.after.len());
        key.push_str(&self.before);
        key.push('{');
        key.push_str(value);
        key.push('}');
        key.push_str(&self.after);
        key
    }

    /// The key of `text` parsed as a `T` and formatted back, so that every spelling of
    /// one value gives one key; `what` names the text's origin in the error.
    fn render_parsed<T: FromStr + Display>(
        &self,
        text: &str,
        what: impl FnOnce() -> String,
    ) -> Result<String, LockError> {
        match text.parse::<T>() {
            Ok(value) => Ok(self.render(&value.to_string())),
            Err(_) => Err(invalid(format!(
                "{} {text:?} is not a valid {}",
                what(),
                type_name::<T>()
            ))),
        }
    }
}

impl fmt::Debug for Template {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "\"{}{{}}{}\"", self.before, self.after)
    }
}

/// The key function of [`path_segment`].
pub struct PathSegment<T> {
    index: usize,
    template: Template,
    // `fn() -> T`: the extractor makes `T`s, it does not own one, so it is `Send`,
    // `Sync` and `Clone` whatever `T` is.
    value: PhantomData<fn() -> T>,
}

/// A key from the `index`th segment of the request's path (0-based, the leading `/`
/// ignored: in `/goods/42/buy` segment 1 is `42`), percent-decoded, parsed as a `T` and
/// formatted back with `T`'s `Display` in place of `template`'s `{}`:
/// `path_segment::<u64>(1, "goods_{}")` locks `/goods/42/buy`, `/goods/042/buy`,
/// `/goods/+42/buy` and `/goods/%34%32/buy` all as `goods_{42}`.
///
/// `T` is the type the handler extracts for that segment (`Path<u64>` →
/// `path_segment::<u64>`), so the key names what the handler works on; see [the module
/// docs](self) for why the raw text is not enough. Decoding and parsing are those of
/// axum's `Path` for `FromStr` types (integers, `String`, `bool`, floats, `Uuid`...):
/// `%XX` escapes decoded to UTF-8, then `T::from_str`.
///
/// - **No key** (the request passes unlocked) when the path has no such segment or it is
///   empty: no `/goods/{id}` route matches such a path.
/// - **Rejected** with [`LockError::InvalidKey`] (`400 Bad Request`, the inner service is
///   not called) when the segment does not decode to UTF-8 or does not parse as a `T`.
///
/// The path is the one the layer sees: under axum's `Router::nest` that is the path with
/// the nest's prefix stripped.
///
/// # Panics
/// When `template` does not contain exactly one `{}` (a programming error, found when the
/// layer is built).
///
/// ```
/// use http::Request;
/// use redlock::tower::{key, KeyFn};
///
/// let by_goods = key::path_segment::<u64>(1, "goods_{}");
/// let key_of = |uri: &str| by_goods.key(&Request::get(uri).body(()).unwrap());
/// for spelling in ["/goods/42/buy", "/goods/042/buy", "/goods/+42", "/goods/%34%32"] {
///     assert_eq!(key_of(spelling)?.as_deref(), Some("goods_{42}"));
/// }
/// assert!(key_of("/goods/abc/buy").is_err()); // 400 Bad Request
/// assert_eq!(key_of("/goods")?, None);
///
/// let by_name = key::path_segment::<String>(1, "goods_{}");
/// let req = Request::get("/goods/caf%C3%A9").body(())?;
/// assert_eq!(by_name.key(&req)?.as_deref(), Some("goods_{café}"));
/// # Ok::<_, Box<dyn std::error::Error>>(())
/// ```
pub fn path_segment<T: FromStr + Display>(index: usize, template: &str) -> PathSegment<T> {
    PathSegment {
        index,
        template: Template::parse(template),
        value: PhantomData,
    }
}

impl<B, T: FromStr + Display> KeyFn<B> for PathSegment<T> {
    fn key(&self, request: &Request<B>) -> Result<Option<String>, LockError> {
        let path = request.uri().path();
        let Some(segment) = path
            .strip_prefix('/')
            .unwrap_or(path)
            .split('/')
            .nth(self.index)
            .filter(|segment| !segment.is_empty())
        else {
            return Ok(None);
        };
        let what = || format!("path segment {}", self.index);
        let Some(text) = percent_decode(segment) else {
            return Err(invalid(format!(
                "{} {segment:?} is not UTF-8 once percent-decoded",
                what()
            )));
        };
        self.template.render_parsed::<T>(&text, what).map(Some)
    }
}

impl<T> Clone for PathSegment<T> {
    fn clone(&self) -> Self {
        Self {
            index: self.index,
            template: self.template.clone(),
            value: PhantomData,
        }
    }
}

impl<T> fmt::Debug for PathSegment<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PathSegment")
            .field("index", &self.index)
            .field("template", &self.template)
            .field("value", &type_name::<T>())
            .finish()
    }
}

/// The key function of `path_param`.
#[cfg(feature = "axum")]
pub struct PathParam<T> {
    name: Box<str>,
    template: Template,
    // As in `PathSegment`.
    value: PhantomData<fn() -> T>,
}

/// A key from the route parameter `name` (`{id}` in `/goods/{id}/buy`), found through
/// the route axum matched, percent-decoded, parsed as a `T` and formatted back with
/// `T`'s `Display` in place of `template`'s `{}`: `path_param::<u64>("id", "goods_{}")`
/// locks `/goods/42/buy` and `/goods/042/buy` as `goods_{42}`, on every route that has
/// an `{id}` wherever it sits. Decoding and parsing are as in [`path_segment`], which
/// counts segments instead; a layer over routes whose parameters sit at different
/// places needs this one.
///
/// - **A configuration error** (`500 Internal Server Error` with
///   [`LockError::InvalidOption`], the inner service not called) when the matched route
///   has no parameter `name` (a layer over a route it does not fit), when no route was
///   matched yet (the layer wraps the router from outside instead of being added with
///   `Router::route_layer` or `Router::layer`), or for a wildcard parameter (`{*rest}`):
///   never a silently wrong key.
/// - **Rejected** with [`LockError::InvalidKey`] (`400 Bad Request`) when the value does
///   not decode to UTF-8 or does not parse as a `T`.
///
/// # Panics
/// When `template` does not contain exactly one `{}` (found when the layer is built).
///
/// ```
/// use axum::routing::post;
/// use axum::Router;
/// use redlock::tower::{key, LockLayer};
/// # async fn run(_: axum::extract::Path<u64>) {}
/// # async fn rename(_: axum::extract::Path<(String, u64)>) {}
/// # fn app(locks: redlock::LockManager) -> Router {
/// // One layer over two routes: `{id}` is the second segment of one, the third of the
/// // other; both lock `job_{<id>}`.
/// Router::new()
///     .route("/jobs/{id}/run", post(run))
///     .route("/teams/{team}/jobs/{id}/rename", post(rename))
///     .route_layer(LockLayer::new(locks, key::path_param::<u64>("id", "job_{}")))
/// # }
/// ```
#[cfg(feature = "axum")]
pub fn path_param<T: FromStr + Display>(name: &str, template: &str) -> PathParam<T> {
    PathParam {
        name: name.into(),
        template: Template::parse(template),
        value: PhantomData,
    }
}

#[cfg(feature = "axum")]
impl<B, T: FromStr + Display> KeyFn<B> for PathParam<T> {
    fn key(&self, request: &Request<B>) -> Result<Option<String>, LockError> {
        let misfit =
            |why: String| LockError::invalid_option(format!("path_param({:?}): {why}", self.name));
        let Some(route) = request.extensions().get::<axum::extract::MatchedPath>() else {
            return Err(misfit(
                "no route matched yet: add the LockLayer to the router with \
                 Router::route_layer, not around it"
                    .to_owned(),
            ));
        };
        let route = route.as_str();
        let wanted = format!("{{{}}}", self.name);
        let pattern: Vec<&str> = route.trim_start_matches('/').split('/').collect();
        if pattern.iter().any(|p| p.starts_with("{*")) {
            return Err(misfit(format!(
                "route {route} has a wildcard parameter; use a key closure"
            )));
        }
        let Some(at) = pattern.iter().position(|p| *p == wanted) else {
            return Err(misfit(format!("route {route} has no {wanted} parameter")));
        };
        // Under `Router::nest` the layer sees the path without the nest's prefix, while
        // the matched route has it: count from the end.
        let path = request.uri().path();
        let segments: Vec<&str> = path.trim_start_matches('/').split('/').collect();
        let from_end = pattern.len() - at;
        let Some(segment) = segments
            .len()
            .checked_sub(from_end)
            .and_then(|i| segments.get(i))
        else {
            return Err(misfit(format!("path {path} does not fit route {route}")));
        };
        let what = || format!("route parameter {wanted}");
        let Some(text) = percent_decode(segment) else {
            return Err(invalid(format!(
                "{} {segment:?} is not UTF-8 once percent-decoded",
                what()
            )));
        };
        self.template.render_parsed::<T>(&text, what).map(Some)
    }
}

#[cfg(feature = "axum")]
impl<T> Clone for PathParam<T> {
    fn clone(&self) -> Self {
        Self {
            name: self.name.clone(),
            template: self.template.clone(),
            value: PhantomData,
        }
    }
}

#[cfg(feature = "axum")]
impl<T> fmt::Debug for PathParam<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PathParam")
            .field("name", &self.name)
            .field("template", &self.template)
            .field("value", &type_name::<T>())
            .finish()
    }
}

/// The key function of [`header`].
pub struct Header<T> {
    name: HeaderName,
    template: Template,
    // As in `PathSegment`.
    value: PhantomData<fn() -> T>,
}

/// A key from the request header `name` (its first value), parsed as a `T` and formatted
/// back with `T`'s `Display` in place of `template`'s `{}`:
/// `header::<u64>("x-account", "account_{}")` locks a request carrying `x-account: 7` or
/// `x-account: 007` as `account_{7}`.
///
/// `T` is the type the handler parses the header into (`String` when it uses the text as
/// it is); see [the module docs](self) for why.
///
/// - **No key** (the request passes unlocked) when the header is missing or empty.
/// - **Rejected** with [`LockError::InvalidKey`] (`400 Bad Request`, the inner service is
///   not called) when its value is not visible ASCII or does not parse as a `T`.
///
/// # Panics
/// When `name` is not a valid header name, or `template` does not contain exactly one
/// `{}` (programming errors, found when the layer is built).
///
/// ```
/// use http::Request;
/// use redlock::tower::{key, KeyFn};
///
/// let by_tenant = key::header::<String>("X-Tenant", "tenant_{}");
/// let req = Request::get("/").header("x-tenant", "acme").body(())?;
/// assert_eq!(by_tenant.key(&req)?.as_deref(), Some("tenant_{acme}"));
/// assert_eq!(by_tenant.key(&Request::get("/").body(())?)?, None);
///
/// let by_account = key::header::<u64>("x-account", "account_{}");
/// let req = Request::get("/").header("x-account", "007").body(())?;
/// assert_eq!(by_account.key(&req)?.as_deref(), Some("account_{7}"));
/// let req = Request::get("/").header("x-account", "seven").body(())?;
/// assert!(by_account.key(&req).is_err()); // 400 Bad Request
/// # Ok::<_, Box<dyn std::error::Error>>(())
/// ```
pub fn header<T: FromStr + Display>(name: &str, template: &str) -> Header<T> {
    let name = HeaderName::try_from(name)
        .unwrap_or_else(|e| panic!("redlock key header {name:?} is not a header name: {e}"));
    Header {
        name,
        template: Template::parse(template),
        value: PhantomData,
    }
}

impl<B, T: FromStr + Display> KeyFn<B> for Header<T> {
    fn key(&self, request: &Request<B>) -> Result<Option<String>, LockError> {
        let Some(value) = request.headers().get(&self.name) else {
            return Ok(None);
        };
        if value.is_empty() {
            return Ok(None);
        }
        let what = || format!("header {}", self.name);
        let Ok(text) = value.to_str() else {
            return Err(invalid(format!("{} is not visible ASCII", what())));
        };
        self.template.render_parsed::<T>(text, what).map(Some)
    }
}

impl<T> Clone for Header<T> {
    fn clone(&self) -> Self {
        Self {
            name: self.name.clone(),
            template: self.template.clone(),
            value: PhantomData,
        }
    }
}

impl<T> fmt::Debug for Header<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Header")
            .field("name", &self.name)
            .field("template", &self.template)
            .field("value", &type_name::<T>())
            .finish()
    }
}

/// A request whose key cannot be derived: `400 Bad Request`.
fn invalid(reason: String) -> LockError {
    LockError::InvalidKey { reason }
}

/// Decodes `%XX` escapes; `None` when the result is not UTF-8. A `%` not followed by two
/// hex digits is kept as it is, as browsers and routers do.
fn percent_decode(s: &str) -> Option<String> {
    if !s.contains('%') {
        return Some(s.to_owned());
    }
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while let Some(&b) = bytes.get(i) {
        let escaped = (b == b'%')
            .then(|| Some((hex(*bytes.get(i + 1)?)?, hex(*bytes.get(i + 2)?)?)))
            .flatten();
        match escaped {
            Some((hi, lo)) => {
                out.push(hi << 4 | lo);
                i += 3;
            }
            None => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8(out).ok()
}

fn hex(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn get(uri: &str) -> Request<()> {
        Request::get(uri).body(()).unwrap()
    }

    #[test]
    fn templates_wrap_the_value_in_a_hash_tag() {
        let t = Template::parse("goods_{}");
        assert_eq!(t.render("42"), "goods_{42}");
        let t = Template::parse("{}");
        assert_eq!(t.render("42"), "{42}");
        let t = Template::parse("{shop}:goods_{}_buy");
        assert_eq!(t.render("42"), "{shop}:goods_{42}_buy");
        assert_eq!(format!("{t:?}"), "\"{shop}:goods_{}_buy\"");
    }

    #[test]
    #[should_panic(expected = "exactly one")]
    fn a_template_without_placeholder_panics() {
        let _ = path_segment::<u64>(0, "goods");
    }

    #[test]
    #[should_panic(expected = "exactly one")]
    fn a_template_with_two_placeholders_panics() {
        let _ = header::<String>("x-a", "{}_{}");
    }

    #[test]
    #[should_panic(expected = "not a header name")]
    fn an_invalid_header_name_panics() {
        let _ = header::<String>("bad header", "{}");
    }

    fn key_of<K: KeyFn<()>>(k: &K, req: &Request<()>) -> Option<String> {
        k.key(req).expect("not rejected")
    }

    #[test]
    fn path_segments_count_from_the_first_after_the_slash() {
        let k = path_segment::<String>(0, "{}");
        assert_eq!(key_of(&k, &get("/goods/42")).as_deref(), Some("{goods}"));
        assert_eq!(key_of(&k, &get("/")), None);
        let k = path_segment::<String>(2, "x_{}");
        assert_eq!(key_of(&k, &get("/a/b/c?q=1")).as_deref(), Some("x_{c}"));
        assert_eq!(key_of(&k, &get("/a/b/")), None);
        assert_eq!(key_of(&k, &get("/a/b")), None);
        assert_eq!(key_of(&k, &get("http://h/a/b/c")).as_deref(), Some("x_{c}"));
    }

    #[test]
    fn typed_path_segments_lock_the_parsed_value() {
        let k = path_segment::<u64>(1, "goods_{}");
        for spelling in [
            "42", "042", "+42", "0042", "%34%32", "4%32", "%2B42", "%2b0%342",
        ] {
            let uri = format!("/goods/{spelling}/buy");
            assert_eq!(
                key_of(&k, &get(&uri)).as_deref(),
                Some("goods_{42}"),
                "{uri}"
            );
        }
        assert_eq!(key_of(&k, &get("/goods")), None);
        assert_eq!(key_of(&k, &get("/goods//buy")), None);
        for bad in [
            "abc",
            "-1",
            "4%2F2",
            "42%",
            "%FF",
            "18446744073709551616",
            "%20%34%32",
        ] {
            let uri = format!("/goods/{bad}/buy");
            let err = k.key(&get(&uri)).expect_err(&uri);
            assert!(matches!(err, LockError::InvalidKey { .. }), "{uri}: {err}");
            assert_eq!(err.status_code(), http::StatusCode::BAD_REQUEST);
        }
        let err = k.key(&get("/goods/abc")).unwrap_err();
        assert_eq!(
            err.to_string(),
            "invalid lock key: path segment 1 \"abc\" is not a valid u64"
        );
        // Text keys are decoded but otherwise kept as they are.
        let k = path_segment::<String>(1, "goods_{}");
        assert_eq!(
            key_of(&k, &get("/goods/+042")).as_deref(),
            Some("goods_{+042}")
        );
        assert_eq!(
            key_of(&k, &get("/goods/caf%C3%A9")).as_deref(),
            Some("goods_{café}")
        );
        assert!(k.key(&get("/goods/%FF")).is_err());
        assert_eq!(
            format!("{k:?}"),
            "PathSegment { index: 1, template: \"goods_{}\", value: \"alloc::string::String\" }"
        );
    }

    #[test]
    fn percent_decoding() {
        assert_eq!(percent_decode("42").as_deref(), Some("42"));
        assert_eq!(percent_decode("4%32").as_deref(), Some("42"));
        assert_eq!(percent_decode("%7b%7D").as_deref(), Some("{}"));
        assert_eq!(percent_decode("100%").as_deref(), Some("100%"));
        assert_eq!(percent_decode("%zz%4").as_deref(), Some("%zz%4"));
        assert_eq!(percent_decode("%C3%A9").as_deref(), Some("é"));
        assert_eq!(percent_decode("%FF"), None);
    }

    fn with_header(value: &[u8]) -> Request<()> {
        Request::get("/")
            .header("x-tenant", http::HeaderValue::from_bytes(value).unwrap())
            .body(())
            .unwrap()
    }

    #[test]
    fn headers() {
        let k = header::<String>("x-tenant", "t_{}");
        let req = Request::get("/")
            .header("x-tenant", "a")
            .header("x-tenant", "b")
            .body(())
            .unwrap();
        assert_eq!(key_of(&k, &req).as_deref(), Some("t_{a}"));
        assert_eq!(key_of(&k, &get("/")), None);
        assert_eq!(key_of(&k, &with_header(b"")), None);
        // Present but unreadable: rejected, not let through unlocked.
        let err = k.key(&with_header(b"\xff")).unwrap_err();
        assert_eq!(
            err.to_string(),
            "invalid lock key: header x-tenant is not visible ASCII"
        );
        let k = header::<u32>("x-tenant", "t_{}");
        assert_eq!(key_of(&k, &with_header(b"007")).as_deref(), Some("t_{7}"));
        assert_eq!(key_of(&k, &with_header(b"+7")).as_deref(), Some("t_{7}"));
        assert!(k.key(&with_header(b"seven")).is_err());
    }
}
