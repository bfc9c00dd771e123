//! Logs that explain (issue 14, item 4): errors with their source chain, and every event
//! with its own `key` and `backend` fields (not only through a `DEBUG` parent span that a
//! subscriber filtering at `INFO` never records), and a configurable slow-acquisition
//! threshold. Each test captures the events of its own (current-thread) runtime.

use std::collections::HashMap;
use std::error::Error as _;
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use redlock::{LockError, LockManager, LockOptions};
use redlock_testkit::{ChaosProxy, Fault, RedisServer};
use tracing::field::{Field, Visit};
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::Layer;

/// One event as a subscriber sees it: its own fields only (never its spans').
#[derive(Debug, Clone)]
struct Captured {
    level: tracing::Level,
    target: String,
    message: String,
    fields: HashMap<String, String>,
    /// The fields of the spans the event is in (names only), innermost first.
    span_fields: Vec<String>,
}

impl Captured {
    fn field(&self, name: &str) -> Option<&str> {
        self.fields.get(name).map(String::as_str)
    }

    /// The event as one log line: the message, then `name=value` for each field.
    fn line(&self) -> String {
        let mut fields: Vec<_> = self.fields.iter().collect();
        fields.sort();
        let fields: Vec<String> = fields.iter().map(|(k, v)| format!("{k}={v}")).collect();
        format!("{} {} {}", self.level, self.message, fields.join(" "))
    }
}

/// A layer keeping every event.
#[derive(Clone, Default)]
struct Capture(Arc<Mutex<Vec<Captured>>>);

impl Capture {
    /// Installs the layer for this thread until the guard drops.
    fn install(&self) -> tracing::subscriber::DefaultGuard {
        tracing::subscriber::set_default(tracing_subscriber::registry().with(self.clone()))
    }

    fn all(&self) -> Vec<Captured> {
        self.0.lock().unwrap().clone()
    }

    fn with_message(&self, message: &str) -> Vec<Captured> {
        let events = self.0.lock().unwrap();
        events
            .iter()
            .filter(|e| e.message == message)
            .cloned()
            .collect()
    }
}

struct Fields<'a>(&'a mut Captured);

impl Visit for Fields<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        let value = format!("{value:?}");
        if field.name() == "message" {
            self.0.message = value;
        } else {
            self.0.fields.insert(field.name().to_owned(), value);
        }
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.0.message = value.to_owned();
        } else {
            self.0
                .fields
                .insert(field.name().to_owned(), value.to_owned());
        }
    }
}

/// The names of a span's fields that were given a value.
struct SpanFields(Vec<String>);

struct Names<'a>(&'a mut Vec<String>);

impl Visit for Names<'_> {
    fn record_debug(&mut self, field: &Field, _: &dyn fmt::Debug) {
        self.0.push(field.name().to_owned());
    }
}

impl<S> Layer<S> for Capture
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    fn on_new_span(
        &self,
        attrs: &tracing::span::Attributes<'_>,
        id: &tracing::span::Id,
        ctx: Context<'_, S>,
    ) {
        let mut names = Vec::new();
        attrs.record(&mut Names(&mut names));
        if let Some(span) = ctx.span(id) {
            span.extensions_mut().insert(SpanFields(names));
        }
    }

    fn on_record(
        &self,
        id: &tracing::span::Id,
        values: &tracing::span::Record<'_>,
        ctx: Context<'_, S>,
    ) {
        if let Some(span) = ctx.span(id) {
            let mut ext = span.extensions_mut();
            if let Some(SpanFields(names)) = ext.get_mut::<SpanFields>() {
                values.record(&mut Names(names));
            }
        }
    }

    fn on_event(&self, event: &tracing::Event<'_>, ctx: Context<'_, S>) {
        let mut captured = Captured {
            level: *event.metadata().level(),
            target: event.metadata().target().to_owned(),
            message: String::new(),
            fields: HashMap::new(),
            span_fields: Vec::new(),
        };
        event.record(&mut Fields(&mut captured));
        if let Some(scope) = ctx.event_scope(event) {
            for span in scope {
                if let Some(SpanFields(names)) = span.extensions().get::<SpanFields>() {
                    captured.span_fields.extend(names.iter().cloned());
                }
            }
        }
        self.0.lock().unwrap().push(captured);
    }
}

/// Regression (issue 14, item 4): with Redis unreachable (connections reset, reconnects
/// refused), the retried attempts logged `error = redis backend failed during acquire`,
/// the real cause (the reset or refused connection) only in `source()`, and no key: it
/// was in the `DEBUG` span only.
#[tokio::test]
async fn failed_request_log_line_has_the_cause_the_key_and_the_backend() {
    let capture = Capture::default();
    let _guard = capture.install();
    let server = RedisServer::start();
    let proxy = ChaosProxy::start(server.addr()).await.unwrap();
    let locks = LockManager::builder()
        .single(proxy.url())
        .build()
        .await
        .unwrap();
    proxy.set(Fault::Refuse);
    let err = locks
        .lock_with("gone", LockOptions::new().wait(Duration::from_secs(3)))
        .await
        .unwrap_err();
    assert!(matches!(err, LockError::Backend { .. }), "{err}");
    let cause = err
        .source()
        .expect("a backend error has a cause")
        .to_string();
    assert!(
        !cause.is_empty() && !err.to_string().contains(&cause),
        "{err}: {cause}"
    );

    let retries = capture.with_message("acquire attempt failed; retrying");
    assert!(!retries.is_empty(), "no retry was logged");
    for retry in &retries {
        let line = retry.line();
        let error = retry.field("error").unwrap_or_default();
        assert!(
            error.starts_with("redis backend failed during acquire: "),
            "the error without its cause: {line}"
        );
        assert_eq!(retry.field("key"), Some("lock:gone"), "{line}");
        assert_eq!(retry.field("backend"), Some("single"), "{line}");
    }
    // The connection's own failure, as the operating system reported it.
    assert!(
        retries.iter().any(|r| r.line().contains("(os error")),
        "no line names the connection's failure: {retries:#?}"
    );
    // The last retry logged is the error returned, cause included.
    let last = retries.last().unwrap().line();
    assert!(
        last.contains(&cause),
        "the log line lacks the cause {cause:?}: {last}"
    );
}

