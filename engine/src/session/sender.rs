//! The sender's side of a session's control connection.
//!
//! Whether the receiver's plan answers exactly the files offered, once
//! each and with resume bitmaps of the right length; which reports are
//! owed; whether a result may be believed (a file reported, not answered
//! before, its digest ours); when the receiver must hear a keepalive and
//! when a silent one is given up. The shell sends the manifest, feeds in
//! the receiver's frames and the scheduler's finished and failed files,
//! and carries out the actions it polls. Whether the blocks themselves
//! are acknowledged is the scheduler's business.

use std::collections::{HashMap, HashSet, VecDeque};
use std::time::{Duration, Instant};

use super::describe;
use crate::bitmap::Bitmap;
use crate::digest::fmt_digest;
use crate::layout::Layout;
use crate::liveness::{Due, Liveness};
use crate::scheduler::PlannedFile;
use crate::sync::SyncLevel;
use crate::violation::{Violation, ViolationKind};
use crate::wire::{Frame, PlanOutcome, Verification};

/// What the receiver decided, once the whole plan is in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// The files to send, with the blocks the receiver already holds.
    pub accepted: Vec<PlannedFile>,
    /// The files it will not write, and why.
    pub refused: Vec<(u32, String)>,
    /// The files already there, at the session's sync level: not sent.
    pub present: Vec<u32>,
    /// Bytes of the accepted files it already holds.
    pub held_bytes: u64,
}

/// A file's verdict, as the sender records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FileVerdict {
    /// Published, with the digest both sides agree on (0 unverified).
    Ok(u128),
    /// Not published; why.
    Failed(String),
    /// Not sent: already at the destination, at the session's sync level.
    Present,
    /// Not sent: a dry run, whose receiver would take it.
    WouldSend,
}

/// How the control connection ended, when it ended badly.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum End {
    /// The receiver sent an error.
    Remote {
        /// Whether a new session can help.
        retryable: bool,
        /// The receiver's message.
        message: String,
    },
    /// The receiver broke the protocol.
    Violation(Violation),
    /// Nothing heard this long, past the idle timeout.
    Silent(Duration),
    /// The connection failed under the shell before every result came.
    Lost(String),
}

/// What the shell must do next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Write this frame on the control connection.
    Send(Frame),
    /// The plan is in and sound: start sending.
    Planned(Plan),
    /// A file has its verdict.
    Verdict {
        /// Which file.
        file_id: u32,
        /// Its verdict.
        verdict: FileVerdict,
    },
    /// The session cannot go on; nothing more is polled.
    Close(End),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum File {
    /// Offered, not yet in the plan.
    Offered { size: u64 },
    /// The plan refused it.
    Refused,
    /// The plan found it already there.
    Present,
    /// Its blocks may still be going out.
    Sending,
    /// Reported done with this digest; its result is owed.
    Reported(u128),
    /// Given up (FileAbort); its result is owed.
    Aborted,
    /// Its result came.
    Answered,
}

#[derive(Debug, PartialEq, Eq)]
enum State {
    Planning,
    Sending,
    Ended,
}

/// The sender's control-connection state machine for one session.
#[derive(Debug)]
pub struct SenderControl {
    state: State,
    files: HashMap<u32, File>,
    /// Each offered file's identity (`digest::entry_identity`); 0 where
    /// the shell gave none.
    identities: HashMap<u32, u64>,
    /// The session's sync level: under `None` no file may be present.
    sync: SyncLevel,
    /// The offered entries that are directories, which no level finds
    /// present.
    dirs: HashSet<u32>,
    block_size: u64,
    verify: Verification,
    plan: Plan,
    planned: usize,
    keepalive_every: Duration,
    idle_timeout: Duration,
    live: Liveness,
    accepted: usize,
    answered: usize,
    actions: VecDeque<Action>,
    end: Option<End>,
    /// Finish went out: the receiver is given a fixed time to close, which
    /// nothing it sends extends.
    finishing: bool,
}

impl SenderControl {
    /// A session whose manifest offered `offered` (file id and size).
    /// Offering one id twice is the shell's bug; the second one wins.
    pub fn new(
        offered: impl IntoIterator<Item = (u32, u64)>,
        block_size: u64,
        verify: Verification,
        keepalive: Duration,
        idle_timeout: Duration,
    ) -> Self {
        Self {
            state: State::Planning,
            files: offered
                .into_iter()
                .map(|(id, size)| (id, File::Offered { size }))
                .collect(),
            identities: HashMap::new(),
            sync: SyncLevel::None,
            dirs: HashSet::new(),
            block_size,
            verify,
            plan: Plan {
                accepted: Vec::new(),
                refused: Vec::new(),
                present: Vec::new(),
                held_bytes: 0,
            },
            planned: 0,
            keepalive_every: keepalive,
            idle_timeout,
            live: Liveness::default(),
            accepted: 0,
            answered: 0,
            actions: VecDeque::new(),
            end: None,
            finishing: false,
        }
    }

