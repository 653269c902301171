//! The sender's block scheduler.
//!
//! Blocks are read in file order, queued once read, and pulled by whichever
//! stream has room: a slow stream pulls less. A block stays owned by the
//! stream that sent it until the receiver acknowledges it; a failed stream's
//! blocks, and blocks the receiver reports damaged, go back to the front of
//! the queue for the others. Blocks the receiver already holds (resume) are
//! read only to compute the file digest, never sent.
//!
//! A file is reported done once every block has gone out once (its
//! checksum is then known), not once every block is acknowledged: the
//! receiver holds the report until its last block is written, which saves
//! the round trip from the last acknowledgement to the report.

use std::collections::{HashMap, VecDeque};

use super::{Bitmap, Layout, digest::file_digest};
use crate::violation::{Violation, ViolationKind};

/// A block damaged this many times in a row is not a transient fault.
pub const MAX_RESENDS_PER_BLOCK: u32 = 8;

/// A block that kept arriving damaged: the transfer cannot go on.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "block {block} of file {file_id} arrived damaged {times} times in a row; check the path for faulty hardware (NIC, cable, memory)"
)]
pub struct Damaged {
    /// The file.
    pub file_id: u32,
    /// The block.
    pub block: u64,
    /// How many times in a row.
    pub times: u32,
}

/// One file as the scheduler sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlannedFile {
    /// Session file id.
    pub file_id: u32,
    /// Size in bytes.
    pub size: u64,
    /// Blocks the receiver already has.
    pub have: Option<Bitmap>,
}

/// A read the shell should issue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReadOrder {
    /// Scheduler-wide block index, handed back in `handle_read`.
    pub gid: usize,
    /// Session file id.
    pub file_id: u32,
    /// Block index within the file.
    pub block: u64,
    /// Byte offset.
    pub offset: u64,
    /// Bytes to read.
    pub len: u64,
    /// The receiver has it: read for the digest only, do not send.
    pub digest_only: bool,
    /// This is the file's last block to read: its descriptor may be closed after.
    pub last_read_of_file: bool,
}

/// A block a stream should send now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SendOrder {
    /// Scheduler-wide block index (the shell's buffer key).
    pub gid: usize,
    /// Session file id.
    pub file_id: u32,
    /// Block index within the file.
    pub block: u64,
    /// Byte offset.
    pub offset: u64,
    /// Payload length.
    pub len: u64,
    /// The receiver found it damaged before (`handle_nack`): it goes
    /// plain, in case packing is what damaged it.
    pub damaged_before: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Unread,
    Reading,
    Ready,
    InFlight(u16),
    Acked,
    /// The receiver has it; the digest still needs its checksum.
    HaveUnread,
    HaveReading,
    HaveDone,
    /// Its file was given up: not read, not sent, not waited for.
    Dropped,
}

#[derive(Debug)]
struct FileState {
    file_id: u32,
    layout: Layout,
    first: usize,
    /// Blocks whose checksum is not known yet (not sent once, or held by
    /// the receiver and not read yet).
    outstanding: u64,
    reads_left: u64,
    checksums: Vec<u64>,
    reported: bool,
    /// Given up by the shell (the source changed): never reported done.
    failed: bool,
}

#[derive(Debug, Clone, Copy, Default)]
struct StreamState {
    alive: bool,
    in_flight: usize,
    in_flight_bytes: u64,
}

#[derive(Debug, Clone, Copy)]
struct Slot {
    file: usize,
    block: u64,
    state: State,
    resends: u32,
    /// Gone out once, so its checksum is known.
    sent: bool,
}

/// The sender's scheduler; see the module docs.
#[derive(Debug)]
pub struct Scheduler {
    files: Vec<FileState>,
    by_id: HashMap<u32, usize>,
    slots: Vec<Slot>,
    read_cursor: usize,
    reads_left: usize,
    ready: VecDeque<usize>,
    streams: Vec<StreamState>,
    per_stream_bytes: u64,
    need_digest: bool,
    completed: VecDeque<usize>,
    reported: usize,
    /// Files given up, with why, for the shell to tell the receiver.
    failed: VecDeque<(u32, String)>,
    /// Blocks to send that the receiver has not acknowledged yet.
    unacked: usize,
    resends: u64,
    fatal: Option<Damaged>,
}

impl Scheduler {
    /// Plans `files` in `block_size` blocks over `streams` streams, each
    /// holding at most `per_stream_bytes` of unacknowledged blocks (and at
    /// least one block). Counting bytes, not blocks, lets many small files
    /// be in flight at once. When `need_digest` is false, blocks the
    /// receiver has are not read at all.
    pub fn new(
        files: Vec<PlannedFile>,
        block_size: u64,
        streams: u16,
        per_stream_bytes: u64,
        need_digest: bool,
    ) -> Self {
        Self::build(
            files,
            block_size,
            (streams, per_stream_bytes),
            need_digest,
            |_, _| need_digest,
        )
    }

