//! The receiver's side of a session's control connection.
//!
//! What frame may come when, how big a manifest may grow, when a file's
//! result may be answered, when the sender must hear a keepalive, when a
//! silent sender is given up and when the session is over. The shell reads
//! frames and feeds them in, feeds in the writer's verdicts and the
//! answers to what it was asked to do (admit, plan), and carries out the
//! actions it polls: write a frame, tell the writer, end the session.

use std::collections::{HashSet, VecDeque};
use std::time::{Duration, Instant};

use super::describe;
use crate::by_id::ById;
use crate::liveness::{Due, Liveness};
use crate::tuning::SyncLevel;
use crate::violation::{Violation, ViolationKind};
use crate::wire::{
    Codecs, EntryKind, FileEntry, Frame, MAX_ENTRIES, MAX_MANIFEST_BYTES, PlanOutcome, SessionId,
    Stripe, StripeRole, Verification,
};

/// What the receiver allows a session, fixed when it starts.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Largest block size it will buffer (half its buffer).
    pub max_block: u64,
    /// Most manifest entries.
    pub max_entries: usize,
    /// Most bytes of destination paths in the manifest.
    pub max_manifest_bytes: usize,
    /// How often the sender must hear from us.
    pub keepalive: Duration,
    /// How long a silent sender is waited for.
    pub idle_timeout: Duration,
    /// Which sessions it takes: written ones, memory-to-memory tests
    /// (verified and dropped), or both.
    pub discard: DiscardPolicy,
}

/// Whether a receiver takes memory-to-memory sessions, whose blocks are
/// verified and dropped.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum DiscardPolicy {
    /// Only sessions that write (the default), so that no sender can make
    /// a receiver look like it stored data.
    #[default]
    Refuse,
    /// Both kinds (`serve --allow-discard`).
    Allow,
    /// Memory-to-memory tests only (`serve --discard-only`): a standing
    /// path-test listener, whose token lets its holders measure the path
    /// and write nothing.
    Only,
}

impl Limits {
    /// The protocol's own caps on the manifest, with the receiver's
    /// buffer and timing.
    pub fn new(max_block: u64, keepalive: Duration, idle_timeout: Duration) -> Self {
        Self {
            max_block,
            max_entries: MAX_ENTRIES,
            max_manifest_bytes: MAX_MANIFEST_BYTES,
            keepalive,
            idle_timeout,
            discard: DiscardPolicy::Refuse,
        }
    }
}

/// Why the receiver will not go on with a session; the sender hears the
/// message before the connection closes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// Whether trying again later can help (busy) or not (too big).
    pub retryable: bool,
    /// What the sender's user should do.
    pub message: String,
    /// Why, for the `rejected` metric.
    pub reason: RefusalReason,
}

/// Why a session was refused, as the metrics count it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RefusalReason {
    /// Its block size is over half the receiver's buffer.
    BlockSize,
    /// Its manifest is too big or names a file id twice.
    Manifest,
    /// The receiver has as many sessions as it takes.
    Busy,
    /// The receiver's buffer memory is taken.
    Memory,
    /// A session with its id is already open.
    SessionOpen,
    /// Another session holds one of its destinations.
    DestinationBusy,
    /// A memory-to-memory session that this receiver does not allow, or
    /// that asks to re-read a disk it does not write.
    Discard,
    /// A session of a transfer over several pairs whose root is not the
    /// storage the transfer's other receivers share.
    NotShared,
}

impl RefusalReason {
    /// The `rejected` metric's `reason` label.
    pub fn metric_label(self) -> &'static str {
        match self {
            Self::BlockSize => "block_size",
            Self::Manifest => "manifest",
            Self::Busy => "busy",
            Self::Memory => "memory",
            Self::SessionOpen => "protocol",
            Self::DestinationBusy => "destination_busy",
            Self::Discard => "discard",
            Self::NotShared => "not_shared",
        }
    }
}

/// What the writer has to say to the sender.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// A file is published (`ok`) or given up, with the receiver's digest.
    File {
        /// Which file.
        file_id: u32,
        /// Published under its final name.
        ok: bool,
        /// The receiver's digest.
        digest: u128,
        /// The identity of the entry the receiver holds.
        identity: u64,
        /// Why not, when not ok.
        message: String,
    },
    /// The writer failed; the session ends with this error.
    Failed {
        /// Whether a new session can help.
        retryable: bool,
        /// What went wrong, and what to do.
        message: String,
    },
}

/// A sender's report for the writer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Report {
    /// Every block of the file has gone out; answer once they are written.
    Done {
        /// Which file.
        file_id: u32,
        /// The sender's digest.
        digest: u128,
        /// The sender's identity of the file.
        identity: u64,
    },
    /// The sender gave the file up.
    Abort {
        /// Which file.
        file_id: u32,
        /// Why.
        message: String,
    },
}

/// How the control connection ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum End {
    /// The sender said it is done.
    Finished,
    /// Every accepted file has its result.
    Answered,
    /// The session was refused (the sender was told why).
    Refused(Refusal),
    /// The writer failed (the sender was told why).
    WriterFailed {
        /// Whether a new session can help.
        retryable: bool,
        /// The writer's error.
        message: String,
    },
    /// The sender broke the protocol.
    Violation(Violation),
    /// The sender was silent this long, past the idle timeout.
    Silent(Duration),
    /// The connection failed under the shell (a read, a write, the writer
    /// gone); the reason is the shell's error.
    Lost(String),
}

impl End {
    /// Whether the session ended as the protocol means it to.
    pub fn is_clean(&self) -> bool {
        matches!(self, Self::Finished | Self::Answered)
    }
}

/// What the shell must do next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Write this frame on the control connection.
    Send(Frame),
    /// Reserve what the session needs (a session slot, buffers, its id),
    /// then call [`ReceiverControl::handle_admitted`].
    Admit {
        /// The sender's session id.
        session: SessionId,
        /// Block size in bytes, within [`Limits::max_block`].
        block_size: u64,
        /// Data streams the sender will open.
        streams: u16,
        /// Verification level.
        verify: Verification,
        /// A memory-to-memory session (allowed by [`Limits::discard`]):
        /// verify the blocks, then drop them.
        discard: bool,
        /// The codecs its blocks may come packed in.
        codecs: Codecs,
        /// Which files to answer `PlanOutcome::Present` for.
        sync: SyncLevel,
        /// A dry run: plan without creating or changing anything; no
        /// block follows, and the plan's end is the session's.
        dry_run: bool,
    },
    /// The manifest is complete and within bounds (unique ids): claim and
    /// prepare the destinations, calling [`ReceiverControl::handle_planned`]
    /// for each as it is decided, then [`ReceiverControl::handle_plan_end`]
    /// (or [`ReceiverControl::handle_plan`] with the whole plan).
    Prepare(Vec<FileEntry>),
    /// Pass the sender's report on to the writer.
    Report(Report),
    /// The session is over; nothing more is read or written.
    Close(End),
}

