//! Lock keys from requests: the [`KeyFn`] trait, and ready-made extractors for a path
//! segment ([`path_segment`]) and a header ([`header`]).
//!
//! Both extractors take a *template* with exactly one `{}`, which becomes the value in
//! braces — `"goods_{}"` and the value `42` make the key `goods_{42}` — so the value is
//! the key's Redis Cluster hash tag, the same rule `#[distributed_lock]` applies to
//! `"goods_<id>"`. The manager's prefix is put in front as for every key
//! (`lock:goods_{42}`). A template may hold its own `{tag}` before the placeholder to
//! choose another hash tag.

use std::fmt;

use http::header::HeaderName;
use http::Request;

/// Derives the lock key of a request; `None` lets the request through unlocked.
///
/// Implemented by every `Fn(&http::Request<B>) -> Option<String>` and by the
/// extractors of this module. The key gets the manager's prefix like any other. The layer
/// also needs the key function to be `Clone`, and `Send + Sync + 'static` to be used with
/// axum.
///
/// ```
/// use http::Request;
/// use redlock_runtime::layer::{key, KeyFn};
///
/// let by_tenant = |req: &Request<()>| {
///     req.headers().get("x-tenant")?.to_str().ok().map(|t| format!("tenant_{{{t}}}"))
/// };
/// let req = Request::builder().header("x-tenant", "acme").body(())?;
/// assert_eq!(by_tenant.key(&req).as_deref(), Some("tenant_{acme}"));
/// assert_eq!(key::header("x-tenant", "tenant_{}").key(&req).as_deref(), Some("tenant_{acme}"));
/// # Ok::<_, http::Error>(())
/// ```
pub trait KeyFn<B> {
    /// The key for `request`, without the manager's prefix; `None` for no lock.
    fn key(&self, request: &Request<B>) -> Option<String>;
}

impl<B, F> KeyFn<B> for F
where
    F: Fn(&Request<B>) -> Option<String>,
{
    fn key(&self, request: &Request<B>) -> Option<String> {
        self(request)
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
}

impl fmt::Debug for Template {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "\"{}{{}}{}\"", self.before, self.after)
    }
}

/// The key function of [`path_segment`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PathSegment {
    index: usize,
    template: Template,
}

/// A key from the `index`th segment of the request's path (0-based, the leading `/`
/// ignored: in `/goods/42/buy` segment 1 is `42`), percent-decoded, put into `template`
/// in place of its `{}`: `path_segment(1, "goods_{}")` locks `/goods/42/buy` as
/// `goods_{42}`.
///
/// Percent-decoding makes `/goods/4%32/buy` lock the same key as `/goods/42/buy`, as a
/// router's path parameters see it. No key (the request passes unlocked) when the path
/// has no such segment, the segment is empty, or it does not decode to UTF-8.
/// The path is the one the layer sees: under axum's `Router::nest` that is the path with
/// the nest's prefix stripped.
///
/// # Panics
/// When `template` does not contain exactly one `{}` (a programming error, found when the
/// layer is built).
///
/// ```
/// use http::Request;
/// use redlock_runtime::layer::{key, KeyFn};
///
/// let by_goods = key::path_segment(1, "goods_{}");
/// let key_of = |uri: &str| by_goods.key(&Request::get(uri).body(()).unwrap());
/// assert_eq!(key_of("/goods/42/buy").as_deref(), Some("goods_{42}"));
/// assert_eq!(key_of("/goods/caf%C3%A9").as_deref(), Some("goods_{café}"));
/// assert_eq!(key_of("/goods"), None);
/// assert_eq!(key_of("/goods//buy"), None);
/// ```
pub fn path_segment(index: usize, template: &str) -> PathSegment {
    PathSegment {
        index,
        template: Template::parse(template),
    }
}

impl<B> KeyFn<B> for PathSegment {
    fn key(&self, request: &Request<B>) -> Option<String> {
        let path = request.uri().path();
        let segment = path
            .strip_prefix('/')
            .unwrap_or(path)
            .split('/')
            .nth(self.index)?;
        if segment.is_empty() {
            return None;
        }
        Some(self.template.render(&percent_decode(segment)?))
    }
}

/// The key function of [`header`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header {
    name: HeaderName,
    template: Template,
}

/// A key from the request header `name` (its first value, as text), put into `template`
/// in place of its `{}`: `header("x-tenant", "tenant_{}")` locks a request carrying
/// `x-tenant: acme` as `tenant_{acme}`.
///
/// No key (the request passes unlocked) when the header is missing, empty, or not
/// visible ASCII.
///
/// # Panics
/// When `name` is not a valid header name, or `template` does not contain exactly one
/// `{}` (programming errors, found when the layer is built).
///
/// ```
/// use http::Request;
/// use redlock_runtime::layer::{key, KeyFn};
///
/// let by_tenant = key::header("X-Tenant", "tenant_{}");
/// let req = Request::get("/").header("x-tenant", "acme").body(())?;
/// assert_eq!(by_tenant.key(&req).as_deref(), Some("tenant_{acme}"));
/// assert_eq!(by_tenant.key(&Request::get("/").body(())?), None);
/// # Ok::<_, http::Error>(())
/// ```
pub fn header(name: &str, template: &str) -> Header {
    let name = HeaderName::try_from(name)
        .unwrap_or_else(|e| panic!("redlock key header {name:?} is not a header name: {e}"));
    Header {
        name,
        template: Template::parse(template),
    }
}

impl<B> KeyFn<B> for Header {
    fn key(&self, request: &Request<B>) -> Option<String> {
        let value = request.headers().get(&self.name)?.to_str().ok()?;
        if value.is_empty() {
            return None;
        }
        Some(self.template.render(value))
    }
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
        let _ = path_segment(0, "goods");
    }

    #[test]
    #[should_panic(expected = "exactly one")]
    fn a_template_with_two_placeholders_panics() {
        let _ = header("x-a", "{}_{}");
    }

    #[test]
    #[should_panic(expected = "not a header name")]
    fn an_invalid_header_name_panics() {
        let _ = header("bad header", "{}");
    }

    #[test]
    fn path_segments_count_from_the_first_after_the_slash() {
        let k = path_segment(0, "{}");
        assert_eq!(k.key(&get("/goods/42")).as_deref(), Some("{goods}"));
        assert_eq!(k.key(&get("/")), None);
        let k = path_segment(2, "x_{}");
        assert_eq!(k.key(&get("/a/b/c?q=1")).as_deref(), Some("x_{c}"));
        assert_eq!(k.key(&get("/a/b/")), None);
        assert_eq!(k.key(&get("/a/b")), None);
        assert_eq!(k.key(&get("http://h/a/b/c")).as_deref(), Some("x_{c}"));
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

    #[test]
    fn headers() {
        let k = header("x-tenant", "t_{}");
        let req = Request::get("/")
            .header("x-tenant", "a")
            .header("x-tenant", "b")
            .body(())
            .unwrap();
        assert_eq!(k.key(&req).as_deref(), Some("t_{a}"));
        let req = Request::get("/").header("x-tenant", "").body(()).unwrap();
        assert_eq!(k.key(&req), None);
        let req = Request::get("/")
            .header("x-tenant", http::HeaderValue::from_bytes(b"\xff").unwrap())
            .body(())
            .unwrap();
        assert_eq!(k.key(&req), None);
    }
}