    /// Plans the pieces of a session that is part of a transfer over
    /// several pairs, blocks `first..end` of each file by id (`pieces`):
    /// the blocks outside its piece that the receiver "has" are other
    /// pairs' work, never read here, and count in the digest with a
    /// checksum of 0, as the receiver counts them. Those inside it that
    /// the receiver has (a per-chunk checkpoint) are read and checksummed
    /// but not sent, as in any resume.
    pub fn for_pieces(
        files: Vec<PlannedFile>,
        pieces: &HashMap<u32, (u64, u64)>,
        block_size: u64,
        streams: u16,
        per_stream_bytes: u64,
    ) -> Self {
        let within = |file_id: u32, b: u64| {
            pieces
                .get(&file_id)
                .is_some_and(|&(first, end)| (first..end).contains(&b))
        };
        Self::build(files, block_size, (streams, per_stream_bytes), true, within)
    }

    fn build(
        files: Vec<PlannedFile>,
        block_size: u64,
        (streams, per_stream_bytes): (u16, u64),
        need_digest: bool,
        read_held: impl Fn(u32, u64) -> bool,
    ) -> Self {
        let mut s = Self {
            files: Vec::with_capacity(files.len()),
            by_id: HashMap::with_capacity(files.len()),
            slots: Vec::new(),
            read_cursor: 0,
            reads_left: 0,
            ready: VecDeque::new(),
            streams: vec![
                StreamState {
                    alive: true,
                    in_flight: 0,
                    in_flight_bytes: 0,
                };
                streams as usize
            ],
            per_stream_bytes,
            need_digest,
            completed: VecDeque::new(),
            reported: 0,
            failed: VecDeque::new(),
            unacked: 0,
            resends: 0,
            fatal: None,
        };
        for f in files {
            let layout = Layout::new(f.size, block_size);
            let n = layout.blocks();
            let idx = s.files.len();
            let mut outstanding = 0;
            let mut reads_left = 0;
            for b in 0..n {
                let have = f.have.as_ref().is_some_and(|h| h.get(b));
                let state = match (have, have && read_held(f.file_id, b)) {
                    (false, _) => State::Unread,
                    (true, true) => State::HaveUnread,
                    (true, false) => State::HaveDone,
                };
                if state != State::HaveDone {
                    outstanding += 1;
                    reads_left += 1;
                }
                if state == State::Unread {
                    s.unacked += 1;
                }
                s.slots.push(Slot {
                    file: idx,
                    block: b,
                    state,
                    resends: 0,
                    sent: false,
                });
            }
            s.by_id.insert(f.file_id, idx);
            s.files.push(FileState {
                file_id: f.file_id,
                layout,
                first: s.slots.len() - n as usize,
                outstanding,
                reads_left,
                checksums: vec![0; n as usize],
                reported: false,
                failed: false,
            });
            s.reads_left += reads_left as usize;
            if outstanding == 0 {
                s.completed.push_back(idx);
            }
        }
        s
    }

    /// The next block to read, if any remain.
    #[must_use]
    pub fn poll_read(&mut self) -> Option<ReadOrder> {
        while self.read_cursor < self.slots.len() {
            let gid = self.read_cursor;
            self.read_cursor += 1;
            let slot = &mut self.slots[gid];
            let digest_only = match slot.state {
                State::Unread => false,
                State::HaveUnread => true,
                _ => continue,
            };
            slot.state = if digest_only {
                State::HaveReading
            } else {
                State::Reading
            };
            self.reads_left -= 1;
            let f = &mut self.files[slot.file];
            f.reads_left -= 1;
            return Some(ReadOrder {
                gid,
                file_id: f.file_id,
                block: slot.block,
                offset: f.layout.offset(slot.block),
                len: f.layout.len(slot.block),
                digest_only,
                last_read_of_file: f.reads_left == 0,
            });
        }
        None
    }

    /// The length of the block `poll_read` will return next, so the shell
    /// can pick a buffer of the right size first.
    pub fn next_read_len(&mut self) -> Option<u64> {
        while let Some(slot) = self.slots.get(self.read_cursor) {
            if matches!(slot.state, State::Unread | State::HaveUnread) {
                return Some(self.files[slot.file].layout.len(slot.block));
            }
            self.read_cursor += 1;
        }
        None
    }

    /// Whether `gid` is read and waiting to be sent (so its buffer is kept).
    pub fn is_ready(&self, gid: usize) -> bool {
        self.slots.get(gid).is_some_and(|s| s.state == State::Ready)
    }