/// Where an accepted file stands on the control connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum FileState {
    /// Its blocks may still be coming.
    Sending,
    /// The sender reported it done or aborted; the writer owes a verdict.
    Reported,
    /// Its result went out.
    Answered,
}

/// Marks `file_id` reported by a `frame` (FileDone or FileAbort), or says
/// how that breaks the protocol: a file is reported once, and only one the
/// plan accepted.
fn reported(files: &mut ById<FileState>, file_id: u32, frame: &str) -> Result<(), Violation> {
    match files.get_mut(file_id) {
        Some(s @ FileState::Sending) => {
            *s = FileState::Reported;
            Ok(())
        }
        Some(FileState::Reported | FileState::Answered) => Err(Violation::new(
            ViolationKind::Repeated,
            format!("{frame} for file {file_id}, which was already reported"),
        )),
        None => Err(Violation::new(
            ViolationKind::Unknown,
            format!("{frame} for file {file_id}, which the plan did not accept"),
        )),
    }
}

#[derive(Debug)]
enum State {
    AwaitOpen,
    Admitting,
    Manifest {
        entries: Vec<FileEntry>,
        ids: HashSet<u32>,
        path_bytes: usize,
    },
    Preparing {
        /// The files planned so far that the plan accepts.
        accepted: Vec<(u32, FileState)>,
    },
    Results {
        files: ById<FileState>,
    },
    Ended,
}

/// The receiver's control-connection state machine for one session.
#[derive(Debug)]
pub struct ReceiverControl {
    limits: Limits,
    state: State,
    actions: VecDeque<Action>,
    live: Liveness,
    accepted: u64,
    answered: u64,
    end: Option<End>,
    /// Set by a `Stripe` frame before the manifest.
    stripe: Option<Stripe>,
    /// The run of files accepted afresh that the plan has not sent yet
    /// (`PlanRun`): its first file and how many.
    run: Option<(u32, u32)>,
    /// Set by a dry-run `Open`: the plan is all the session does.
    dry_run: bool,
}

impl ReceiverControl {
    /// A connection that has authenticated and must now open a session.
    pub fn new(limits: Limits) -> Self {
        Self {
            limits,
            state: State::AwaitOpen,
            actions: VecDeque::new(),
            live: Liveness::default(),
            accepted: 0,
            answered: 0,
            end: None,
            stripe: None,
            run: None,
            dry_run: false,
        }
    }

    /// The session's part in a transfer over several pairs, if it has one:
    /// checked against the manifest when it ended.
    pub fn stripe(&self) -> Option<&Stripe> {
        self.stripe.as_ref()
    }

    /// The next thing to do, in order; call until it returns `None` after
    /// every `handle_*`.
    #[must_use]
    pub fn poll_action(&mut self) -> Option<Action> {
        let next = self.actions.pop_front();
        if next.is_none() && self.actions.capacity() > 64 {
            // A plan of a million entries went through here: give the
            // queue's memory back rather than hold it all session.
            self.actions.shrink_to(64);
        }
        next
    }

