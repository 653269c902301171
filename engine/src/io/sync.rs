//! Buffered and direct modes: one synchronous request at a time.

use std::collections::VecDeque;
use std::io;
use std::os::unix::fs::FileExt;

use super::{BlockIo, IoDone, IoOp, OpKind};

/// Performs each op at submit time with pread/pwrite.
#[derive(Default)]
pub struct SyncIo {
    done: VecDeque<IoDone>,
}

/// Reads until `buf` is full or end of file.
pub(crate) fn read_full(file: &std::fs::File, buf: &mut [u8], offset: u64) -> io::Result<usize> {
    let mut done = 0;
    while done < buf.len() {
        match file.read_at(&mut buf[done..], offset + done as u64) {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(done)
}

impl BlockIo for SyncIo {
    fn submit(&mut self, mut op: IoOp) {
        let result = match op.kind {
            OpKind::Read => {
                let len = op.len.min(op.buf.capacity());
                let r = read_full(&op.file, &mut op.buf.as_mut_full()[..len], op.offset);
                if let Ok(n) = r {
                    op.buf.set_len(n);
                }
                r
            }
            OpKind::Write => op
                .file
                .write_all_at(&op.buf.as_slice()[..op.len], op.offset)
                .map(|()| op.len),
        };
        self.done.push_back(IoDone {
            tag: op.tag,
            kind: op.kind,
            buf: op.buf,
            result,
        });
    }

    fn reap(&mut self, _wait: bool) -> crate::Result<Vec<IoDone>> {
        Ok(self.done.drain(..).collect())
    }

    fn in_flight(&self) -> usize {
        self.done.len()
    }

    fn depth(&self) -> usize {
        1
    }
}