    /// A read finished; `checksum` is its payload's checksum for a
    /// digest-only block (a block to send gets it from
    /// `handle_sent_checksum`).
    pub fn handle_read(&mut self, gid: usize, checksum: u64) {
        let Some(slot) = self.slots.get_mut(gid) else {
            return;
        };
        let file = slot.file;
        let block = slot.block as usize;
        match slot.state {
            State::Reading => {
                slot.state = State::Ready;
                self.ready.push_back(gid);
            }
            State::HaveReading => {
                slot.state = State::HaveDone;
                self.finish_block(file);
            }
            _ => return,
        }
        self.files[file].checksums[block] = checksum;
    }

    /// The next block for `stream` to send, if it has room and one is ready.
    #[must_use]
    pub fn poll_send(&mut self, stream: u16) -> Option<SendOrder> {
        let next = *self.ready.front()?;
        let len = self.block_len(next);
        let st = self.streams.get_mut(stream as usize)?;
        if !st.alive
            || self.fatal.is_some()
            || (st.in_flight > 0 && st.in_flight_bytes + len > self.per_stream_bytes)
        {
            return None;
        }
        let gid = self.ready.pop_front()?;
        st.in_flight += 1;
        st.in_flight_bytes += len;
        let slot = &mut self.slots[gid];
        slot.state = State::InFlight(stream);
        let f = &self.files[slot.file];
        Some(SendOrder {
            gid,
            file_id: f.file_id,
            block: slot.block,
            offset: f.layout.offset(slot.block),
            len: f.layout.len(slot.block),
            damaged_before: slot.resends > 0,
        })
    }

    /// The checksum of a block, computed as it went out (the sender hashes
    /// a payload piece by piece just before sending it). Returns whether
    /// this completed a file, i.e. `poll_file_done` has something new.
    pub fn handle_sent_checksum(&mut self, gid: usize, checksum: u64) -> bool {
        let Some(slot) = self.slots.get(gid) else {
            return false;
        };
        self.files[slot.file].checksums[slot.block as usize] = checksum;
        self.mark_sent(gid)
    }

    /// Counts a block's first send towards its file; true if that
    /// completed the file.
    fn mark_sent(&mut self, gid: usize) -> bool {
        let slot = &mut self.slots[gid];
        if slot.sent {
            return false;
        }
        slot.sent = true;
        let file = slot.file;
        self.finish_block(file)
    }

    fn block_len(&self, gid: usize) -> u64 {
        let slot = &self.slots[gid];
        self.files[slot.file].layout.len(slot.block)
    }

    fn release(&mut self, stream: u16, gid: usize) {
        let len = self.block_len(gid);
        let st = &mut self.streams[stream as usize];
        st.in_flight -= 1;
        st.in_flight_bytes -= len;
    }

    fn lookup(&self, stream: u16, file_id: u32, block: u64) -> Result<usize, Violation> {
        let unknown = |what: String| Violation::new(ViolationKind::Unknown, what);
        let file = *self
            .by_id
            .get(&file_id)
            .ok_or_else(|| unknown(format!("acknowledgement for unknown file {file_id}")))?;
        let f = &self.files[file];
        if block >= f.layout.blocks() {
            return Err(unknown(format!(
                "acknowledgement for block {block} beyond the end of file {file_id}"
            )));
        }
        let gid = f.first + block as usize;
        if self.slots[gid].state != State::InFlight(stream) {
            return Err(unknown(format!(
                "acknowledgement for block {block} of file {file_id}, which stream {stream} did not send"
            )));
        }
        Ok(gid)
    }

    /// Whether a report arriving on `stream` is a late one from a stream
    /// already declared failed: its blocks went to other streams, and the
    /// reports still in its socket say nothing about those new copies.
    fn is_late(&self, stream: u16) -> bool {
        self.streams.get(stream as usize).is_some_and(|s| !s.alive)
    }

    /// The receiver wrote a block; returns its gid so the shell frees the
    /// buffer, or `None` for a late ack from a failed stream (ignored).
    pub fn handle_ack(
        &mut self,
        stream: u16,
        file_id: u32,
        block: u64,
    ) -> Result<Option<usize>, Violation> {
        if self.is_late(stream) {
            return Ok(None);
        }
        let gid = self.lookup(stream, file_id, block)?;
        self.release(stream, gid);
        let slot = &mut self.slots[gid];
        slot.state = State::Acked;
        slot.resends = 0;
        self.unacked -= 1;
        // An ack implies the send; the shell reports the checksum first,
        // so this only counts for callers that do not hash.
        self.mark_sent(gid);
        Ok(Some(gid))
    }