    /// When [`Self::handle_timeout`] must next be called, if ever; ask
    /// again after every `handle_*`.
    #[must_use]
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.live.poll_timeout()
    }

    /// Time has passed: a keepalive may be due, or the sender given up.
    pub fn handle_timeout(&mut self, now: Instant) {
        match self.live.poll(now) {
            Due::Nothing => {}
            Due::Keepalive => self.send(Frame::Keepalive, now),
            Due::GiveUp(silent) => self.close(End::Silent(silent)),
        }
    }

    /// A frame arrived from the sender at `now`.
    pub fn handle_frame(&mut self, frame: Frame, now: Instant) {
        if self.end.is_some() {
            return;
        }
        self.live.handle_heard(now);
        match (&mut self.state, frame) {
            (
                State::AwaitOpen,
                Frame::Open {
                    session,
                    block_size,
                    streams,
                    verify,
                    discard,
                    codecs,
                    sync,
                    dry_run,
                },
            ) => {
                let block_size = u64::from(block_size);
                if dry_run && discard {
                    self.refuse(Refusal {
                        retryable: false,
                        message: "a memory-to-memory test (--synthetic) has nothing to plan: \
                                  a dry run sends files"
                            .into(),
                        reason: RefusalReason::Discard,
                    });
                    return;
                }
                if !discard && self.limits.discard == DiscardPolicy::Only {
                    self.refuse(Refusal {
                        retryable: false,
                        message: "this receiver takes only memory-to-memory tests \
                                  (send --synthetic, probe) and writes nothing: \
                                  send files to a receiver that stores them"
                            .into(),
                        reason: RefusalReason::Discard,
                    });
                    return;
                }
                if discard && self.limits.discard == DiscardPolicy::Refuse {
                    self.refuse(Refusal {
                        retryable: false,
                        message: "this receiver does not take memory-to-memory tests \
                                  (--synthetic): its operator can allow them with \
                                  `serve --allow-discard`"
                            .into(),
                        reason: RefusalReason::Discard,
                    });
                    return;
                }
                if discard && verify == Verification::Reread {
                    self.refuse(Refusal {
                        retryable: false,
                        message: "a memory-to-memory test writes nothing to re-read: \
                                  use --verify checksums"
                            .into(),
                        reason: RefusalReason::Discard,
                    });
                    return;
                }
                if block_size > self.limits.max_block {
                    let message = format!(
                        "block size {} is more than this receiver allows ({}, half its buffer); \
                         send with a smaller blockSize (--block-size) or raise the receiver's \
                         bufferSize (--buffer)",
                        crate::units::fmt_bytes(block_size),
                        crate::units::fmt_bytes(self.limits.max_block)
                    );
                    self.refuse(Refusal {
                        retryable: false,
                        message,
                        reason: RefusalReason::BlockSize,
                    });
                    return;
                }
                self.state = State::Admitting;
                self.dry_run = dry_run;
                self.actions.push_back(Action::Admit {
                    session,
                    block_size,
                    streams,
                    verify,
                    discard,
                    codecs,
                    sync,
                    dry_run,
                });
            }
            (
                State::Manifest {
                    entries,
                    ids,
                    path_bytes,
                },
                Frame::Files { entries: chunk },
            ) => {
                for e in chunk {
                    if !ids.insert(e.file_id) {
                        let message =
                            format!("file id {} appears twice in the manifest", e.file_id);
                        self.refuse(Refusal {
                            retryable: false,
                            message,
                            reason: RefusalReason::Manifest,
                        });
                        return;
                    }
                    // Attributes are held with the paths, and bounded with
                    // them, each with what holding it costs beyond its bytes.
                    *path_bytes += e.path.len()
                        + e.meta
                            .as_ref()
                            .map_or(0, |m| 64 + m.xattr_bytes() + 64 * m.xattrs.len());
                    entries.push(e);
                }
                if entries.len() > self.limits.max_entries
                    || *path_bytes > self.limits.max_manifest_bytes
                {
                    let message = format!(
                        "manifest over {} entries or {} of paths and attributes; split the transfer",
                        self.limits.max_entries,
                        crate::units::fmt_bytes(self.limits.max_manifest_bytes as u64)
                    );
                    self.refuse(Refusal {
                        retryable: false,
                        message,
                        reason: RefusalReason::Manifest,
                    });
                }
            }
            (State::Manifest { entries, .. }, Frame::Stripe(_))
                if self.dry_run && entries.is_empty() =>
            {
                self.refuse(Refusal {
                    retryable: false,
                    message: "a dry run is planned on one pair, not over several".into(),
                    reason: RefusalReason::Manifest,
                });
            }
            (State::Manifest { entries, .. }, Frame::Stripe(stripe))
                if entries.is_empty() && self.stripe.is_none() =>
            {
                self.stripe = Some(stripe);
            }
            (State::Manifest { entries, .. }, Frame::FilesEnd) => {
                let entries = std::mem::take(entries);
                if let Some(message) = self.stripe.as_ref().and_then(|s| stripe_fault(s, &entries))
                {
                    self.refuse(Refusal {
                        retryable: false,
                        message,
                        reason: RefusalReason::Manifest,
                    });
                    return;
                }
                self.state = State::Preparing {
                    accepted: Vec::with_capacity(entries.len()),
                };
                // Preparing a large tree takes a while: the sender waiting
                // for the plan hears now and then that we are at it.
                self.live.arm_keepalive(now, self.limits.keepalive);
                self.actions.push_back(Action::Prepare(entries));
            }
            (
                State::Results { files, .. },
                Frame::FileDone {
                    file_id,
                    digest,
                    identity,
                },
            ) => match reported(files, file_id, "FileDone") {
                Ok(()) => self.actions.push_back(Action::Report(Report::Done {
                    file_id,
                    digest,
                    identity,
                })),
                Err(v) => self.violation(v),
            },
            (State::Results { files, .. }, Frame::FileAbort { file_id, message }) => {
                match reported(files, file_id, "FileAbort") {
                    Ok(()) => self
                        .actions
                        .push_back(Action::Report(Report::Abort { file_id, message })),
                    Err(v) => self.violation(v),
                }
            }
            (State::Results { .. }, Frame::Keepalive) => {}
            (State::Results { .. }, Frame::Finish) => self.close(End::Finished),
            (state, other) => {
                let expected = match state {
                    State::AwaitOpen => "a session to open",
                    State::Manifest { .. } => "the manifest",
                    State::Results { .. } => "results or keepalives",
                    State::Admitting | State::Preparing { .. } | State::Ended => "nothing",
                };
                self.violation(Violation::unexpected(expected, describe(&other)));
            }
        }
    }

    /// The shell's answer to [`Action::Admit`].
    pub fn handle_admitted(&mut self, admitted: Result<(), Refusal>) {
        if !matches!(self.state, State::Admitting) {
            return;
        }
        match admitted {
            Ok(()) => {
                self.state = State::Manifest {
                    entries: Vec::new(),
                    ids: HashSet::new(),
                    path_bytes: 0,
                };
            }
            Err(r) => self.refuse(r),
        }
    }

    /// A destination claim or the plan failed: the session cannot go on.
    pub fn handle_refused(&mut self, refusal: Refusal) {
        if self.end.is_none() {
            self.refuse(refusal);
        }
    }

    /// The connection failed under the shell: the session is over. After
    /// a clean end this means its last words (a result) did not reach the
    /// sender, so the end is not clean after all; nothing more is polled.
    pub fn handle_lost(&mut self, reason: String) {
        match &self.end {
            None => self.close(End::Lost(reason)),
            Some(end) if end.is_clean() => self.end = Some(End::Lost(reason)),
            Some(_) => {}
        }
    }

    /// The shell's answer to [`Action::Prepare`]: each entry's outcome, in
    /// manifest order. The plan goes out and results are awaited.
    pub fn handle_plan(&mut self, plan: Vec<(u32, PlanOutcome)>, now: Instant) {
        for (file_id, outcome) in plan {
            self.handle_planned(file_id, outcome, now);
        }
        self.handle_plan_end(now);
    }

    /// One entry's outcome, as soon as the shell has decided it: it goes
    /// out now, so that what the shell allocated for it (its resume
    /// bitmap) is freed long before the last of a million entries is
    /// prepared, rather than left between the session's lasting state.
    pub fn handle_planned(&mut self, file_id: u32, outcome: PlanOutcome, now: Instant) {
        let State::Preparing { accepted } = &mut self.state else {
            return;
        };
        let fresh = match &outcome {
            PlanOutcome::Accept { have } => {
                accepted.push((file_id, FileState::Sending));
                have.iter().all(|&b| b == 0)
            }
            PlanOutcome::Refuse { .. } | PlanOutcome::Present => false,
        };
        if fresh {
            if let Some((first, count)) = &mut self.run {
                if first.checked_add(*count) == Some(file_id) {
                    *count += 1;
                    return;
                }
            }
            self.flush_plan(now);
            self.run = Some((file_id, 1));
            return;
        }
        self.flush_plan(now);
        self.send(Frame::Plan { file_id, outcome }, now);
    }

    /// Sends the run of files accepted afresh that is still held, so that
    /// the sender hears it: the shell calls this before each batch of the
    /// plan goes out, and the plan's end does.
    pub fn flush_plan(&mut self, now: Instant) {
        if let Some((first, count)) = self.run.take() {
            self.send(Frame::PlanRun { first, count }, now);
        }
    }

    /// Every entry is planned and the shell is ready for blocks: the plan
    /// ends and results are awaited.
    pub fn handle_plan_end(&mut self, now: Instant) {
        let State::Preparing { accepted } = &mut self.state else {
            return;
        };
        // A dry run's accepted files are only what a run would send:
        // nothing is owed for them, and a report of one is a violation.
        let accepted = std::mem::take(accepted);
        let files: ById<FileState> = if self.dry_run {
            ById::default()
        } else {
            accepted.into_iter().collect()
        };
        self.flush_plan(now);
        self.send(Frame::PlanEnd, now);
        self.accepted = files.len() as u64;
        self.state = State::Results { files };
        self.live.arm_idle(now, self.limits.idle_timeout);
    }

    /// The writer has a verdict.
    pub fn handle_verdict(&mut self, verdict: Verdict, now: Instant) {
        if self.end.is_some() {
            return;
        }
        match verdict {
            Verdict::File {
                file_id,
                ok,
                digest,
                identity,
                message,
            } => {
                let State::Results { files } = &mut self.state else {
                    return;
                };
                // One result per file the sender reported: the writer
                // answers nothing else, and a second one would confuse
                // the sender's count.
                let Some(s @ FileState::Reported) = files.get_mut(file_id) else {
                    return;
                };
                *s = FileState::Answered;
                self.answered += 1;
                self.send(
                    Frame::FileResult {
                        file_id,
                        ok,
                        digest,
                        identity,
                        message,
                    },
                    now,
                );
                if self.answered >= self.accepted {
                    // The session is over now, not a round trip later when
                    // the sender's Finish arrives.
                    self.close(End::Answered);
                }
            }
            Verdict::Failed { retryable, message } => {
                self.send(
                    Frame::Error {
                        retryable,
                        message: message.clone(),
                    },
                    now,
                );
                self.close(End::WriterFailed { retryable, message });
            }
        }
    }

    /// Files the plan accepted.
    pub fn accepted(&self) -> u64 {
        self.accepted
    }

    /// Files whose result went out.
    pub fn answered(&self) -> u64 {
        self.answered
    }

    /// How the connection ended, once it has.
    pub fn end(&self) -> Option<&End> {
        self.end.as_ref()
    }

    /// The session's outcome for its summary. `writer_error` is the
    /// writer's own failure, `taken_over` whether a newer session of the
    /// same sender took its files.
    pub fn outcome(&self, writer_error: Option<&str>, taken_over: bool) -> SessionOutcome {
        if let Some(e) = writer_error {
            return SessionOutcome::Failed {
                reason: e.to_owned(),
            };
        }
        match &self.end {
            Some(End::WriterFailed { message, .. }) => SessionOutcome::Failed {
                reason: message.clone(),
            },
            Some(End::Finished | End::Answered) if self.answered >= self.accepted => {
                SessionOutcome::Complete
            }
            Some(End::Finished | End::Answered) => SessionOutcome::Interrupted {
                reason: format!(
                    "the sender finished with {} of {} files unanswered",
                    self.accepted - self.answered,
                    self.accepted
                ),
            },
            _ if taken_over => SessionOutcome::Interrupted {
                reason: "its sender went silent, and a new session of it took its files over"
                    .into(),
            },
            Some(End::Silent(silent)) => SessionOutcome::Interrupted {
                reason: format!(
                    "nothing heard for {:.0} s (--idle-timeout), so it is presumed gone; what it wrote is checkpointed",
                    silent.as_secs_f64()
                ),
            },
            Some(End::Refused(r)) => SessionOutcome::Interrupted {
                reason: r.message.clone(),
            },
            Some(End::Violation(v)) => SessionOutcome::Interrupted {
                reason: format!("peer violated the protocol: {v}"),
            },
            Some(End::Lost(reason)) => SessionOutcome::Interrupted {
                reason: reason.clone(),
            },
            None => SessionOutcome::Interrupted {
                reason: "the connection ended".into(),
            },
        }
    }

    fn send(&mut self, frame: Frame, now: Instant) {
        self.live.handle_sent(now);
        self.actions.push_back(Action::Send(frame));
    }

    fn refuse(&mut self, r: Refusal) {
        self.actions.push_back(Action::Send(Frame::Error {
            retryable: r.retryable,
            message: r.message.clone(),
        }));
        self.close(End::Refused(r));
    }

    fn violation(&mut self, what: Violation) {
        // The sender hears why. A well-formed frame that breaks a rule is
        // a peer's bug or malice, not damage (frames carry checks), but
        // like a broken connection it is resumed within --retry-for; only
        // versions at odds are final (see `Error::disposition`).
        self.actions.push_back(Action::Send(Frame::Error {
            retryable: what.kind != ViolationKind::Version,
            message: format!("protocol violation: {what}"),
        }));
        self.close(End::Violation(what));
    }

    fn close(&mut self, end: End) {
        self.state = State::Ended;
        self.live.disarm();
        self.end = Some(end.clone());
        self.actions.push_back(Action::Close(end));
    }
}

