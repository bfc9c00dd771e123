//! An in-process TCP proxy that injects network faults.

use std::io;
use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio::task::{JoinHandle, JoinSet};
use tokio::time::Instant;

/// How long the proxy waits for the upstream connect of a new connection.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// Read buffer size per direction.
const CHUNK: usize = 16 * 1024;
/// Chunks queued per direction before the proxy stops reading (backpressure).
const QUEUE: usize = 64;

/// A network fault applied by a [`ChaosProxy`] to new and existing connections, in both
/// directions ([`ChaosProxy::set`]) or in one ([`ChaosProxy::set_direction`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Fault {
    /// Forward bytes as they come.
    #[default]
    Pass,
    /// Deliver every chunk this long after it arrived (set in both directions, a round trip
    /// gains twice the delay). Throughput is not limited.
    Delay(Duration),
    /// Accept connections and read bytes, but deliver nothing until the fault changes; then
    /// the held bytes are delivered in order (like dropped packets with TCP retransmission).
    /// A client sees timeouts, not errors. Held bytes are discarded by a reset
    /// ([`ChaosProxy::reset_all`]): blackholing [`Direction::ToClient`] and then resetting
    /// is "request applied, reply lost".
    Blackhole,
    /// Close new connections at once with a TCP reset, and reset the live ones when this fault
    /// is set: a client sees "connection reset" right away, like a node that is down. A TCP
    /// connection cannot be refused one way only: set in either direction, it refuses both.
    Refuse,
}

/// One direction of a proxied connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Direction {
    /// Client to server: requests.
    ToServer,
    /// Server to client: replies (and pushes).
    ToClient,
}

/// What the connection tasks watch.
#[derive(Clone, Copy, Debug)]
struct Control {
    to_server: Fault,
    to_client: Fault,
    /// Bumped by `reset_all`: every connection opened under an older epoch is reset.
    epoch: u64,
    /// Where new connections go ([`ChaosProxy::retarget`] changes it).
    upstream: SocketAddr,
}

impl Control {
    fn fault(&self, direction: Direction) -> Fault {
        match direction {
            Direction::ToServer => self.to_server,
            Direction::ToClient => self.to_client,
        }
    }

    fn refuses(&self) -> bool {
        self.to_server == Fault::Refuse || self.to_client == Fault::Refuse
    }
}

/// A TCP proxy on `127.0.0.1:<ephemeral port>` in front of one upstream server, with
/// switchable [`Fault`]s. Put it between a client and a Redis node to simulate delays,
/// partitions, refused connections and resets, without root and deterministically.
///
/// Runs on the tokio runtime it was started on: one accept task and one task per connection.
///
/// # Drop
///
/// Aborts the accept task and, with it, every connection task: the listener and all proxied
/// sockets are closed.
///
/// # Examples
///
/// ```no_run
/// # #[tokio::main]
/// # async fn main() -> std::io::Result<()> {
/// use redlock_testkit::{ChaosProxy, Direction, Fault, RedisServer};
///
/// let server = RedisServer::start();
/// let proxy = ChaosProxy::start(server.addr()).await?;
/// let client = redis::Client::open(proxy.url()).unwrap();
/// proxy.set(Fault::Blackhole); // the client's commands now time out
/// proxy.set(Fault::Pass); // held bytes are delivered
/// proxy.set_direction(Direction::ToClient, Fault::Blackhole); // requests applied, no replies
/// proxy.reset_all(); // live connections get a TCP reset; the held replies are lost
/// proxy.heal();
/// # drop(client);
/// # Ok(())
/// # }
/// ```
#[derive(Debug)]
pub struct ChaosProxy {
    addr: SocketAddr,
    control: watch::Sender<Control>,
    live: Arc<AtomicUsize>,
    task: JoinHandle<()>,
}

impl ChaosProxy {
    /// Listens on `127.0.0.1:0` and forwards every accepted connection to `upstream`, starting
    /// with [`Fault::Pass`].
    ///
    /// Must be called within a tokio runtime (it spawns the accept task).
    ///
    /// # Errors
    ///
    /// When the listener cannot be bound.
    pub async fn start(upstream: SocketAddr) -> io::Result<ChaosProxy> {
        let listener = TcpListener::bind(("127.0.0.1", 0)).await?;
        let addr = listener.local_addr()?;
        let (control, rx) = watch::channel(Control {
            to_server: Fault::Pass,
            to_client: Fault::Pass,
            epoch: 0,
            upstream,
        });
        let live = Arc::new(AtomicUsize::new(0));
        let task = tokio::spawn(accept_loop(listener, rx, Arc::clone(&live)));
        Ok(ChaosProxy {
            addr,
            control,
            live,
            task,
        })
    }

    /// The address clients connect to.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `redis://127.0.0.1:<proxy port>`.
    pub fn url(&self) -> String {
        format!("redis://{}", self.addr)
    }

    /// The server behind the proxy (new connections go there).
    pub fn upstream(&self) -> SocketAddr {
        self.control.borrow().upstream
    }

    /// Sends new connections to `upstream` from now on and resets every live one (a
    /// virtual IP moved to another server, as after a promotion): clients reconnect
    /// through the same address and reach the new server.
    pub fn retarget(&self, upstream: SocketAddr) {
        self.control.send_modify(|c| {
            c.upstream = upstream;
            c.epoch += 1;
        });
    }

    /// Switches both directions to `fault`, for new and existing connections (see
    /// [`Fault`]). Setting [`Fault::Refuse`] also resets every live connection.
    pub fn set(&self, fault: Fault) {
        self.control.send_modify(|c| {
            c.to_server = fault;
            c.to_client = fault;
            if fault == Fault::Refuse {
                c.epoch += 1;
            }
        });
    }