    /// The receiver found a block damaged: queue it first for resending.
    pub fn handle_nack(&mut self, stream: u16, file_id: u32, block: u64) -> Result<(), Violation> {
        if self.is_late(stream) {
            return Ok(());
        }
        let gid = self.lookup(stream, file_id, block)?;
        self.release(stream, gid);
        if self.drop_if_given_up(gid) {
            return Ok(());
        }
        self.resends += 1;
        let slot = &mut self.slots[gid];
        slot.resends += 1;
        slot.state = State::Ready;
        if slot.resends > MAX_RESENDS_PER_BLOCK {
            self.fatal = Some(Damaged {
                file_id,
                block,
                times: slot.resends,
            });
        }
        self.ready.push_front(gid);
        Ok(())
    }

    /// A stream broke: its unacknowledged blocks go back for the others.
    /// Returns how many blocks were requeued.
    pub fn handle_stream_failed(&mut self, stream: u16) -> usize {
        let Some(st) = self.streams.get_mut(stream as usize) else {
            return 0;
        };
        st.alive = false;
        st.in_flight = 0;
        st.in_flight_bytes = 0;
        let mut requeued = 0;
        for gid in (0..self.slots.len()).rev() {
            if self.slots[gid].state == State::InFlight(stream) {
                if self.drop_if_given_up(gid) {
                    continue;
                }
                self.slots[gid].state = State::Ready;
                self.ready.push_front(gid);
                requeued += 1;
            }
        }
        self.resends += requeued as u64;
        requeued
    }

    fn finish_block(&mut self, file: usize) -> bool {
        let f = &mut self.files[file];
        f.outstanding -= 1;
        if f.outstanding == 0 && !f.failed {
            self.completed.push_back(file);
            return true;
        }
        false
    }

    /// The shell gives a file up (its source changed, or cannot be
    /// opened): nothing more of it is read or sent, it is never reported
    /// done, and `poll_file_failed` hands back `reason` for the receiver.
    /// Blocks already on the wire are still acknowledged as usual. Returns
    /// the gids of read blocks the shell holds buffers for, to free them;
    /// nothing for a file unknown, already failed or already reported.
    pub fn handle_file_failed(&mut self, file_id: u32, reason: String) -> Vec<usize> {
        let Some(&idx) = self.by_id.get(&file_id) else {
            return Vec::new();
        };
        let f = &mut self.files[idx];
        if f.failed || f.reported {
            return Vec::new();
        }
        f.failed = true;
        self.reported += 1;
        self.completed.retain(|&c| c != idx);
        let (first, n) = (f.first, f.layout.blocks() as usize);
        let mut freed = Vec::new();
        for gid in first..first + n {
            let slot = &mut self.slots[gid];
            match slot.state {
                State::Unread | State::HaveUnread => {
                    if slot.state == State::Unread {
                        self.unacked -= 1;
                    }
                    self.reads_left -= 1;
                    self.files[idx].reads_left -= 1;
                }
                State::Reading => self.unacked -= 1,
                State::Ready => {
                    self.unacked -= 1;
                    freed.push(gid);
                }
                State::HaveReading => {}
                // On the wire: the receiver acknowledges it all the same.
                State::InFlight(_) | State::Acked | State::HaveDone | State::Dropped => continue,
            }
            slot.state = State::Dropped;
        }
        self.ready.retain(|g| !freed.contains(g));
        self.failed.push_back((file_id, reason));
        freed
    }

    /// A block that would go out again, of a file given up: nothing of
    /// such a file is sent again, so it is dropped instead.
    fn drop_if_given_up(&mut self, gid: usize) -> bool {
        if !self.files[self.slots[gid].file].failed {
            return false;
        }
        self.slots[gid].state = State::Dropped;
        self.unacked -= 1;
        true
    }

    /// A file given up by `handle_file_failed`, and why.
    #[must_use]
    pub fn poll_file_failed(&mut self) -> Option<(u32, String)> {
        self.failed.pop_front()
    }

    /// The block checksums of file `file_id` (0 for blocks not read).
    pub fn checksums(&self, file_id: u32) -> Option<&[u64]> {
        let idx = *self.by_id.get(&file_id)?;
        Some(&self.files[idx].checksums)
    }

    /// A file whose blocks have all gone out once (or are held by the
    /// receiver), with its digest (0 when digests are off).
    #[must_use]
    pub fn poll_file_done(&mut self) -> Option<(u32, u128)> {
        let idx = self.completed.pop_front()?;
        let f = &mut self.files[idx];
        f.reported = true;
        self.reported += 1;
        let digest = if self.need_digest {
            file_digest(&f.checksums)
        } else {
            0
        };
        Some((f.file_id, digest))
    }