/// What is wrong with a `Stripe` frame for `entries`, if anything: a
/// session that writes pieces has exactly one for each regular file and
/// none for anything else; one that publishes or unmarks has none.
fn stripe_fault(stripe: &Stripe, entries: &[FileEntry]) -> Option<String> {
    let writes = matches!(stripe.role, StripeRole::Mark | StripeRole::Write);
    if !writes {
        return (!stripe.pieces.is_empty())
            .then(|| format!("a {:?} session carries no pieces", stripe.role));
    }
    let files: std::collections::HashMap<u32, u64> = entries
        .iter()
        .filter(|e| e.kind == EntryKind::File)
        .map(|e| (e.file_id, e.size))
        .collect();
    let mut seen = HashSet::with_capacity(stripe.pieces.len());
    for p in &stripe.pieces {
        if !files.contains_key(&p.file_id) {
            return Some(format!(
                "a piece of file {}, which is not a regular file of the manifest",
                p.file_id
            ));
        }
        if !seen.insert(p.file_id) {
            return Some(format!("file {} has two pieces", p.file_id));
        }
    }
    (seen.len() != files.len()).then(|| {
        format!(
            "{} of the manifest's {} regular files have no piece",
            files.len() - seen.len(),
            files.len()
        )
    })
}

/// How a receiver's session ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SessionOutcome {
    /// Every file the session accepted has its result.
    Complete,
    /// The session ended before every file had its result; a new session
    /// of the same transfer resumes what is durable.
    Interrupted {
        /// Why, for the person reading the summary.
        reason: String,
    },
    /// The receiver itself failed (its writer, its disk).
    Failed {
        /// The error, with what to do.
        reason: String,
    },
}

impl SessionOutcome {
    /// Whether every accepted file has its result.
    pub fn is_complete(&self) -> bool {
        matches!(self, Self::Complete)
    }

    /// The failure, if the receiver failed.
    pub fn failure(&self) -> Option<&str> {
        match self {
            Self::Failed { reason } => Some(reason),
            _ => None,
        }
    }
}

