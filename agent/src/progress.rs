//! Progress: where a send stands (the engine's `Progress`, read as a
//! `Position`), what the agent's observer (`observer::Shown`) learns of its
//! streams, and a renderer that shows a bar on a terminal and plain
//! periodic lines otherwise.

use std::io::IsTerminal;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};
use wirerate_engine::optimizer::StreamChange;
use wirerate_engine::progress::{Position, Progress as TransferProgress};
use wirerate_engine::tuner::StreamChoice;

use crate::units::{self, fmt_bytes};

/// What is shown of a send.
#[derive(Debug, Default)]
pub struct Progress {
    /// Where it stands: the engine moves it (`SendConfig::progress`).
    pub transfer: Arc<TransferProgress>,
    /// The data streams the per-link tuner chose, and why, once it has.
    pub streams_chosen: OnceLock<StreamChoice>,
    /// What sealed the first connection that authenticated.
    pub encryption: OnceLock<wirerate_engine::encryption::InEffect>,
    /// The streams the optimizer added since, in order (at most
    /// `MOST_CHANGES`, the first ones: a retry before it held starts it
    /// again).
    pub stream_changes: Mutex<Vec<StreamChange>>,
}

/// The most stream changes a run's progress keeps.
pub const MOST_CHANGES: usize = 32;

/// A running renderer; stop it to print the final state.
pub struct Renderer {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Renderer {
    /// Starts rendering `p` on stderr; `quiet` renders nothing.
    pub fn start(p: Arc<Progress>, label: &str, quiet: bool) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        if quiet {
            return Self { stop, thread: None };
        }
        let s = Arc::clone(&stop);
        let label = label.to_string();
        let thread = std::thread::Builder::new()
            .name("progress".into())
            .spawn(move || {
                if std::io::stderr().is_terminal() {
                    bar(&p, &s, &label);
                } else {
                    lines(&p, &s, &label);
                }
            })
            .ok();
        Self { stop, thread }
    }

    /// Stops rendering.
    pub fn finish(mut self) {
        self.stop_now();
    }

    fn stop_now(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Renderer {
    fn drop(&mut self) {
        self.stop_now();
    }
}

impl Progress {
    /// Where the send stands now.
    pub fn position(&self) -> Position {
        self.transfer.position()
    }
}

fn bar(p: &Progress, stop: &AtomicBool, label: &str) {
    let pb = ProgressBar::new(p.position().total);
    pb.set_style(
        ProgressStyle::with_template(
            "{prefix} [{bar:40.cyan/blue}] {bytes}/{total_bytes} {msg} ETA {eta}",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar())
        .progress_chars("=> "),
    );
    pb.set_prefix(label.to_string());
    let mut last = (Instant::now(), 0u64);
    while !stop.load(Ordering::SeqCst) {
        std::thread::sleep(Duration::from_millis(200));
        let Position { total, done, .. } = p.position();
        pb.set_length(total);
        pb.set_position(done);
        let dt = last.0.elapsed().as_secs_f64();
        if dt >= 1.0 {
            let gbps = (done.saturating_sub(last.1)) as f64 * 8.0 / dt / 1e9;
            pb.set_message(format!("{gbps:.2} Gbit/s"));
            last = (Instant::now(), done);
        }
    }
    pb.set_position(p.position().done);
    pb.finish_and_clear();
}

fn lines(p: &Progress, stop: &AtomicBool, label: &str) {
    let start = Instant::now();
    let mut last = (Instant::now(), p.position().done);
    let mut next = Instant::now() + Duration::from_secs(2);
    while !stop.load(Ordering::SeqCst) {
        std::thread::sleep(Duration::from_millis(100));
        if Instant::now() < next {
            continue;
        }
        next += Duration::from_secs(2);
        let Position { total, done, .. } = p.position();
        let total = total.max(1);
        let rate = units::rate(last.1, done, last.0.elapsed().as_secs_f64());
        let eta = units::eta(total.saturating_sub(done), rate)
            .map_or_else(|| "-".into(), |s| format!("{s:.0} s"));
        eprintln!(
            "{label}: {} of {} ({:.1}%), {:.2} Gbit/s, ETA {eta}, elapsed {:.0} s",
            fmt_bytes(done),
            fmt_bytes(total),
            done as f64 * 100.0 / total as f64,
            rate * 8.0 / 1e9,
            start.elapsed().as_secs_f64()
        );
        last = (Instant::now(), done);
    }
}