    /// A reason the transfer cannot go on, if one arose.
    #[must_use]
    pub fn poll_fatal(&self) -> Option<&Damaged> {
        self.fatal.as_ref()
    }

    /// Every file reported done.
    pub fn is_finished(&self) -> bool {
        self.reported == self.files.len()
    }

    /// Every block to send is acknowledged (written by the receiver).
    pub fn all_acked(&self) -> bool {
        self.unacked == 0
    }

    /// A stream joins the session (the optimizer asked for more); its
    /// index is returned. Each stream then holds at most
    /// `per_stream_bytes`: the sender's buffer shared by more streams. A
    /// stream above its new share sends nothing more until acknowledgements
    /// bring it below.
    pub fn add_stream(&mut self, per_stream_bytes: u64) -> u16 {
        self.streams.push(StreamState {
            alive: true,
            in_flight: 0,
            in_flight_bytes: 0,
        });
        self.per_stream_bytes = per_stream_bytes;
        (self.streams.len() - 1) as u16
    }

    /// Streams, alive or not.
    pub fn streams(&self) -> usize {
        self.streams.len()
    }

    /// Streams still alive.
    pub fn alive_streams(&self) -> usize {
        self.streams.iter().filter(|s| s.alive).count()
    }

    /// Whether `stream` is still alive.
    pub fn stream_alive(&self, stream: u16) -> bool {
        self.streams.get(stream as usize).is_some_and(|s| s.alive)
    }

    /// Blocks sent again (damaged or on a failed stream).
    pub fn resends(&self) -> u64 {
        self.resends
    }

