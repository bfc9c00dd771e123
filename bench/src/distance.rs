//! Uncontended lock + release at datacenter distance: the same comparison as
//! `uncontended` (1 task), with every implementation talking to the server through one
//! proxy that holds each chunk [`ONE_WAY`] in each direction, since that ratio is the one
//! a user across a network sees (the round trips count, the CPU less).
//!
//! The proxy runs on plain threads, not tokio: tokio's timers tick in milliseconds, and
//! a sleeping thread with a timer slack of 1 ns wakes within microseconds of its due time.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use crate::raw::{err, Raw, Res};
use crate::uncontended::{self, VsRaw};
use crate::Config;

/// The delay the proxy adds in each direction.
pub const ONE_WAY: Duration = Duration::from_micros(100);

/// A TCP proxy on a free loopback port that forwards every chunk `delay` after it
/// arrived, in both directions, two threads per direction of each connection. Stops
/// accepting when dropped; a connection's threads end when either side closes it.
struct DelayProxy {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
}

impl DelayProxy {
    fn start(upstream: SocketAddr, delay: Duration) -> Res<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").map_err(err)?;
        let addr = listener.local_addr().map_err(err)?;
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = stop.clone();
        thread::spawn(move || {
            for client in listener.incoming() {
                if stopped.load(Ordering::Relaxed) {
                    return;
                }
                let Ok(client) = client else { continue };
                match TcpStream::connect(upstream) {
                    Ok(server) => {
                        let _ = (client.set_nodelay(true), server.set_nodelay(true));
                        forward(&client, &server, delay);
                        forward(&server, &client, delay);
                    }
                    Err(e) => eprintln!("redlock-bench: distance proxy: {e}"),
                }
            }
        });
        Ok(Self { addr, stop })
    }

    fn url(&self) -> String {
        format!("redis://{}", self.addr)
    }
}

impl Drop for DelayProxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        // Wakes the accept loop so that it sees the flag.
        let _ = TcpStream::connect(self.addr);
    }
}

/// Forwards what `from` sends to `to`, each chunk `delay` after it was read.
fn forward(from: &TcpStream, to: &TcpStream, delay: Duration) {
    let (Ok(mut from), Ok(mut to)) = (from.try_clone(), to.try_clone()) else {
        return;
    };
    let (chunks, due) = mpsc::channel::<(Instant, Vec<u8>)>();
    thread::spawn(move || {
        let mut buf = vec![0u8; 64 * 1024];
        // Ends when the peer closes (0 bytes) or the socket fails.
        while let Ok(n @ 1..) = from.read(&mut buf) {
            if chunks
                .send((Instant::now() + delay, buf[..n].to_vec()))
                .is_err()
            {
                break;
            }
        }
    });
    thread::spawn(move || {
        precise_sleeps();
        // Ends when the reader above ended and every chunk was written.
        for (at, chunk) in due {
            thread::sleep(at.saturating_duration_since(Instant::now()));
            if to.write_all(&chunk).is_err() {
                break;
            }
        }
        let _ = to.shutdown(Shutdown::Write);
    });
}

/// Lets this thread's sleeps end within microseconds of their due time (Linux's
/// default timer slack is 50 µs, half the delay under test).
fn precise_sleeps() {
    // SAFETY: PR_SET_TIMERSLACK takes a plain integer and only changes this thread's
    // timer slack; no memory is passed.
    unsafe {
        libc::prctl(libc::PR_SET_TIMERSLACK, 1, 0, 0, 0);
    }
}

/// Prints the table; returns redlock's and rslock's ops/s ÷ raw's through the proxy.
pub async fn run(cfg: &Config, url: &str, pid: u32) -> Res<VsRaw> {
    let upstream: SocketAddr = url.trim_start_matches("redis://").parse().map_err(err)?;
    let proxy = DelayProxy::start(upstream, ONE_WAY)?;
    let rtt = Raw::connect(&proxy.url())
        .await?
        .set_rtt(cfg.rtt_samples / 5)
        .await?;
    let title = format!(
        "uncontended lock+release, 1 task, through a proxy adding {} µs each way (raw SET round trip {:.0} µs; client CPU includes the proxy's threads)",
        ONE_WAY.as_micros(),
        rtt.as_secs_f64() * 1e6
    );
    uncontended::compare(cfg, &proxy.url(), pid, 1, &title).await
}