impl std::fmt::Display for SessionOutcome {
    /// `complete`, `interrupted: why` or `failed: why`, as the summary and
    /// `--json` have always shown it.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Complete => f.write_str("complete"),
            Self::Interrupted { reason } => write!(f, "interrupted: {reason}"),
            Self::Failed { reason } => write!(f, "failed: {reason}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::EntryKind;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    const KEEPALIVE: Duration = Duration::from_secs(5);
    const IDLE: Duration = Duration::from_secs(30);

    fn limits() -> Limits {
        Limits {
            max_block: 64 << 20,
            max_entries: 16,
            max_manifest_bytes: 1024,
            keepalive: KEEPALIVE,
            idle_timeout: IDLE,
            discard: DiscardPolicy::Refuse,
        }
    }

    fn entry(file_id: u32) -> FileEntry {
        FileEntry {
            file_id,
            kind: EntryKind::File,
            size: 1 << 20,
            fingerprint: 7,
            mode: 0o644,
            mtime: (0, 0),
            digest: None,
            meta: None,
            path: format!("f{file_id}"),
        }
    }

    fn open(block_size: u32) -> Frame {
        open_as(block_size, false)
    }

    fn open_as(block_size: u32, dry_run: bool) -> Frame {
        Frame::Open {
            session: [1; 16],
            block_size,
            streams: 4,
            verify: Verification::Checksums,
            discard: false,
            codecs: Codecs::NONE,
            sync: SyncLevel::None,
            dry_run,
        }
    }

    fn drain(core: &mut ReceiverControl) -> Vec<Action> {
        std::iter::from_fn(|| core.poll_action()).collect()
    }

    fn accept() -> PlanOutcome {
        PlanOutcome::Accept { have: vec![0] }
    }

    /// A core that took `frames` after its admission, with what it did.
    fn after_admission(frames: Vec<Frame>) -> (ReceiverControl, Vec<Action>) {
        let now = Instant::now();
        let mut core = ReceiverControl::new(limits());
        core.handle_frame(open(1 << 20), now);
        drain(&mut core);
        core.handle_admitted(Ok(()));
        for f in frames {
            core.handle_frame(f, now);
        }
        let actions = drain(&mut core);
        (core, actions)
    }

    fn stripe(role: StripeRole, pieces: &[(u32, u64, u64)]) -> Frame {
        Frame::Stripe(Stripe {
            group: 9,
            role,
            pieces: pieces
                .iter()
                .map(|&(file_id, first, end)| crate::wire::StripePiece {
                    file_id,
                    first,
                    end,
                })
                .collect(),
        })
    }

    #[test]
    fn a_stripe_must_come_before_the_manifest_and_fit_it() {
        let files = || Frame::Files {
            entries: vec![entry(1), entry(2)],
        };
        // One piece per regular file: prepared, with the stripe kept.
        let (core, actions) = after_admission(vec![
            stripe(StripeRole::Write, &[(1, 0, 1), (2, 0, 0)]),
            files(),
            Frame::FilesEnd,
        ]);
        assert!(matches!(&actions[..], [Action::Prepare(e)] if e.len() == 2));
        assert_eq!(core.stripe().unwrap().pieces.len(), 2);
        let refused = |frames| {
            let (_, actions) = after_admission(frames);
            match &actions[..] {
                [Action::Send(Frame::Error { message, .. }), Action::Close(_)] => message.clone(),
                other => panic!("not refused: {other:?}"),
            }
        };
        let cases = [
            (
                vec![stripe(StripeRole::Write, &[(1, 0, 1)])],
                "have no piece",
            ),
            (
                vec![stripe(
                    StripeRole::Write,
                    &[(1, 0, 1), (1, 1, 2), (2, 0, 1)],
                )],
                "two pieces",
            ),
            (
                vec![stripe(
                    StripeRole::Write,
                    &[(1, 0, 1), (2, 0, 1), (7, 0, 1)],
                )],
                "not a regular file",
            ),
            (
                vec![stripe(StripeRole::Publish, &[(1, 0, 1)])],
                "carries no pieces",
            ),
        ];
        for (mut frames, want) in cases {
            frames.extend([files(), Frame::FilesEnd]);
            let message = refused(frames);
            assert!(message.contains(want), "{message}");
        }
        // After the manifest started, or twice: out of order.
        let message = refused(vec![files(), stripe(StripeRole::Publish, &[])]);
        assert!(message.contains("protocol violation"), "{message}");
        let message = refused(vec![
            stripe(StripeRole::Publish, &[]),
            stripe(StripeRole::Publish, &[]),
        ]);
        assert!(message.contains("protocol violation"), "{message}");
    }

    /// A core past its plan, with files 1 and 2 accepted and 3 refused.
    fn planned(now: Instant) -> ReceiverControl {
        let mut core = ReceiverControl::new(limits());
        core.handle_frame(open(1 << 20), now);
        assert!(matches!(drain(&mut core)[..], [Action::Admit { .. }]));
        core.handle_admitted(Ok(()));
        core.handle_frame(
            Frame::Files {
                entries: vec![entry(1), entry(2), entry(3)],
            },
            now,
        );
        core.handle_frame(Frame::FilesEnd, now);
        let [Action::Prepare(entries)] = &drain(&mut core)[..] else {
            panic!("no prepare");
        };
        assert_eq!(entries.len(), 3);
        core.handle_plan(
            vec![
                (1, accept()),
                (2, accept()),
                (
                    3,
                    PlanOutcome::Refuse {
                        message: "no".into(),
                    },
                ),
            ],
            now,
        );
        let sent = drain(&mut core);
        // The two files accepted afresh go as one run.
        assert_eq!(
            sent,
            vec![
                Action::Send(Frame::PlanRun { first: 1, count: 2 }),
                Action::Send(Frame::Plan {
                    file_id: 3,
                    outcome: PlanOutcome::Refuse {
                        message: "no".into()
                    }
                }),
                Action::Send(Frame::PlanEnd),
            ]
        );
        core
    }

    #[test]
    fn files_accepted_afresh_go_as_runs_which_a_flush_or_the_end_sends() {
        let now = Instant::now();
        let (mut core, _) = after_admission(vec![
            Frame::Files {
                entries: (1..=7).map(entry).collect(),
            },
            Frame::FilesEnd,
        ]);
        let held = PlanOutcome::Accept { have: vec![0b01] };
        core.handle_planned(1, accept(), now);
        core.handle_planned(2, accept(), now);
        // Held back until the shell flushes the plan's batch.
        assert_eq!(drain(&mut core), []);
        core.flush_plan(now);
        core.handle_planned(3, accept(), now);
        // A file resumed, or not next in line, ends the run.
        core.handle_planned(4, held.clone(), now);
        core.handle_planned(5, accept(), now);
        core.handle_planned(7, accept(), now);
        core.handle_plan_end(now);
        let run = |first, count| Action::Send(Frame::PlanRun { first, count });
        assert_eq!(
            drain(&mut core),
            [
                run(1, 2),
                run(3, 1),
                Action::Send(Frame::Plan {
                    file_id: 4,
                    outcome: held
                }),
                run(5, 1),
                run(7, 1),
                Action::Send(Frame::PlanEnd),
            ]
        );
    }

    fn verdict(file_id: u32) -> Verdict {
        Verdict::File {
            file_id,
            ok: true,
            digest: 9,
            identity: 0,
            message: String::new(),
        }
    }

    #[test]
    fn a_session_ends_when_every_accepted_file_is_answered() {
        let now = Instant::now();
        let mut core = planned(now);
        core.handle_frame(
            Frame::FileDone {
                file_id: 1,
                digest: 9,
                identity: 3,
            },
            now,
        );
        assert_eq!(
            drain(&mut core),
            [Action::Report(Report::Done {
                file_id: 1,
                digest: 9,
                identity: 3,
            })]
        );
        core.handle_verdict(verdict(1), now);
        assert!(matches!(
            drain(&mut core)[..],
            [Action::Send(Frame::FileResult { file_id: 1, .. })]
        ));
        core.handle_frame(
            Frame::FileAbort {
                file_id: 2,
                message: "changed".into(),
            },
            now,
        );
        assert!(matches!(
            drain(&mut core)[..],
            [Action::Report(Report::Abort { file_id: 2, .. })]
        ));
        core.handle_verdict(verdict(2), now);
        assert!(matches!(
            drain(&mut core)[..],
            [
                Action::Send(Frame::FileResult { file_id: 2, .. }),
                Action::Close(End::Answered)
            ]
        ));
        assert_eq!(core.outcome(None, false), SessionOutcome::Complete);
        assert_eq!(core.poll_timeout(), None);
    }

    #[test]
    fn a_last_result_that_cannot_be_written_is_not_a_clean_end() {
        let now = Instant::now();
        let mut core = planned(now);
        core.handle_frame(Frame::Finish, now);
        drain(&mut core);
        core.handle_lost("broken pipe".into());
        assert_eq!(drain(&mut core), [], "nothing after the close");
        assert!(!core.end().is_some_and(End::is_clean));
        core.handle_lost("twice".into());
        assert_eq!(core.end(), Some(&End::Lost("broken pipe".into())));
    }

    #[test]
    fn a_dry_run_owes_nothing_for_what_it_accepted_and_ends_at_finish() {
        let now = Instant::now();
        let dry = |now| {
            let mut core = ReceiverControl::new(limits());
            core.handle_frame(open_as(1 << 20, true), now);
            assert!(matches!(
                drain(&mut core)[..],
                [Action::Admit { dry_run: true, .. }]
            ));
            core.handle_admitted(Ok(()));
            core.handle_frame(
                Frame::Files {
                    entries: vec![entry(1), entry(2)],
                },
                now,
            );
            core.handle_frame(Frame::FilesEnd, now);
            drain(&mut core);
            core.handle_plan(vec![(1, accept()), (2, accept())], now);
            assert_eq!(
                drain(&mut core),
                [
                    Action::Send(Frame::PlanRun { first: 1, count: 2 }),
                    Action::Send(Frame::PlanEnd)
                ]
            );
            core
        };
        let mut core = dry(now);
        core.handle_frame(Frame::Finish, now);
        assert_eq!(drain(&mut core), [Action::Close(End::Finished)]);
        assert_eq!(core.outcome(None, false), SessionOutcome::Complete);
        // A block's report after a dry plan: the plan took nothing.
        let mut core = dry(now);
        core.handle_frame(
            Frame::FileDone {
                file_id: 1,
                digest: 0,
                identity: 0,
            },
            now,
        );
        assert!(matches!(
            drain(&mut core)[..],
            [
                Action::Send(Frame::Error { .. }),
                Action::Close(End::Violation(_))
            ]
        ));
    }

    #[test]
    fn a_finish_with_files_unanswered_is_interrupted() {
        let now = Instant::now();
        let mut core = planned(now);
        core.handle_frame(Frame::Finish, now);
        assert_eq!(drain(&mut core), [Action::Close(End::Finished)]);
        assert_eq!(
            core.outcome(None, false).to_string(),
            "interrupted: the sender finished with 2 of 2 files unanswered"
        );
    }

    #[test]
    fn a_block_size_over_half_the_buffer_is_refused_for_good() {
        let mut core = ReceiverControl::new(limits());
        core.handle_frame(open(128 << 20), Instant::now());
        let actions = drain(&mut core);
        let [
            Action::Send(Frame::Error { retryable, message }),
            Action::Close(End::Refused(r)),
        ] = &actions[..]
        else {
            panic!("{actions:?}");
        };
        assert!(!retryable);
        assert!(message.contains("--block-size"), "{message}");
        assert_eq!(r.reason, RefusalReason::BlockSize);
    }

    #[test]
    fn a_memory_to_memory_session_needs_the_receivers_consent() {
        let synthetic = |verify| Frame::Open {
            session: [2; 16],
            block_size: 1 << 20,
            streams: 2,
            verify,
            discard: true,
            codecs: Codecs::NONE,
            sync: SyncLevel::None,
            dry_run: false,
        };
        let refusal = |limits: Limits, verify| {
            let mut core = ReceiverControl::new(limits);
            core.handle_frame(synthetic(verify), Instant::now());
            match &drain(&mut core)[..] {
                [
                    Action::Send(Frame::Error { retryable, message }),
                    Action::Close(End::Refused(r)),
                ] => {
                    assert!(!retryable);
                    assert_eq!(r.reason, RefusalReason::Discard);
                    Some(message.clone())
                }
                [Action::Admit { discard, .. }] => {
                    assert!(discard);
                    None
                }
                other => panic!("{other:?}"),
            }
        };
        let allowing = |discard| Limits {
            discard,
            ..limits()
        };
        let message = refusal(limits(), Verification::Checksums).expect("refused by default");
        assert!(message.contains("--allow-discard"), "{message}");
        for policy in [DiscardPolicy::Allow, DiscardPolicy::Only] {
            assert_eq!(refusal(allowing(policy), Verification::Checksums), None);
            assert_eq!(refusal(allowing(policy), Verification::None), None);
            let message =
                refusal(allowing(policy), Verification::Reread).expect("nothing to re-read");
            assert!(message.contains("--verify checksums"), "{message}");
        }
    }

    #[test]
    fn a_discard_only_receiver_refuses_every_session_that_would_write() {
        // A path-test listener's token is handed to other pools' agents:
        // it must buy them a measurement of the path and never a write.
        let only = Limits {
            discard: DiscardPolicy::Only,
            ..limits()
        };
        for verify in [
            Verification::Checksums,
            Verification::None,
            Verification::Reread,
        ] {
            let mut core = ReceiverControl::new(only.clone());
            core.handle_frame(
                Frame::Open {
                    session: [3; 16],
                    block_size: 1 << 20,
                    streams: 2,
                    verify,
                    discard: false,
                    codecs: Codecs::NONE,
                    sync: SyncLevel::None,
                    dry_run: false,
                },
                Instant::now(),
            );
            match &drain(&mut core)[..] {
                [
                    Action::Send(Frame::Error { retryable, message }),
                    Action::Close(End::Refused(r)),
                ] => {
                    assert!(!retryable);
                    assert_eq!(r.reason, RefusalReason::Discard);
                    assert!(message.contains("only memory-to-memory"), "{message}");
                }
                other => panic!("{verify:?}: {other:?}"),
            }
        }
        // The same session is admitted where writing is allowed.
        let mut core = ReceiverControl::new(limits());
        core.handle_frame(open(1 << 20), Instant::now());
        assert!(matches!(&drain(&mut core)[..], [Action::Admit { .. }]));
    }

    #[test]
    fn manifests_are_bounded_and_ids_unique() {
        let now = Instant::now();
        let admitted = || {
            let mut core = ReceiverControl::new(limits());
            core.handle_frame(open(1 << 20), now);
            core.handle_admitted(Ok(()));
            drain(&mut core);
            core
        };
        let mut core = admitted();
        core.handle_frame(
            Frame::Files {
                entries: vec![entry(1), entry(1)],
            },
            now,
        );
        assert!(matches!(
            &drain(&mut core)[..],
            [Action::Send(Frame::Error { message, .. }), Action::Close(End::Refused(_))]
                if message.contains("appears twice")
        ));
        let mut core = admitted();
        core.handle_frame(
            Frame::Files {
                entries: (0..17).map(entry).collect(),
            },
            now,
        );
        assert!(matches!(
            &drain(&mut core)[..],
            [Action::Send(Frame::Error { message, .. }), Action::Close(End::Refused(_))]
                if message.contains("split the transfer")
        ));
        let mut core = admitted();
        let mut long = entry(1);
        long.path = "x".repeat(1025);
        core.handle_frame(
            Frame::Files {
                entries: vec![long],
            },
            now,
        );
        assert!(matches!(
            drain(&mut core).last(),
            Some(Action::Close(End::Refused(_)))
        ));
    }

    #[test]
    fn reports_for_files_not_accepted_or_reported_twice_are_violations() {
        let now = Instant::now();
        let done = |file_id| Frame::FileDone {
            file_id,
            digest: 0,
            identity: 0,
        };
        let abort = Frame::FileAbort {
            file_id: 1,
            message: String::new(),
        };
        for (frames, kind, says) in [
            (vec![done(3)], ViolationKind::Unknown, "did not accept"),
            (vec![done(99)], ViolationKind::Unknown, "did not accept"),
            (
                vec![done(1), abort],
                ViolationKind::Repeated,
                "already reported",
            ),
            (
                vec![Frame::PlanEnd],
                ViolationKind::Unexpected,
                "got PlanEnd",
            ),
        ] {
            let mut core = planned(now);
            for f in frames {
                core.handle_frame(f, now);
            }
            let actions = drain(&mut core);
            assert!(
                matches!(
                    &actions[actions.len().saturating_sub(2)..],
                    [
                        Action::Send(Frame::Error { retryable: true, message }),
                        Action::Close(End::Violation(v))
                    ] if message.starts_with("protocol violation")
                        && v.kind == kind
                        && v.detail.contains(says)
                ),
                "the sender hears why ({kind:?}: {says}), then the close: {actions:?}"
            );
        }
    }

    // Found by the proptest below: the violation's message cut the frame's
    // description at byte 200, inside a character the sender chose.
    #[test]
    fn a_hostile_message_is_cut_on_a_character_boundary() {
        let mut core = ReceiverControl::new(limits());
        core.handle_frame(
            Frame::FileAbort {
                file_id: 10,
                message: "\u{e9}".repeat(150),
            },
            Instant::now(),
        );
        let Some(End::Violation(v)) = core.end() else {
            panic!("{:?}", core.end());
        };
        assert_eq!(v.kind, ViolationKind::Unexpected);
        assert!(
            v.detail
                .starts_with("expected a session to open, got FileAbort"),
            "{v}"
        );
    }

    #[test]
    fn a_verdict_for_an_unreported_file_is_not_answered() {
        let now = Instant::now();
        let mut core = planned(now);
        core.handle_verdict(verdict(1), now);
        core.handle_verdict(verdict(3), now);
        assert_eq!(drain(&mut core), []);
        assert_eq!(core.answered(), 0);
    }

    #[test]
    fn the_sender_hears_keepalives_while_we_plan_and_silence_ends_the_session() {
        let t0 = Instant::now();
        let mut core = ReceiverControl::new(limits());
        core.handle_frame(open(1 << 20), t0);
        core.handle_admitted(Ok(()));
        core.handle_frame(Frame::FilesEnd, t0);
        drain(&mut core);
        assert_eq!(core.poll_timeout(), Some(t0 + KEEPALIVE));
        core.handle_timeout(t0 + KEEPALIVE - Duration::from_millis(1));
        assert_eq!(drain(&mut core), []);
        core.handle_timeout(t0 + KEEPALIVE);
        assert_eq!(drain(&mut core), [Action::Send(Frame::Keepalive)]);

        let t1 = t0 + Duration::from_secs(7);
        core.handle_plan(vec![(1, accept())], t1);
        drain(&mut core);
        // Anything sent counts as a sign of life: the plan went out at t1.
        assert_eq!(core.poll_timeout(), Some(t1 + KEEPALIVE));
        let t2 = t1 + Duration::from_secs(20);
        core.handle_frame(Frame::Keepalive, t2);
        core.handle_timeout(t2 + IDLE - Duration::from_secs(1));
        assert!(core.end().is_none(), "heard at t2");
        core.handle_timeout(t2 + IDLE);
        assert!(matches!(
            drain(&mut core).last(),
            Some(Action::Close(End::Silent(_)))
        ));
        assert!(
            core.outcome(None, false)
                .to_string()
                .contains("presumed gone")
        );
        assert!(
            core.outcome(None, true)
                .to_string()
                .contains("took its files over")
        );
    }

    #[test]
    fn a_writer_failure_is_told_and_fails_the_session() {
        let now = Instant::now();
        let mut core = planned(now);
        core.handle_verdict(
            Verdict::Failed {
                retryable: true,
                message: "disk full".into(),
            },
            now,
        );
        assert!(matches!(
            &drain(&mut core)[..],
            [
                Action::Send(Frame::Error {
                    retryable: true,
                    ..
                }),
                Action::Close(End::WriterFailed { .. })
            ]
        ));
        assert_eq!(core.outcome(None, false).failure(), Some("disk full"));
    }

    /// What the shell does, chosen by the test.
    #[derive(Debug, Clone)]
    enum Step {
        Frame(Frame),
        Verdict(Verdict),
        Wait(u64),
        Admit(bool),
        Plan(Vec<bool>),
        Lost,
    }

    fn small_id() -> impl Strategy<Value = u32> {
        0u32..6
    }

    fn arb_step() -> impl Strategy<Value = Step> {
        prop_oneof![
            // Anything at all a hostile peer could send.
            2 => crate::wire::arb_frame().prop_map(Step::Frame),
            // The protocol's own frames, about the files the plan knows.
            2 => (1u32..=64).prop_map(|b| Step::Frame(open(b * 4096 * 256))),
            2 => proptest::collection::vec(small_id(), 0..6).prop_map(|ids| Step::Frame(Frame::Files {
                entries: ids.into_iter().map(entry).collect()
            })),
            2 => Just(Step::Frame(Frame::FilesEnd)),
            4 => (small_id(), any::<u128>())
                .prop_map(|(file_id, digest)| Step::Frame(Frame::FileDone { file_id, digest, identity: 0 })),
            1 => small_id().prop_map(|file_id| Step::Frame(Frame::FileAbort {
                file_id,
                message: String::new()
            })),
            1 => Just(Step::Frame(Frame::Keepalive)),
            1 => Just(Step::Frame(Frame::Finish)),
            4 => (small_id(), any::<bool>()).prop_map(|(file_id, ok)| Step::Verdict(Verdict::File {
                file_id,
                ok,
                digest: 0,
                identity: 0,
                message: String::new()
            })),
            1 => any::<bool>().prop_map(|retryable| Step::Verdict(Verdict::Failed {
                retryable,
                message: "writer failed".into()
            })),
            2 => (0u64..40_000).prop_map(Step::Wait),
            2 => any::<bool>().prop_map(Step::Admit),
            2 => proptest::collection::vec(any::<bool>(), 0..8).prop_map(Step::Plan),
            1 => Just(Step::Lost),
        ]
    }

    /// After the plan: mostly what a sender and a writer do, sometimes
    /// anything at all.
    fn arb_tail_step() -> impl Strategy<Value = Step> {
        prop_oneof![
            1 => crate::wire::arb_frame().prop_map(Step::Frame),
            6 => (small_id(), any::<u128>())
                .prop_map(|(file_id, digest)| Step::Frame(Frame::FileDone { file_id, digest, identity: 0 })),
            2 => small_id().prop_map(|file_id| Step::Frame(Frame::FileAbort {
                file_id,
                message: "\u{e9}".repeat(150)
            })),
            2 => Just(Step::Frame(Frame::Keepalive)),
            1 => Just(Step::Frame(Frame::Finish)),
            8 => (small_id(), any::<bool>()).prop_map(|(file_id, ok)| Step::Verdict(Verdict::File {
                file_id,
                ok,
                digest: 0,
                identity: 0,
                message: String::new()
            })),
            1 => Just(Step::Verdict(Verdict::Failed {
                retryable: false,
                message: "writer failed".into()
            })),
            3 => (0u64..40_000).prop_map(Step::Wait),
            1 => Just(Step::Lost),
        ]
    }

    /// Whole sessions: most open, plan and report as the protocol says
    /// and then go astray; the rest are hostile from the first frame.
    fn arb_session() -> impl Strategy<Value = Vec<Step>> {
        (
            proptest::bool::weighted(0.85),
            proptest::collection::vec(small_id(), 0..6),
            proptest::collection::vec(any::<bool>(), 0..6),
            proptest::collection::vec(arb_step(), 0..20),
            proptest::collection::vec(arb_tail_step(), 0..60),
        )
            .prop_map(|(lawful, ids, plan, hostile, tail)| {
                let mut steps = if lawful {
                    vec![
                        Step::Frame(open(1 << 20)),
                        Step::Admit(true),
                        Step::Frame(Frame::Files {
                            entries: ids.into_iter().map(entry).collect(),
                        }),
                        Step::Frame(Frame::FilesEnd),
                        Step::Plan(plan),
                    ]
                } else {
                    hostile
                };
                steps.extend(tail);
                steps
            })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        /// The receiver core fed anything in any order: it never panics,
        /// holds no more manifest than its bound, answers each file at most
        /// once and only after the sender reported it, says nothing after
        /// it closed, and always has a deadline while it is open.
        #[test]
        fn hostile_sequences_keep_the_core_sound(steps in arb_session()) {
            let t0 = Instant::now();
            let mut now = t0;
            let mut core = ReceiverControl::new(limits());
            let mut prepared: Vec<u32> = Vec::new();
            let mut accepted: BTreeMap<u32, bool> = BTreeMap::new();
            let mut reported: BTreeMap<u32, ()> = BTreeMap::new();
            let mut answered: BTreeMap<u32, ()> = BTreeMap::new();
            let mut closed = false;
            for step in steps {
                match step {
                    Step::Frame(f) => core.handle_frame(f, now),
                    Step::Verdict(v) => core.handle_verdict(v, now),
                    Step::Wait(ms) => {
                        now += Duration::from_millis(ms);
                        core.handle_timeout(now);
                    }
                    Step::Admit(ok) => core.handle_admitted(if ok {
                        Ok(())
                    } else {
                        Err(Refusal { retryable: true, message: "busy".into(), reason: RefusalReason::Busy })
                    }),
                    Step::Plan(choices) => {
                        let plan: Vec<_> = prepared
                            .iter()
                            .zip(choices.iter().chain(std::iter::repeat(&true)))
                            .map(|(&id, &ok)| {
                                (id, if ok { accept() } else { PlanOutcome::Refuse { message: "no".into() } })
                            })
                            .collect();
                        if matches!(core.state, State::Preparing { .. }) {
                            for (id, o) in &plan {
                                accepted.insert(*id, matches!(o, PlanOutcome::Accept { .. }));
                            }
                        }
                        core.handle_plan(plan, now);
                    }
                    Step::Lost => core.handle_lost("cut".into()),
                }
                if let State::Manifest { entries, path_bytes, .. } = &core.state {
                    // One chunk past the bound at most, and only until the
                    // check right after it refuses the session.
                    prop_assert!(entries.len() <= limits().max_entries);
                    prop_assert!(*path_bytes <= limits().max_manifest_bytes);
                }
                while let Some(a) = core.poll_action() {
                    prop_assert!(!closed, "{a:?} after the session closed");
                    match a {
                        Action::Prepare(entries) => {
                            prepared = entries.iter().map(|e| e.file_id).collect();
                            let mut unique = prepared.clone();
                            unique.sort_unstable();
                            unique.dedup();
                            prop_assert_eq!(unique.len(), prepared.len(), "duplicate ids reached the plan");
                        }
                        Action::Report(Report::Done { file_id, .. } | Report::Abort { file_id, .. }) => {
                            prop_assert_eq!(accepted.get(&file_id), Some(&true), "report for a file not accepted");
                            prop_assert!(reported.insert(file_id, ()).is_none(), "file {} reported twice", file_id);
                        }
                        Action::Send(Frame::FileResult { file_id, .. }) => {
                            prop_assert!(reported.contains_key(&file_id), "file {} answered before it was reported", file_id);
                            prop_assert!(answered.insert(file_id, ()).is_none(), "file {} answered twice", file_id);
                        }
                        Action::Close(End::Answered) => {
                            prop_assert_eq!(answered.len(), accepted.values().filter(|a| **a).count());
                            closed = true;
                        }
                        Action::Close(_) => closed = true,
                        Action::Send(_) | Action::Admit { .. } => {}
                    }
                }
                prop_assert_eq!(closed, core.end().is_some());
                if matches!(core.state, State::Results { .. }) {
                    prop_assert!(core.poll_timeout().is_some_and(|t| t > now), "an open session without a deadline");
                }
            }
            // Whatever the sender did, silence ends the session in bounded time.
            if !closed && matches!(core.state, State::Results { .. }) {
                core.handle_timeout(now + IDLE);
                prop_assert!(core.end().is_some());
            }
            let _ = core.outcome(None, false).to_string();
        }
    }
}
