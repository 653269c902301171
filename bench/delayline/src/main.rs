//! A delay line on NFQUEUE: every packet queued by an iptables rule is held
//! for `--delay-ms`, then accepted, in arrival order, so the path gains a
//! fixed one-way delay without reordering. `--loss` drops that fraction of
//! packets at random (seeded). Run one instance per network namespace and
//! direction; it exits cleanly on SIGINT/SIGTERM.
#![forbid(unsafe_code)]

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::Parser;
use nfq::{Queue, Verdict};

#[derive(Parser)]
#[command(about = "Hold each NFQUEUE packet for a fixed delay, then accept it")]
struct Args {
    /// NFQUEUE number the iptables rule sends packets to.
    #[arg(long, default_value_t = 0)]
    queue: u16,
    /// One-way delay in milliseconds.
    #[arg(long)]
    delay_ms: f64,
    /// Fraction of packets to drop at random, e.g. 0.0001 for 0.01%.
    #[arg(long, default_value_t = 0.0)]
    loss: f64,
    /// Seed for the loss decisions.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Packets the kernel may queue for us (must cover the bandwidth-delay product).
    #[arg(long, default_value_t = 1 << 20)]
    max_queue: u32,
}

/// Decides which packets to drop: xorshift64*, seeded, no I/O.
struct Loss {
    p: f64,
    state: u64,
}

impl Loss {
    fn drop_next(&mut self) -> bool {
        if self.p <= 0.0 {
            return false;
        }
        self.state ^= self.state >> 12;
        self.state ^= self.state << 25;
        self.state ^= self.state >> 27;
        let r = self.state.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 11;
        (r as f64 / (1u64 << 53) as f64) < self.p
    }
}

fn main() -> Result<()> {
    let a = Args::parse();
    if !(a.delay_ms.is_finite() && a.delay_ms >= 0.0) {
        bail!("--delay-ms must be a number >= 0");
    }
    if !(0.0..1.0).contains(&a.loss) {
        bail!("--loss must be in [0, 1)");
    }
    let delay = Duration::from_secs_f64(a.delay_ms / 1e3);
    let mut q = Queue::open().context("opening NFQUEUE (needs root or CAP_NET_ADMIN)")?;
    q.bind(a.queue)
        .with_context(|| format!("binding NFQUEUE {}", a.queue))?;
    // Headers are enough: the verdict does not carry the payload back.
    q.set_copy_range(a.queue, 64)?;
    q.set_queue_max_len(a.queue, a.max_queue)?;
    // Whole GSO super-packets: far fewer messages at high rates.
    q.set_recv_gso(a.queue, true)?;
    q.set_fail_open(a.queue, false)?;
    q.set_nonblocking(true);

    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(sig, Arc::clone(&stop))
            .context("installing a signal handler")?;
    }
    let mut loss = Loss {
        p: a.loss,
        state: a.seed | 1,
    };
    let mut held: VecDeque<(Instant, nfq::Message)> = VecDeque::new();
    let (mut passed, mut dropped) = (0u64, 0u64);
    while !stop.load(Ordering::Relaxed) {
        let mut got = false;
        loop {
            match q.recv() {
                Ok(mut msg) => {
                    got = true;
                    if loss.drop_next() {
                        msg.set_verdict(Verdict::Drop);
                        q.verdict(msg)?;
                        dropped += 1;
                    } else {
                        held.push_back((Instant::now() + delay, msg));
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(e) => return Err(e).context("reading NFQUEUE"),
            }
        }
        let now = Instant::now();
        while held.front().is_some_and(|(t, _)| *t <= now) {
            let (_, mut msg) = held.pop_front().expect("checked above");
            msg.set_verdict(Verdict::Accept);
            q.verdict(msg)?;
            passed += 1;
        }
        if !got {
            let until_next = held.front().map_or(Duration::from_millis(1), |(t, _)| {
                t.saturating_duration_since(now)
            });
            std::thread::sleep(until_next.min(Duration::from_micros(100)));
        }
    }
    // Release what is still held rather than leaving it queued.
    while let Some((_, mut msg)) = held.pop_front() {
        msg.set_verdict(Verdict::Accept);
        q.verdict(msg)?;
        passed += 1;
    }
    eprintln!(
        "delayline queue {}: {passed} packets passed, {dropped} dropped",
        a.queue
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::Loss;

    #[test]
    fn loss_rate_is_close_to_p_and_seeded() {
        let run = |seed: u64| {
            let mut l = Loss {
                p: 0.01,
                state: seed | 1,
            };
            (0..200_000).filter(|_| l.drop_next()).count()
        };
        let n = run(7);
        assert!((1600..2400).contains(&n), "{n} drops of 200000 at p = 1%");
        assert_eq!(n, run(7), "same seed, same drops");
        let mut none = Loss { p: 0.0, state: 1 };
        assert!((0..10_000).all(|_| !none.drop_next()));
    }
}