    /// Each offered file's identity (file id and
    /// `digest::entry_identity` of the entry the manifest carried): it
    /// goes with the file's report, and a result that says the file is
    /// published under another is not believed.
    #[must_use]
    pub fn with_identities(mut self, identities: impl IntoIterator<Item = (u32, u64)>) -> Self {
        self.identities = identities.into_iter().collect();
        self
    }

    /// The sync level the session's `Open` named, and which offered
    /// entries are directories: the receiver may answer regular files
    /// present, and only under a level (`SyncLevel::None` by default).
    #[must_use]
    pub fn with_sync(mut self, sync: SyncLevel, dirs: impl IntoIterator<Item = u32>) -> Self {
        self.sync = sync;
        self.dirs = dirs.into_iter().collect();
        self
    }

    /// The next thing to do, in order; call until it returns `None` after
    /// every `handle_*`.
    #[must_use]
    pub fn poll_action(&mut self) -> Option<Action> {
        self.actions.pop_front()
    }

    /// When [`Self::handle_timeout`] must next be called, if ever; ask
    /// again after every `handle_*`.
    #[must_use]
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.live.poll_timeout()
    }

    /// Time has passed: a keepalive may be due, or the receiver given up.
    pub fn handle_timeout(&mut self, now: Instant) {
        match self.live.poll(now) {
            Due::Nothing => {}
            Due::Keepalive => self.send(Frame::Keepalive, now),
            Due::GiveUp(silent) => self.close(End::Silent(silent)),
        }
    }

    /// A frame arrived from the receiver at `now`.
    pub fn handle_frame(&mut self, frame: Frame, now: Instant) {
        if self.end.is_some() {
            return;
        }
        if !self.finishing {
            self.live.handle_heard(now);
        }
        match (&self.state, frame) {
            (_, Frame::Keepalive) => {}
            (_, Frame::Error { retryable, message }) => {
                self.close(End::Remote { retryable, message });
            }
            (State::Planning, Frame::Plan { file_id, outcome }) => {
                self.handle_plan_entry(file_id, outcome);
            }
            (State::Planning, Frame::PlanRun { first, count }) => {
                self.handle_plan_run(first, count);
            }
            (State::Planning, Frame::PlanEnd) => {
                let offered = self.files.len();
                if self.planned != offered {
                    self.violation(Violation::new(
                        ViolationKind::Inconsistent,
                        format!("the plan answered {} of {offered} files", self.planned),
                    ));
                    return;
                }
                self.state = State::Sending;
                self.accepted = self.plan.accepted.len();
                self.live.arm_keepalive(now, self.keepalive_every);
                self.live.arm_idle(now, self.idle_timeout);
                let plan = std::mem::replace(
                    &mut self.plan,
                    Plan {
                        accepted: Vec::new(),
                        refused: Vec::new(),
                        present: Vec::new(),
                        held_bytes: 0,
                    },
                );
                self.actions.push_back(Action::Planned(plan));
            }
            (
                State::Sending,
                Frame::FileResult {
                    file_id,
                    ok,
                    digest,
                    identity,
                    message,
                },
            ) => self.handle_result(file_id, ok, digest, identity, message),
            (State::Planning, other) => {
                self.violation(Violation::unexpected("the plan", describe(&other)));
            }
            (_, other) => self.violation(Violation::new(
                ViolationKind::Unexpected,
                format!("unexpected {} on the control connection", describe(&other)),
            )),
        }
    }

    /// Files `first..first + count` accepted afresh: each as if planned on
    /// its own with an empty resume bitmap, so a run that names a file not
    /// offered, or one already answered, is the same violation.
    fn handle_plan_run(&mut self, first: u32, count: u32) {
        if count as usize > self.files.len() - self.planned {
            self.violation(Violation::new(
                ViolationKind::Inconsistent,
                format!(
                    "a plan run of {count} files, where {} are left to plan",
                    self.files.len() - self.planned
                ),
            ));
            return;
        }
        for i in 0..count {
            // The codec refuses a run past the last id; an open range
            // (`first..`) would step past it after yielding it.
            let Some(file_id) = first.checked_add(i) else {
                self.not_offered(u32::MAX);
                return;
            };
            let Some(File::Offered { size }) = self.files.get(&file_id).copied() else {
                self.not_offered(file_id);
                return;
            };
            self.planned += 1;
            let blocks = Layout::new(size, self.block_size).blocks();
            self.accept(file_id, size, Bitmap::new(blocks));
        }
    }

    fn handle_plan_entry(&mut self, file_id: u32, outcome: PlanOutcome) {
        let Some(File::Offered { size }) = self.files.get(&file_id).copied() else {
            self.not_offered(file_id);
            return;
        };
        self.planned += 1;
        match outcome {
            PlanOutcome::Accept { have } => {
                let layout = Layout::new(size, self.block_size);
                let Some(have) = Bitmap::from_bytes(layout.blocks(), &have) else {
                    self.violation(Violation::new(
                        ViolationKind::Inconsistent,
                        format!("resume bitmap for file {file_id} has the wrong length"),
                    ));
                    return;
                };
                self.accept(file_id, size, have);
            }
            PlanOutcome::Refuse { message } => {
                self.plan.refused.push((file_id, message));
                self.files.insert(file_id, File::Refused);
            }
            PlanOutcome::Present if self.sync == SyncLevel::None => {
                self.violation(Violation::new(
                    ViolationKind::Inconsistent,
                    format!(
                        "file {file_id} answered present, where the session asked for every file"
                    ),
                ));
            }
            PlanOutcome::Present if self.dirs.contains(&file_id) => {
                self.violation(Violation::new(
                    ViolationKind::Inconsistent,
                    format!("directory {file_id} answered present, which no sync level finds"),
                ));
            }
            PlanOutcome::Present => {
                self.plan.present.push(file_id);
                self.files.insert(file_id, File::Present);
            }
        }
    }

    /// A plan answered `file_id` twice, or one it was not offered.
    fn not_offered(&mut self, file_id: u32) {
        let (kind, why) = if self.files.contains_key(&file_id) {
            (ViolationKind::Repeated, "which it had already answered")
        } else {
            (ViolationKind::Unknown, "which was not offered")
        };
        self.violation(Violation::new(
            kind,
            format!("plan for file {file_id}, {why}"),
        ));
    }

    fn accept(&mut self, file_id: u32, size: u64, have: Bitmap) {
        let layout = Layout::new(size, self.block_size);
        self.plan.held_bytes += layout.bytes_in(&have);
        self.plan.accepted.push(PlannedFile {
            file_id,
            size,
            have: Some(have),
        });
        self.files.insert(file_id, File::Sending);
    }

    fn handle_result(
        &mut self,
        file_id: u32,
        ok: bool,
        digest: u128,
        identity: u64,
        message: String,
    ) {
        let ours = self.identity(file_id);
        let verdict = match (self.files.get(&file_id).copied(), ok) {
            // Whatever its data, a file published under another name, size
            // or mode than ours is not the file we sent.
            (Some(File::Reported(_)), true) if identity != ours => FileVerdict::Failed(format!(
                "the receiver published the file under an identity (name, size, mode) \
                 {identity:016x} that differs from the sender's {ours:016x}: the file \
                 list was damaged on the way; check the destination"
            )),
            (Some(File::Reported(_)), true) if self.verify == Verification::None => {
                FileVerdict::Ok(0)
            }
            (Some(File::Reported(ours)), true) if ours == digest => FileVerdict::Ok(digest),
            (Some(File::Reported(ours)), true) => FileVerdict::Failed(format!(
                "receiver digest {} differs from ours {}",
                fmt_digest(digest),
                fmt_digest(ours)
            )),
            (Some(File::Reported(_) | File::Aborted), false) => FileVerdict::Failed(message),
            // A receiver answers a file once it is reported done or given
            // up, never before: its last blocks may still be on the way.
            (Some(File::Sending), _) => {
                self.violation(Violation::new(
                    ViolationKind::Early,
                    format!("result for file {file_id} before it was reported done or given up"),
                ));
                return;
            }
            (Some(File::Aborted), true) => {
                self.violation(Violation::new(
                    ViolationKind::Inconsistent,
                    format!("result for file {file_id} says it is published, but it was given up"),
                ));
                return;
            }
            (Some(File::Answered), _) => {
                self.violation(Violation::new(
                    ViolationKind::Repeated,
                    format!("a second result for file {file_id}"),
                ));
                return;
            }
            (Some(File::Refused | File::Present | File::Offered { .. }) | None, _) => {
                self.violation(Violation::new(
                    ViolationKind::Unknown,
                    format!("result for file {file_id}, which the plan did not accept"),
                ));
                return;
            }
        };
        self.files.insert(file_id, File::Answered);
        self.answered += 1;
        self.actions.push_back(Action::Verdict { file_id, verdict });
    }

    /// Every block of `file_id` has gone out (the scheduler says so), and
    /// this is its digest: the receiver is told, and owes a result.
    pub fn handle_file_done(&mut self, file_id: u32, digest: u128, now: Instant) {
        if self.sending(file_id) {
            self.files.insert(file_id, File::Reported(digest));
            let identity = self.identity(file_id);
            self.send(
                Frame::FileDone {
                    file_id,
                    digest,
                    identity,
                },
                now,
            );
        }
    }

    fn identity(&self, file_id: u32) -> u64 {
        self.identities.get(&file_id).copied().unwrap_or(0)
    }

    /// The scheduler gave `file_id` up (its source changed): the receiver
    /// is told to discard it, and owes a result.
    pub fn handle_file_failed(&mut self, file_id: u32, message: String, now: Instant) {
        if self.sending(file_id) {
            self.files.insert(file_id, File::Aborted);
            self.send(Frame::FileAbort { file_id, message }, now);
        }
    }

    /// Whether `file_id`'s blocks are going out: the session runs, its
    /// plan is out (a file is accepted as its plan frame comes, before the
    /// plan is whole, and nothing may be said of it before the plan), and
    /// the file was accepted and not yet reported.
    fn sending(&self, file_id: u32) -> bool {
        self.end.is_none()
            && self.state == State::Sending
            && self.files.get(&file_id) == Some(&File::Sending)
    }

    /// The shell starts reading and writing the connection at `now`:
    /// time it spent between the plan and here (connecting the data
    /// streams) is not the receiver's silence, nor ours.
    pub fn handle_started(&mut self, now: Instant) {
        if self.end.is_none() && self.state == State::Sending && !self.finishing {
            self.live.arm_keepalive(now, self.keepalive_every);
            self.live.arm_idle(now, self.idle_timeout);
        }
    }

    /// Finish went out at `now`: no more keepalives are owed, and the
    /// receiver has `grace` to close the connection, however much it
    /// still sends.
    pub fn handle_finished(&mut self, now: Instant, grace: Duration) {
        if self.end.is_none() {
            self.finishing = true;
            self.live.disarm();
            self.live.arm_idle(now, grace);
        }
    }

    /// The control connection failed under the shell. Once every result
    /// is in that is how a receiver ends a session, and nothing more is
    /// due on it; before, the session is lost.
    pub fn handle_lost(&mut self, reason: String) {
        if self.end.is_some() {
            return;
        }
        if self.all_answered() {
            self.state = State::Ended;
            self.live.disarm();
        } else {
            self.close(End::Lost(reason));
        }
    }

    /// Files the plan accepted.
    pub fn accepted(&self) -> usize {
        self.accepted
    }

    /// Files with a result.
    pub fn answered(&self) -> usize {
        self.answered
    }

    /// The plan is in and every accepted file has its result.
    pub fn all_answered(&self) -> bool {
        self.state != State::Planning && self.answered >= self.accepted
    }

    /// How the connection ended badly, once it has.
    pub fn end(&self) -> Option<&End> {
        self.end.as_ref()
    }

    fn send(&mut self, frame: Frame, now: Instant) {
        self.live.handle_sent(now);
        self.actions.push_back(Action::Send(frame));
    }

    fn violation(&mut self, what: Violation) {
        // The receiver hears why. A well-formed frame that breaks a rule is
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

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeSet;

    const BLOCK: u64 = 1 << 20;
    const KEEPALIVE: Duration = Duration::from_secs(5);
    const IDLE: Duration = Duration::from_secs(30);

    /// Files 1, 2 and 3: two blocks, one block, empty.
    fn core() -> SenderControl {
        SenderControl::new(
            [(1, 2 * BLOCK), (2, BLOCK), (3, 0)],
            BLOCK,
            Verification::Checksums,
            KEEPALIVE,
            IDLE,
        )
    }

    fn drain(core: &mut SenderControl) -> Vec<Action> {
        std::iter::from_fn(|| core.poll_action()).collect()
    }

    fn accept(file_id: u32, have: &[u8]) -> Frame {
        Frame::Plan {
            file_id,
            outcome: PlanOutcome::Accept {
                have: have.to_vec(),
            },
        }
    }

    fn refuse(file_id: u32) -> Frame {
        Frame::Plan {
            file_id,
            outcome: PlanOutcome::Refuse {
                message: "exists".into(),
            },
        }
    }

    fn result(file_id: u32, ok: bool, digest: u128) -> Frame {
        Frame::FileResult {
            file_id,
            ok,
            digest,
            identity: 0,
            message: if ok { String::new() } else { "no".into() },
        }
    }

    /// Planned: 1 accepted holding its first block, 2 accepted, 3 refused.
    fn planned(now: Instant) -> SenderControl {
        let mut c = core();
        for f in [
            accept(1, &[0b01]),
            accept(2, &[0]),
            refuse(3),
            Frame::PlanEnd,
        ] {
            c.handle_frame(f, now);
        }
        let actions = drain(&mut c);
        let [Action::Planned(plan)] = &actions[..] else {
            panic!("{actions:?}");
        };
        assert_eq!(plan.accepted.len(), 2);
        assert_eq!(plan.refused, [(3, "exists".to_owned())]);
        assert_eq!(plan.held_bytes, BLOCK);
        c
    }

    /// The violation the core closed with, after telling the receiver.
    fn violation(c: &mut SenderControl) -> Violation {
        let actions = drain(c);
        match &actions[actions.len().saturating_sub(2)..] {
            [
                Action::Send(Frame::Error {
                    retryable: true,
                    message,
                }),
                Action::Close(End::Violation(v)),
            ] if message.ends_with(v.detail.as_str()) => v.clone(),
            other => panic!("expected an Error frame and a violation, got {other:?}"),
        }
    }

    // A file found present needs no result, and the session ends once
    // the others are answered; under no sync level a receiver that
    // answers a file present breaks the protocol (it would make the
    // sender count as landed a file it never sent).
    #[test]
    fn files_are_present_only_under_a_sync_level() {
        let now = Instant::now();
        let present = |file_id| Frame::Plan {
            file_id,
            outcome: PlanOutcome::Present,
        };
        let mut c = core().with_sync(SyncLevel::Mtime, []);
        for f in [accept(1, &[0]), present(2), present(3), Frame::PlanEnd] {
            c.handle_frame(f, now);
        }
        let actions = drain(&mut c);
        let [Action::Planned(plan)] = &actions[..] else {
            panic!("{actions:?}");
        };
        assert_eq!(plan.present, [2, 3]);
        assert_eq!(plan.accepted.len(), 1);
        c.handle_frame(present(2), now);
        assert_eq!(violation(&mut c).kind, ViolationKind::Unexpected);

        let mut c = core();
        c.handle_frame(present(2), now);
        let v = violation(&mut c);
        assert_eq!(v.kind, ViolationKind::Inconsistent);
        assert!(v.detail.contains("asked for every file"), "{v:?}");
        // Nor a directory, under any level.
        let mut c = core().with_sync(SyncLevel::Exists, [3]);
        c.handle_frame(present(3), now);
        let v = violation(&mut c);
        assert!(v.detail.contains("directory 3"), "{v:?}");
    }

    #[test]
    fn a_session_reports_files_and_believes_only_matching_results() {
        let now = Instant::now();
        let mut c = planned(now);
        c.handle_file_done(1, 77, now);
        c.handle_file_failed(2, "changed while read".into(), now);
        // Reported once: the scheduler saying it twice changes nothing.
        c.handle_file_done(1, 77, now);
        assert!(matches!(
            &drain(&mut c)[..],
            [
                Action::Send(Frame::FileDone {
                    file_id: 1,
                    digest: 77,
                    identity: 0,
                }),
                Action::Send(Frame::FileAbort { file_id: 2, .. })
            ]
        ));
        c.handle_frame(result(1, true, 78), now);
        c.handle_frame(result(2, false, 0), now);
        assert_eq!(
            drain(&mut c),
            [
                Action::Verdict {
                    file_id: 1,
                    verdict: FileVerdict::Failed(
                        "receiver digest xxh3-128:0000000000000000000000000000004e differs from ours xxh3-128:0000000000000000000000000000004d".into()
                    )
                },
                Action::Verdict {
                    file_id: 2,
                    verdict: FileVerdict::Failed("no".into())
                }
            ]
        );
        assert!(c.all_answered());
        // The receiver closing now is the end it means, and nothing more
        // is due on the connection.
        c.handle_lost("eof".into());
        assert_eq!(c.end(), None);
        assert_eq!(c.poll_timeout(), None);
        c.handle_timeout(now + IDLE);
        assert_eq!(drain(&mut c), []);
    }

    #[test]
    fn unverified_results_need_no_digest() {
        let now = Instant::now();
        let mut c = SenderControl::new([(1, BLOCK)], BLOCK, Verification::None, KEEPALIVE, IDLE);
        c.handle_frame(accept(1, &[0]), now);
        c.handle_frame(Frame::PlanEnd, now);
        c.handle_file_done(1, 5, now);
        drain(&mut c);
        c.handle_frame(result(1, true, 0), now);
        assert_eq!(
            drain(&mut c),
            [Action::Verdict {
                file_id: 1,
                verdict: FileVerdict::Ok(0)
            }]
        );
    }

    #[test]
    fn a_plan_run_accepts_its_files_afresh_and_is_held_to_the_offer() {
        let now = Instant::now();
        let mut c = core();
        for f in [Frame::PlanRun { first: 1, count: 3 }, Frame::PlanEnd] {
            c.handle_frame(f, now);
        }
        let actions = drain(&mut c);
        let [Action::Planned(plan)] = &actions[..] else {
            panic!("{actions:?}");
        };
        let got: Vec<(u32, u64, u64)> = plan
            .accepted
            .iter()
            .map(|p| (p.file_id, p.size, p.have.as_ref().map_or(9, Bitmap::count)))
            .collect();
        assert_eq!(got, [(1, 2 * BLOCK, 0), (2, BLOCK, 0), (3, 0, 0)]);
        assert_eq!(plan.held_bytes, 0);

        // A run past the offer, over a file answered already, or longer than
        // what is left to plan, breaks the protocol like a plan entry would.
        let mut c = core();
        c.handle_frame(Frame::PlanRun { first: 2, count: 2 }, now);
        c.handle_frame(Frame::PlanRun { first: 1, count: 1 }, now);
        c.handle_frame(Frame::PlanEnd, now);
        assert!(matches!(&drain(&mut c)[..], [Action::Planned(_)]));
        let mut c = core();
        c.handle_frame(Frame::PlanRun { first: 1, count: 1 }, now);
        c.handle_frame(Frame::PlanRun { first: 2, count: 3 }, now);
        assert_eq!(violation(&mut c).kind, ViolationKind::Inconsistent);
        let mut c = core();
        c.handle_frame(Frame::PlanRun { first: 2, count: 2 }, now);
        c.handle_frame(Frame::PlanRun { first: 3, count: 1 }, now);
        assert_eq!(violation(&mut c).kind, ViolationKind::Repeated);
        let mut c = core();
        c.handle_frame(Frame::PlanRun { first: 0, count: 1 }, now);
        assert_eq!(violation(&mut c).kind, ViolationKind::Unknown);
        let mut c = core();
        c.handle_frame(
            Frame::PlanRun {
                first: 1,
                count: u32::MAX,
            },
            now,
        );
        assert_eq!(violation(&mut c).kind, ViolationKind::Inconsistent);
        // The last id there is: a run ending there is refused, not an
        // overflow past it (which panicked with overflow checks on).
        let mut c = core();
        c.handle_frame(
            Frame::PlanRun {
                first: u32::MAX,
                count: 1,
            },
            now,
        );
        assert_eq!(violation(&mut c).kind, ViolationKind::Unknown);
    }

    // A receiver could answer one file twice and another not at all: the
    // count matched, and the shell looked each entry up in a list (a
    // quadratic plan for a million files).
    #[test]
    fn the_plan_answers_each_offered_file_once() {
        let now = Instant::now();
        let mut c = core();
        for f in [accept(1, &[0]), accept(1, &[0]), refuse(3)] {
            c.handle_frame(f, now);
        }
        let v = violation(&mut c);
        assert_eq!(v.kind, ViolationKind::Repeated);
        assert!(v.detail.contains("already answered"));

        let mut c = core();
        c.handle_frame(accept(9, &[]), now);
        let v = violation(&mut c);
        assert_eq!(v.kind, ViolationKind::Unknown);
        assert!(v.detail.contains("not offered"));

        let mut c = core();
        for f in [accept(1, &[0]), refuse(3), Frame::PlanEnd] {
            c.handle_frame(f, now);
        }
        assert_eq!(
            violation(&mut c),
            Violation::new(
                ViolationKind::Inconsistent,
                "the plan answered 2 of 3 files"
            )
        );

        let mut c = core();
        c.handle_frame(accept(1, &[0, 0]), now);
        let v = violation(&mut c);
        assert_eq!(v.kind, ViolationKind::Inconsistent);
        assert!(v.detail.contains("wrong length"));

        let mut c = core();
        c.handle_frame(
            Frame::FileDone {
                file_id: 1,
                digest: 0,
                identity: 0,
            },
            now,
        );
        let v = violation(&mut c);
        assert_eq!(v.kind, ViolationKind::Unexpected);
        assert!(v.detail.starts_with("expected the plan"));
    }

    #[test]
    fn results_are_believed_once_and_only_for_reported_files() {
        let now = Instant::now();
        use ViolationKind::{Early, Repeated, Unexpected, Unknown};
        for (frames, kind, want) in [
            (vec![result(3, false, 0)], Unknown, "did not accept"),
            (vec![result(7, true, 0)], Unknown, "did not accept"),
            (vec![result(2, true, 0)], Early, "before it was reported"),
            (vec![result(2, false, 0)], Early, "before it was reported"),
            (
                vec![result(1, true, 77), result(1, true, 77)],
                Repeated,
                "second result",
            ),
            (vec![accept(1, &[0])], Unexpected, "unexpected a plan entry"),
        ] {
            let mut c = planned(now);
            c.handle_file_done(1, 77, now);
            for f in frames {
                c.handle_frame(f, now);
            }
            let v = violation(&mut c);
            assert_eq!(v.kind, kind, "{v}");
            assert!(v.detail.contains(want), "{v}");
            assert!(c.poll_timeout().is_none());
        }
    }

    #[test]
    fn a_receiver_error_ends_the_session_with_its_retryability() {
        let now = Instant::now();
        let mut c = core();
        c.handle_frame(
            Frame::Error {
                retryable: true,
                message: "busy".into(),
            },
            now,
        );
        assert_eq!(
            drain(&mut c),
            [Action::Close(End::Remote {
                retryable: true,
                message: "busy".into()
            })]
        );
    }

    #[test]
    fn keepalives_go_out_and_a_silent_receiver_is_given_up() {
        let t0 = Instant::now();
        let mut c = planned(t0);
        assert_eq!(c.poll_timeout(), Some(t0 + KEEPALIVE));
        c.handle_timeout(t0 + KEEPALIVE);
        assert_eq!(drain(&mut c), [Action::Send(Frame::Keepalive)]);
        let t1 = t0 + Duration::from_secs(8);
        c.handle_file_done(1, 1, t1);
        drain(&mut c);
        assert_eq!(
            c.poll_timeout(),
            Some(t1 + KEEPALIVE),
            "a report is a sign of life"
        );
        c.handle_frame(Frame::Keepalive, t1);
        c.handle_timeout(t1 + IDLE - Duration::from_millis(1));
        drain(&mut c);
        assert!(c.end().is_none());
        c.handle_timeout(t1 + IDLE);
        assert!(matches!(
            drain(&mut c).pop(),
            Some(Action::Close(End::Silent(_)))
        ));
        c.handle_lost("late".into());
        assert!(
            matches!(c.end(), Some(End::Silent(_))),
            "the first end stands"
        );
    }

    // Found in review: the deadline ran from the plan, while the shell
    // was still connecting the data streams and read nothing.
    #[test]
    fn time_before_the_shell_listens_is_not_silence() {
        let t0 = Instant::now();
        let mut c = planned(t0);
        let t1 = t0 + IDLE + Duration::from_secs(10);
        c.handle_started(t1);
        c.handle_timeout(t1);
        assert_eq!(drain(&mut c), []);
        assert_eq!(c.poll_timeout(), Some(t1 + KEEPALIVE));
    }

    // Found in review: a receiver that kept sending keepalives after
    // Finish, and never closed, held the send forever.
    #[test]
    fn after_finish_the_receiver_has_a_fixed_time_to_close() {
        let t0 = Instant::now();
        let mut c = planned(t0);
        c.handle_finished(t0, Duration::from_secs(30));
        for s in 1..30 {
            let t = t0 + Duration::from_secs(s);
            c.handle_frame(Frame::Keepalive, t);
            c.handle_timeout(t);
        }
        assert_eq!(drain(&mut c), [], "no keepalives owed after Finish");
        c.handle_timeout(t0 + Duration::from_secs(30));
        assert!(matches!(drain(&mut c)[..], [Action::Close(End::Silent(_))]));
    }

    #[test]
    fn a_connection_lost_before_every_result_is_lost() {
        let now = Instant::now();
        let mut c = planned(now);
        c.handle_lost("reset".into());
        assert_eq!(drain(&mut c), [Action::Close(End::Lost("reset".into()))]);
    }

    fn small_id() -> impl Strategy<Value = u32> {
        0u32..6
    }

    #[derive(Debug, Clone)]
    enum Step {
        Frame(Frame),
        Done(u32, u128),
        Failed(u32),
        Wait(u64),
        Lost,
    }

    fn arb_step() -> impl Strategy<Value = Step> {
        prop_oneof![
            1 => crate::wire::arb_frame().prop_map(Step::Frame),
            3 => (small_id(), proptest::collection::vec(any::<u8>(), 0..3))
                .prop_map(|(id, have)| Step::Frame(accept(id, &have))),
            1 => small_id().prop_map(|id| Step::Frame(refuse(id))),
            2 => Just(Step::Frame(Frame::PlanEnd)),
            1 => Just(Step::Frame(Frame::Keepalive)),
            5 => (small_id(), any::<bool>(), 0u128..3)
                .prop_map(|(id, ok, d)| Step::Frame(result(id, ok, d))),
            4 => (small_id(), 0u128..3).prop_map(|(id, d)| Step::Done(id, d)),
            1 => small_id().prop_map(Step::Failed),
            2 => (0u64..40_000).prop_map(Step::Wait),
            1 => Just(Step::Lost),
        ]
    }

    /// After the plan: mostly what the scheduler and a receiver do,
    /// sometimes anything at all.
    fn arb_tail_step() -> impl Strategy<Value = Step> {
        prop_oneof![
            1 => arb_step(),
            6 => (small_id(), any::<bool>(), 0u128..3)
                .prop_map(|(id, ok, d)| Step::Frame(result(id, ok, d))),
            6 => (small_id(), 0u128..3).prop_map(|(id, d)| Step::Done(id, d)),
            1 => small_id().prop_map(Step::Failed),
            1 => Just(Step::Frame(Frame::Keepalive)),
            1 => (0u64..40_000).prop_map(Step::Wait),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        /// The sender core fed anything a receiver could send, in any
        /// order, among the scheduler's reports: no panic; a plan only
        /// of offered files, each once; reports only of accepted files,
        /// each once; a verdict only after a report or abort, each file
        /// once, and an ok one only with our digest; nothing after the
        /// close; a deadline while sending.
        #[test]
        fn hostile_receivers_keep_the_core_sound(
            offered in proptest::collection::btree_map(small_id(), 0u64..3 * BLOCK, 0..5),
            lawful in proptest::bool::weighted(0.85),
            choices in proptest::collection::vec(any::<bool>(), 5),
            hostile in proptest::collection::vec(arb_step(), 0..20),
            tail in proptest::collection::vec(arb_tail_step(), 0..60),
        ) {
            // Most receivers plan as the protocol says and then go astray;
            // the rest are hostile from the first frame.
            let mut steps: Vec<Step> = Vec::new();
            if lawful {
                for ((&id, &size), &ok) in offered.iter().zip(&choices) {
                    let blocks = Layout::new(size, BLOCK).blocks();
                    steps.push(Step::Frame(if ok {
                        accept(id, &Bitmap::new(blocks).to_bytes())
                    } else {
                        refuse(id)
                    }));
                }
                steps.push(Step::Frame(Frame::PlanEnd));
            } else {
                steps = hostile;
            }
            steps.extend(tail);
            let mut now = Instant::now();
            let mut c = SenderControl::new(
                offered.iter().map(|(&id, &size)| (id, size)),
                BLOCK,
                Verification::Checksums,
                KEEPALIVE,
                IDLE,
            );
            let mut accepted = BTreeSet::new();
            let mut reported = std::collections::BTreeMap::new();
            let mut verdicts = BTreeSet::new();
            let mut closed = false;
            let mut sending = false;
            let mut quiet = false;
            for step in steps {
                match step {
                    Step::Frame(f) => c.handle_frame(f, now),
                    Step::Done(id, d) => c.handle_file_done(id, d, now),
                    Step::Failed(id) => c.handle_file_failed(id, "changed".into(), now),
                    Step::Wait(ms) => {
                        now += Duration::from_millis(ms);
                        c.handle_timeout(now);
                    }
                    Step::Lost => {
                        // After every result, the receiver's close.
                        quiet |= sending && c.all_answered() && !closed;
                        c.handle_lost("cut".into());
                    }
                }
                while let Some(a) = c.poll_action() {
                    prop_assert!(!closed, "{a:?} after the close");
                    match a {
                        Action::Planned(plan) => {
                            prop_assert!(!sending);
                            sending = true;
                            let ids: BTreeSet<u32> = plan
                                .accepted
                                .iter()
                                .map(|p| p.file_id)
                                .chain(plan.refused.iter().map(|r| r.0))
                                .chain(plan.present.iter().copied())
                                .collect();
                            prop_assert_eq!(
                                ids.len(),
                                plan.accepted.len() + plan.refused.len() + plan.present.len()
                            );
                            prop_assert_eq!(&ids, &offered.keys().copied().collect());
                            accepted = plan.accepted.iter().map(|p| p.file_id).collect();
                        }
                        Action::Send(Frame::FileDone { file_id, digest, .. }) => {
                            prop_assert!(accepted.contains(&file_id));
                            prop_assert!(reported.insert(file_id, Some(digest)).is_none());
                        }
                        Action::Send(Frame::FileAbort { file_id, .. }) => {
                            prop_assert!(accepted.contains(&file_id));
                            prop_assert!(reported.insert(file_id, None).is_none());
                        }
                        Action::Send(Frame::Keepalive) => {}
                        // Only right before a close for a violation.
                        Action::Send(Frame::Error { retryable: true, .. }) => {
                            prop_assert!(matches!(c.end(), Some(End::Violation(_))));
                        }
                        Action::Send(other) => prop_assert!(false, "sent {:?}", other),
                        Action::Verdict { file_id, verdict } => {
                            let ours = reported.get(&file_id);
                            prop_assert!(ours.is_some(), "verdict for unreported file {}", file_id);
                            prop_assert!(verdicts.insert(file_id), "two verdicts for file {}", file_id);
                            if let FileVerdict::Ok(d) = verdict {
                                prop_assert_eq!(ours, Some(&Some(d)));
                            }
                        }
                        Action::Close(_) => closed = true,
                    }
                }
                prop_assert_eq!(closed, c.end().is_some());
                if sending && !closed && !quiet {
                    prop_assert!(c.poll_timeout().is_some_and(|t| t > now));
                }
                if quiet {
                    prop_assert!(c.poll_timeout().is_none(), "timers after the receiver closed");
                }
            }
            prop_assert!(c.answered() <= c.accepted());
        }
    }
}