/// Regression (issue 14, item 4): "slow lock acquisition" (INFO) had no key: the key was
/// a field of its parent span, a `DEBUG` span, so a subscriber at `INFO` showed none.
/// The threshold was a fixed 1 s; it is a builder option now.
#[tokio::test]
async fn slow_acquisition_event_has_key_and_backend_and_a_configurable_threshold() {
    let capture = Capture::default();
    let _guard = capture.install();
    let locks = LockManager::builder()
        .in_memory()
        .slow_acquisition_threshold(Duration::from_millis(50))
        .build()
        .await
        .unwrap();
    let holder = locks.lock("slow_{1}").await.unwrap();
    let release = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(200)).await;
        holder.release().await.unwrap();
    });
    let started = Instant::now();
    let guard = locks.lock("slow_{1}").await.unwrap();
    assert!(started.elapsed() >= Duration::from_millis(150));
    release.await.unwrap();

    let slow = capture.with_message("slow lock acquisition");
    assert_eq!(slow.len(), 1, "{slow:?}");
    let event = &slow[0];
    assert_eq!(event.level, tracing::Level::INFO);
    assert_eq!(
        event.field("key"),
        Some("lock:slow_{1}"),
        "{}",
        event.line()
    );
    assert_eq!(event.field("backend"), Some("memory"), "{}", event.line());
    assert_eq!(event.field("kind"), Some("exclusive"), "{}", event.line());
    assert_eq!(
        event.field("fencing_token"),
        Some(guard.fencing_token().to_string().as_str())
    );
    assert!(event.field("waited").is_some(), "{}", event.line());
    guard.release().await.unwrap();

    // Under the default threshold (1 s) the same wait is not worth a line.
    let quiet = LockManager::builder().in_memory().build().await.unwrap();
    let holder = quiet.lock("slow_{2}").await.unwrap();
    let release = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(100)).await;
        holder.release().await.unwrap();
    });
    quiet
        .lock("slow_{2}")
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    release.await.unwrap();
    assert_eq!(capture.with_message("slow lock acquisition").len(), 1);
}

/// Issue 24, item 6: events were under the target `redlock_runtime::…` (so the filter
/// users wrote for the crate they depend on showed nothing), a healthy run logged
/// nothing at debug, and events repeated their spans' fields. Every event is under the
/// target `redlock`; each acquire and release logs a debug line with key, kind, fencing
/// token and outcome; no event repeats a field of a span it is in.
#[tokio::test]
async fn every_event_is_under_the_redlock_target_with_a_line_per_acquire_and_release() {
    let capture = Capture::default();
    let _guard = capture.install();
    let locks = LockManager::builder().in_memory().build().await.unwrap();
    let exclusive = locks.lock("logged_{1}").await.unwrap();
    assert!(locks.try_lock("logged_{1}").await.unwrap().is_none());
    let reader = locks.read("logged_{2}").await.unwrap();
    let permit = locks.permit("logged_{3}", 2).await.unwrap();
    let tokens = [
        ("lock:logged_{1}", "exclusive", exclusive.fencing_token()),
        ("lock:logged_{2}", "read", reader.fencing_token()),
        ("lock:logged_{3}", "permit", permit.fencing_token()),
    ];
    exclusive.release().await.unwrap();
    reader.release().await.unwrap();
    drop(permit); // released in the background
    let until = Instant::now() + Duration::from_secs(5);
    while capture.with_message("lock released").len() < 3 && Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    let all = capture.all();
    assert!(!all.is_empty());
    for event in &all {
        assert_eq!(event.target, "redlock", "{}", event.line());
        let repeated: Vec<&String> = event
            .span_fields
            .iter()
            .filter(|f| event.fields.contains_key(*f))
            .collect();
        assert!(
            repeated.is_empty(),
            "{} repeats its span's {repeated:?}",
            event.line()
        );
    }
    let acquired = capture.with_message("lock acquired");
    let released = capture.with_message("lock released");
    for (key, kind, token) in tokens {
        for (lines, outcome) in [(&acquired, "acquired"), (&released, "released")] {
            let line = lines
                .iter()
                .find(|e| e.field("key") == Some(key))
                .unwrap_or_else(|| panic!("no {outcome} line for {key}: {all:#?}"));
            assert_eq!(line.level, tracing::Level::DEBUG);
            assert_eq!(line.field("kind"), Some(kind), "{}", line.line());
            assert_eq!(line.field("outcome"), Some(outcome), "{}", line.line());
            assert_eq!(
                line.field("fencing_token"),
                Some(token.to_string().as_str()),
                "{}",
                line.line()
            );
            assert_eq!(line.field("backend"), Some("memory"), "{}", line.line());
        }
    }
    let busy = capture.with_message("lock not acquired");
    assert_eq!(busy.len(), 1, "{busy:#?}");
    assert_eq!(busy[0].field("outcome"), Some("busy"));
    assert_eq!(busy[0].field("key"), Some("lock:logged_{1}"));
}
