//! Which backend a builder connects to, and how: a name, the nodes it was given, and a
//! connect function. A builder method makes one (`LockManagerBuilder::single` and its
//! siblings), so a new backend is its own module, its [`Backend`] variant and one
//! builder method, with no list of backends to extend here.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use redis::ConnectionInfo;

use super::{Backend, Timeouts};
use crate::node::{IntoNode, Redacted};
use crate::waiters::Wake;
use crate::LockError;

/// What every backend is connected with: the builder's settings, and how its waiters
/// are woken.
pub(crate) struct Settings {
    pub(crate) timeouts: Timeouts,
    /// Redlock's bound on each node's reply.
    pub(crate) redlock_node_timeout: Duration,
    pub(crate) wake: Wake,
}

/// A backend being connected.
type Connecting = Pin<Box<dyn Future<Output = Result<Backend, LockError>> + Send>>;

/// A connect function: the nodes (converted) and the settings to a connected backend.
type Connect = Arc<dyn Fn(Vec<ConnectionInfo>, Settings) -> Connecting + Send + Sync>;

/// A backend to connect to. A node list that did not convert keeps the reason, reported
/// by `build`. Its `Debug` shows the nodes with their passwords redacted.
#[derive(Clone)]
pub(crate) struct Target {
    name: &'static str,
    /// Shown before the nodes: what they are asked about (a Sentinel master's name),
    /// or `..` for a configured client shown as nothing more.
    label: Option<String>,
    nodes: Result<Vec<ConnectionInfo>, String>,
    connect: Connect,
}

impl Target {
    /// `name`'s backend on `nodes`, connected by `connect`.
    pub(crate) fn new<F, Fut>(
        name: &'static str,
        nodes: Result<Vec<ConnectionInfo>, String>,
        connect: F,
    ) -> Self
    where
        F: Fn(Vec<ConnectionInfo>, Settings) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Backend, LockError>> + Send + 'static,
    {
        Self {
            name,
            label: None,
            nodes,
            connect: Arc::new(move |nodes, settings| Box::pin(connect(nodes, settings))),
        }
    }

    /// The target, its nodes shown after `label` (see the field).
    pub(crate) fn labelled(mut self, label: String) -> Self {
        self.label = Some(label);
        self
    }

    /// The nodes given as a list, each converted; the first failure, naming its place.
    pub(crate) fn nodes<I>(urls: I) -> Result<Vec<ConnectionInfo>, String>
    where
        I: IntoIterator,
        I::Item: IntoNode,
    {
        urls.into_iter()
            .enumerate()
            .map(|(i, url)| {
                url.into_node()
                    .map_err(|e| format!("invalid Redis node #{} of the list: {e}", i + 1))
            })
            .collect()
    }

    /// The nodes' settings (none for the in-memory store and a configured cluster
    /// client), or why they are invalid.
    pub(crate) fn checked(&self) -> Result<&[ConnectionInfo], LockError> {
        self.nodes
            .as_deref()
            .map_err(|e| LockError::invalid_option(e.clone()))
    }

    /// Connects to the backend (PINGing every node).
    pub(crate) async fn connect(self, settings: Settings) -> Result<Backend, LockError> {
        let nodes = self.nodes.map_err(LockError::invalid_option)?;
        (self.connect)(nodes, settings).await
    }
}

/// The one node of a target made of one.
pub(crate) fn only(nodes: Vec<ConnectionInfo>) -> Result<ConnectionInfo, LockError> {
    let count = nodes.len();
    let mut nodes = nodes.into_iter();
    match (nodes.next(), nodes.next()) {
        (Some(node), None) => Ok(node),
        _ => Err(LockError::invalid_option(format!(
            "one Redis node expected, {count} given"
        ))),
    }
}

impl fmt::Debug for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        struct Nodes<'a>(&'a [ConnectionInfo]);
        impl fmt::Debug for Nodes<'_> {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.debug_list().entries(self.0.iter().map(Redacted)).finish()
            }
        }
        match &self.nodes {
            Err(e) => f.debug_tuple("Invalid").field(e).finish(),
            // No nodes: the in-memory store, or a configured client (its label `..`:
            // its own `Debug` redacts its password, but not necessarily every TLS
            // secret it holds, so none of it is shown).
            Ok(nodes) if nodes.is_empty() && self.label.as_deref() == Some("..") => {
                write!(f, "{}(..)", self.name)
            }
            Ok(nodes) if nodes.is_empty() && self.label.is_none() => f.write_str(self.name),
            Ok(nodes) => {
                let mut tuple = f.debug_tuple(self.name);
                if let Some(label) = &self.label {
                    tuple.field(label);
                }
                tuple.field(&Nodes(nodes)).finish()
            }
        }
    }
}