    /// Nothing left to hand to streams, now or later.
    pub fn nothing_left_to_send(&self) -> bool {
        self.ready.is_empty()
            && self.reads_left == 0
            && !self.slots.iter().any(|s| s.state == State::Reading)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one(size: u64, have: Option<Bitmap>) -> Vec<PlannedFile> {
        vec![PlannedFile {
            file_id: 7,
            size,
            have,
        }]
    }

    /// Reads everything the scheduler asks for, checksum = block index + 1.
    fn read_all(s: &mut Scheduler) -> Vec<ReadOrder> {
        let mut v = Vec::new();
        while let Some(r) = s.poll_read() {
            s.handle_read(r.gid, r.block + 1);
            v.push(r);
        }
        v
    }

    #[test]
    fn a_file_given_up_is_never_reported_and_its_unsent_blocks_are_dropped() {
        let files = vec![
            PlannedFile {
                file_id: 1,
                size: 16,
                have: None,
            },
            PlannedFile {
                file_id: 2,
                size: 8,
                have: None,
            },
        ];
        let mut s = Scheduler::new(files, 4, 1, 64, true);
        // Blocks 0-2 of file 1 read; block 0 goes out, 1 and 2 wait.
        let r: Vec<_> = (0..3).map(|_| s.poll_read().unwrap()).collect();
        for o in &r {
            s.handle_read(o.gid, 5);
        }
        let out = s.poll_send(0).unwrap();
        assert!(!s.handle_sent_checksum(out.gid, 5));
        let freed = s.handle_file_failed(1, "changed".into());
        assert_eq!(freed, vec![r[1].gid, r[2].gid], "its waiting buffers");
        assert!(
            s.handle_file_failed(1, "again".into()).is_empty(),
            "given up once"
        );
        assert_eq!(s.poll_file_failed(), Some((1, "changed".into())));
        assert_eq!(s.poll_file_failed(), None);
        // Its last block is never read; the next file's are.
        let next = s.poll_read().unwrap();
        assert_eq!(next.file_id, 2);
        s.handle_read(next.gid, 9);
        let n2 = s.poll_read().unwrap();
        s.handle_read(n2.gid, 9);
        assert!(s.poll_read().is_none());
        // The block already on the wire is still acknowledged.
        s.handle_ack(0, 1, out.block).unwrap();
        for _ in 0..2 {
            let o = s.poll_send(0).unwrap();
            assert_eq!(o.file_id, 2, "nothing of file 1 goes out again");
            s.handle_sent_checksum(o.gid, 9);
            s.handle_ack(0, 2, o.block).unwrap();
        }
        assert_eq!(s.poll_file_done().map(|d| d.0), Some(2));
        assert_eq!(s.poll_file_done(), None, "file 1 is never reported");
        assert!(s.all_acked() && s.is_finished());
    }

    #[test]
    fn a_file_given_up_is_not_resent_when_its_stream_breaks_or_a_block_is_damaged() {
        let mut s = Scheduler::new(one(12, None), 4, 2, 64, true);
        read_all(&mut s);
        let a = s.poll_send(0).unwrap();
        let b = s.poll_send(1).unwrap();
        s.handle_file_failed(7, "changed".into());
        s.handle_nack(0, 7, a.block).unwrap();
        assert_eq!(s.handle_stream_failed(1), 0, "nothing to requeue");
        assert!(s.poll_send(0).is_none());
        assert!(s.all_acked(), "nothing is waited for");
        assert_eq!(b.file_id, 7);
        assert_eq!(s.poll_file_done(), None);
    }

    #[test]
    fn a_file_given_up_before_its_reads_finish_ignores_them() {
        let mut s = Scheduler::new(one(8, None), 4, 1, 64, true);
        let a = s.poll_read().unwrap();
        assert!(s.handle_file_failed(7, "gone".into()).is_empty());
        s.handle_read(a.gid, 1);
        assert!(!s.is_ready(a.gid), "its buffer is not kept");
        assert!(s.poll_read().is_none());
        assert!(s.poll_send(0).is_none());
        assert!(s.all_acked() && s.is_finished());
    }

    #[test]
    fn sends_every_block_once_and_reports_the_file() {
        let mut s = Scheduler::new(one(10, None), 4, 2, 32, true);
        let reads = read_all(&mut s);
        assert_eq!(reads.len(), 3);
        assert_eq!(reads[2].len, 2);
        assert!(reads[2].last_read_of_file && !reads[0].last_read_of_file);
        let a = s.poll_send(0).unwrap();
        let b = s.poll_send(1).unwrap();
        let c = s.poll_send(0).unwrap();
        assert_eq!((a.block, b.block, c.block), (0, 1, 2));
        // Hashed on the way out: this is the checksum the digest uses.
        s.handle_sent_checksum(c.gid, 30);
        assert!(s.poll_send(1).is_none());
        assert!(s.poll_file_done().is_none());
        s.handle_ack(0, 7, 0).unwrap();
        s.handle_ack(1, 7, 1).unwrap();
        s.handle_ack(0, 7, 2).unwrap();
        let (id, d) = s.poll_file_done().unwrap();
        assert_eq!(id, 7);
        assert_eq!(d, file_digest(&[1, 2, 30]));
        assert!(s.is_finished());
    }

    #[test]
    fn file_is_reported_once_every_block_has_gone_out() {
        let mut s = Scheduler::new(one(10, None), 4, 2, 32, true);
        read_all(&mut s);
        let a = s.poll_send(0).unwrap();
        let b = s.poll_send(1).unwrap();
        let c = s.poll_send(0).unwrap();
        assert!(!s.handle_sent_checksum(a.gid, 10));
        assert!(!s.handle_sent_checksum(c.gid, 30));
        assert!(s.poll_file_done().is_none(), "block 1 has not gone out");
        assert!(
            s.handle_sent_checksum(b.gid, 20),
            "the last send completes it"
        );
        assert_eq!(s.poll_file_done(), Some((7, file_digest(&[10, 20, 30]))));
        assert!(s.is_finished());
        assert!(!s.all_acked(), "reported is not written");
        for o in [a, b, c] {
            let st = if o.gid == b.gid { 1 } else { 0 };
            s.handle_ack(st, 7, o.block).unwrap();
        }
        assert!(s.all_acked());
        assert!(s.poll_file_done().is_none(), "reported once");
    }

    #[test]
    fn resent_blocks_count_once() {
        let mut s = Scheduler::new(one(8, None), 4, 2, 32, true);
        read_all(&mut s);
        let a = s.poll_send(0).unwrap();
        assert!(!s.handle_sent_checksum(a.gid, 10));
        assert!(!a.damaged_before);
        s.handle_nack(0, 7, a.block).unwrap();
        let again = s.poll_send(0).unwrap();
        assert_eq!(again.block, a.block);
        // So the shell sends it plain (`sender::streams`).
        assert!(again.damaged_before);
        assert!(
            !s.handle_sent_checksum(again.gid, 10),
            "block 1 is still unsent"
        );
        assert!(s.poll_file_done().is_none());
        // A stream breaks after the file was reported: its block goes out
        // again, and the session is not over until that copy is written.
        let b = s.poll_send(1).unwrap();
        assert!(s.handle_sent_checksum(b.gid, 20));
        assert!(s.poll_file_done().is_some());
        assert_eq!(s.handle_stream_failed(1), 1);
        s.handle_ack(0, 7, a.block).unwrap();
        let b2 = s.poll_send(0).unwrap();
        assert_eq!(b2.block, b.block);
        assert!(!s.handle_sent_checksum(b2.gid, 20));
        assert!(!s.all_acked());
        s.handle_ack(0, 7, b2.block).unwrap();
        assert!(s.all_acked());
        assert!(s.poll_file_done().is_none(), "reported once");
    }

    #[test]
    fn per_stream_limit_lets_the_other_stream_take_more() {
        let mut s = Scheduler::new(one(40, None), 4, 2, 8, false);
        read_all(&mut s);
        assert!(s.poll_send(0).is_some() && s.poll_send(0).is_some());
        assert!(s.poll_send(0).is_none(), "slow stream 0 is at its limit");
        assert!(s.poll_send(1).is_some() && s.poll_send(1).is_some());
        s.handle_ack(1, 7, 2).unwrap();
        assert_eq!(s.poll_send(1).unwrap().block, 4);
    }

    #[test]
    fn a_stream_added_mid_transfer_shares_the_buffer_and_takes_blocks() {
        let mut s = Scheduler::new(one(40, None), 4, 1, 16, false);
        read_all(&mut s);
        for _ in 0..4 {
            s.poll_send(0).unwrap();
        }
        assert!(s.poll_send(0).is_none(), "stream 0 holds its 16 bytes");
        assert!(s.poll_send(1).is_none(), "no stream 1 yet");
        assert_eq!(s.add_stream(8), 1);
        assert_eq!((s.streams(), s.alive_streams()), (2, 2));
        // The new stream takes the blocks the old one cannot; the old
        // one, above its new share, waits for two acknowledgements.
        let a = s.poll_send(1).unwrap();
        assert_eq!(a.block, 4);
        s.poll_send(1).unwrap();
        assert!(s.poll_send(1).is_none(), "8 bytes each now");
        s.handle_ack(0, 7, 0).unwrap();
        assert!(s.poll_send(0).is_none(), "12 bytes in flight, above 8");
        s.handle_ack(0, 7, 1).unwrap();
        s.handle_ack(0, 7, 2).unwrap();
        assert!(s.poll_send(0).is_some());
        // Its acknowledgements and failures are its own.
        s.handle_ack(1, 7, a.block).unwrap();
        assert!(s.handle_ack(1, 7, 0).is_err(), "block 0 was stream 0's");
        assert_eq!(s.handle_stream_failed(1), 1);
        assert_eq!(s.alive_streams(), 1);
    }

    #[test]
    fn failed_stream_blocks_go_to_the_survivor() {
        let mut s = Scheduler::new(one(12, None), 4, 2, 32, false);
        read_all(&mut s);
        let a = s.poll_send(0).unwrap();
        let b = s.poll_send(1).unwrap();
        let c = s.poll_send(0).unwrap();
        s.handle_ack(1, 7, b.block).unwrap();
        assert_eq!(s.handle_stream_failed(0), 2);
        assert_eq!(s.alive_streams(), 1);
        assert!(s.poll_send(0).is_none(), "a dead stream gets nothing");
        let r1 = s.poll_send(1).unwrap();
        let r2 = s.poll_send(1).unwrap();
        let mut got = [r1.block, r2.block];
        got.sort();
        assert_eq!(got, [a.block, c.block]);
        // The dead stream's ack was already in its socket: ignored, not a
        // violation and not a double count.
        assert_eq!(s.handle_ack(0, 7, a.block), Ok(None));
        assert_eq!(s.handle_nack(0, 7, c.block), Ok(()));
        s.handle_ack(1, 7, r1.block).unwrap();
        s.handle_ack(1, 7, r2.block).unwrap();
        assert!(s.poll_file_done().is_some());
        assert_eq!(s.resends(), 2);
    }

    #[test]
    fn small_blocks_fill_the_byte_budget_not_a_block_count() {
        // 100 files of 3 bytes against a budget of two 4-byte blocks.
        let files: Vec<_> = (0..100)
            .map(|i| PlannedFile {
                file_id: i,
                size: 3,
                have: None,
            })
            .collect();
        let mut s = Scheduler::new(files, 4, 1, 8, false);
        assert_eq!(s.next_read_len(), Some(3));
        read_all(&mut s);
        let mut n = 0;
        while s.poll_send(0).is_some() {
            n += 1;
        }
        assert_eq!(n, 2, "3 + 3 fit in 8 bytes, a third does not");
        // A block larger than the budget still goes when the stream is idle.
        let mut big = Scheduler::new(one(40, None), 40, 1, 8, false);
        read_all(&mut big);
        assert!(big.poll_send(0).is_some());
    }

    #[test]
    fn damaged_block_is_resent_first_and_counted() {
        let mut s = Scheduler::new(one(12, None), 4, 1, 32, true);
        read_all(&mut s);
        let a = s.poll_send(0).unwrap();
        s.handle_nack(0, 7, a.block).unwrap();
        assert_eq!(s.resends(), 1);
        assert_eq!(s.poll_send(0).unwrap().block, a.block);
    }

    #[test]
    fn persistent_damage_is_fatal() {
        let mut s = Scheduler::new(one(4, None), 4, 1, 32, true);
        read_all(&mut s);
        for _ in 0..=MAX_RESENDS_PER_BLOCK {
            let a = s.poll_send(0).unwrap();
            s.handle_nack(0, 7, a.block).unwrap();
        }
        assert!(s.poll_fatal().is_some());
        assert!(s.poll_send(0).is_none());
    }

    #[test]
    fn resume_reads_held_blocks_for_the_digest_but_never_sends_them() {
        let mut have = Bitmap::new(3);
        have.set(0);
        have.set(2);
        let mut s = Scheduler::new(one(10, Some(have)), 4, 1, 32, true);
        let reads = read_all(&mut s);
        assert_eq!(reads.iter().filter(|r| r.digest_only).count(), 2);
        let a = s.poll_send(0).unwrap();
        assert_eq!(a.block, 1);
        assert!(s.poll_send(0).is_none());
        s.handle_ack(0, 7, 1).unwrap();
        assert_eq!(s.poll_file_done().unwrap().1, file_digest(&[1, 2, 3]));
    }

    // A piece's blocks that a per-chunk checkpoint holds are read for the
    // digest and not sent; the other pairs' blocks are not even read.
    #[test]
    fn a_piece_reads_its_held_blocks_but_not_the_other_pairs() {
        // Blocks 0..5 of 4 bytes; the piece is 1..4, of which 2 is held.
        let mut have = Bitmap::new(5);
        for b in [0, 2, 4] {
            have.set(b);
        }
        let pieces = HashMap::from([(7, (1, 4))]);
        let mut s = Scheduler::for_pieces(one(20, Some(have)), &pieces, 4, 1, 32);
        let reads = read_all(&mut s);
        let read: Vec<(u64, bool)> = reads.iter().map(|r| (r.block, r.digest_only)).collect();
        assert_eq!(read, [(1, false), (2, true), (3, false)]);
        let sent: Vec<u64> = std::iter::from_fn(|| s.poll_send(0).map(|a| a.block)).collect();
        assert_eq!(sent, [1, 3]);
        s.handle_ack(0, 7, 1).unwrap();
        s.handle_ack(0, 7, 3).unwrap();
        // read_all's checksum of block b is b + 1; the others' count as 0.
        assert_eq!(s.poll_file_done().unwrap().1, file_digest(&[0, 2, 3, 4, 0]));
    }

    #[test]
    fn resume_without_digest_reads_only_missing_blocks() {
        let mut have = Bitmap::new(3);
        have.set(1);
        let mut s = Scheduler::new(one(10, Some(have)), 4, 1, 32, false);
        assert_eq!(read_all(&mut s).len(), 2);
    }

    #[test]
    fn empty_and_fully_held_files_complete_at_once() {
        let mut have = Bitmap::new(1);
        have.set(0);
        let files = vec![
            PlannedFile {
                file_id: 1,
                size: 0,
                have: None,
            },
            PlannedFile {
                file_id: 2,
                size: 3,
                have: Some(have),
            },
        ];
        let mut s = Scheduler::new(files, 4, 1, 32, false);
        assert_eq!(s.poll_file_done().unwrap().0, 1);
        assert_eq!(s.poll_file_done().unwrap().0, 2);
        assert!(s.is_finished());
        assert!(s.poll_read().is_none());
    }

    #[test]
    fn bogus_acks_are_violations() {
        let mut s = Scheduler::new(one(8, None), 4, 1, 32, false);
        read_all(&mut s);
        assert!(s.handle_ack(0, 99, 0).is_err());
        assert!(s.handle_ack(0, 7, 5).is_err());
        assert!(s.handle_ack(0, 7, 0).is_err(), "not sent yet");
        assert!(s.handle_nack(3, 7, 0).is_err(), "no such stream");
    }

    #[test]
    fn many_files_flow_back_to_back() {
        let files: Vec<_> = (0..100)
            .map(|i| PlannedFile {
                file_id: i,
                size: 3,
                have: None,
            })
            .collect();
        let mut s = Scheduler::new(files, 4, 4, 4000, true);
        read_all(&mut s);
        let mut sent = 0;
        for st in (0..4).cycle() {
            match s.poll_send(st) {
                Some(o) => {
                    s.handle_ack(st, o.file_id, o.block).unwrap();
                    sent += 1;
                }
                None if s.nothing_left_to_send() => break,
                None => {}
            }
        }
        assert_eq!(sent, 100);
        let mut done = 0;
        while s.poll_file_done().is_some() {
            done += 1;
        }
        assert_eq!(done, 100);
    }
}