    /// Switches one direction to `fault`, for new and existing connections; the other
    /// direction keeps its fault. Setting [`Fault::Refuse`] resets every live connection
    /// and refuses new ones (both ways: see [`Fault::Refuse`]).
    pub fn set_direction(&self, direction: Direction, fault: Fault) {
        self.control.send_modify(|c| {
            match direction {
                Direction::ToServer => c.to_server = fault,
                Direction::ToClient => c.to_client = fault,
            }
            if fault == Fault::Refuse {
                c.epoch += 1;
            }
        });
    }

    /// Back to [`Fault::Pass`] both ways; bytes held by [`Fault::Blackhole`] are delivered.
    pub fn heal(&self) {
        self.set(Fault::Pass);
    }

    /// The fault in effect from client to server (the one [`set`](Self::set) sets both ways).
    pub fn fault(&self) -> Fault {
        self.fault_of(Direction::ToServer)
    }

    /// The fault in effect in `direction`.
    pub fn fault_of(&self, direction: Direction) -> Fault {
        self.control.borrow().fault(direction)
    }

    /// Drops every live connection now, with a TCP reset on both sides (`SO_LINGER` 0),
    /// discarding the bytes held by a [`Fault::Blackhole`] or a [`Fault::Delay`]. New
    /// connections are still accepted.
    pub fn reset_all(&self) {
        self.control.send_modify(|c| c.epoch += 1);
    }

    /// The number of proxied connections currently open.
    pub fn connections(&self) -> usize {
        self.live.load(Ordering::Relaxed)
    }
}

impl Drop for ChaosProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Accepts connections and runs one task per connection; the tasks live in a `JoinSet`, so
/// aborting this task aborts them all.
async fn accept_loop(
    listener: TcpListener,
    control: watch::Receiver<Control>,
    live: Arc<AtomicUsize>,
) {
    let mut conns = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((client, _)) => {
                    if control.borrow().refuses() {
                        reset_on_close(&client);
                        drop(client);
                        continue;
                    }
                    let upstream = control.borrow().upstream;
                    let task = proxy_conn(client, upstream, control.clone(), Arc::clone(&live));
                    conns.spawn(task);
                }
                // E.g. out of file descriptors: back off instead of spinning.
                Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
            },
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
        }
    }
}

/// Decrements the live-connection count when a connection task ends (or is aborted).
struct LiveGuard(Arc<AtomicUsize>);

impl Drop for LiveGuard {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Proxies one connection until both directions end or a reset is requested.
async fn proxy_conn(
    mut client: TcpStream,
    upstream: SocketAddr,
    control: watch::Receiver<Control>,
    live: Arc<AtomicUsize>,
) {
    live.fetch_add(1, Ordering::Relaxed);
    let _guard = LiveGuard(live);
    let epoch = control.borrow().epoch;
    let mut server = match tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(upstream)).await
    {
        Ok(Ok(s)) => s,
        _ => {
            reset_on_close(&client);
            return;
        }
    };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let reset = {
        let (cr, cw) = client.split();
        let (sr, sw) = server.split();
        let mut watch_reset = control.clone();
        tokio::select! {
            _ = async {
                tokio::join!(
                    pump(cr, sw, Direction::ToServer, control.clone()),
                    pump(sr, cw, Direction::ToClient, control),
                )
            } => false,
            _ = reset_requested(&mut watch_reset, epoch) => true,
        }
    };
    if reset {
        reset_on_close(&client);
        reset_on_close(&server);
    }
}

/// Resolves once the epoch differs from `epoch`, or the proxy is gone.
async fn reset_requested(control: &mut watch::Receiver<Control>, epoch: u64) {
    loop {
        if control.borrow_and_update().epoch != epoch {
            return;
        }
        if control.changed().await.is_err() {
            return;
        }
    }
}

/// Copies `r` to `w` chunk by chunk, holding each chunk as the fault of `direction`
/// demands, then shuts `w` down (half-close) so the peer sees the end of stream.
async fn pump<R, W>(mut r: R, mut w: W, direction: Direction, mut control: watch::Receiver<Control>)
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let (tx, mut queue) = mpsc::channel::<(Instant, Vec<u8>)>(QUEUE);
    let reader = async move {
        let mut buf = vec![0u8; CHUNK];
        loop {
            match r.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => {
                    if tx.send((Instant::now(), buf[..n].to_vec())).await.is_err() {
                        return;
                    }
                }
            }
        }
    };
    let writer = async move {
        while let Some((arrived, bytes)) = queue.recv().await {
            loop {
                let fault = control.borrow_and_update().fault(direction);
                let changed = match fault {
                    Fault::Pass | Fault::Refuse => break,
                    Fault::Blackhole => control.changed().await,
                    Fault::Delay(d) => tokio::select! {
                        _ = tokio::time::sleep_until(arrived + d) => break,
                        changed = control.changed() => changed,
                    },
                };
                if changed.is_err() {
                    return;
                }
            }
            if w.write_all(&bytes).await.is_err() {
                return;
            }
        }
        let _ = w.shutdown().await;
    };
    tokio::join!(reader, writer);
}

/// Sets `SO_LINGER` to 0 so that closing `stream` sends a TCP reset instead of a FIN.
fn reset_on_close(stream: &TcpStream) {
    let linger = libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    let len = libc::socklen_t::try_from(std::mem::size_of::<libc::linger>()).unwrap_or(8);
    // SAFETY: the fd is open (borrowed from `stream`) and `linger` is a valid `struct linger`
    // of `len` bytes that outlives the call.
    unsafe {
        libc::setsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            std::ptr::addr_of!(linger).cast::<libc::c_void>(),
            len,
        );
    }
}
