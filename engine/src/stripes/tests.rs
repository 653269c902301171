//! The coordinator, driven by hand: the cases the simulation draws at
//! random, each pinned.

use std::time::{Duration, Instant};

use super::*;

const B: u64 = 4096;

fn ms(t0: Instant, n: u64) -> Instant {
    t0 + Duration::from_millis(n)
}

fn piece(file: u32, first: u64, end: u64) -> Piece {
    Piece { file, first, end }
}

fn drain(c: &mut Coordinator) -> Vec<Action> {
    std::iter::from_fn(|| c.poll()).collect()
}

fn assigned(actions: &[Action], to: PairId) -> Vec<(ItemId, Work)> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::Assign { pair, item, work } if *pair == to => Some((*item, work.clone())),
            _ => None,
        })
        .collect()
}

fn ack_all(c: &mut Coordinator, now: Instant, pair: PairId, work: &Work) {
    for p in work {
        c.acked(now, pair, *p, &vec![7; p.blocks() as usize])
            .unwrap();
    }
}

/// A coordinator of one 4-block file in 4-block chunks, one item a pair.
fn one_file() -> Coordinator {
    Coordinator::new(Geometry::new(B, 4 * B, None).unwrap(), &[(1, 4 * B)], 1)
}

/// `pair` joins at `at`, is handed everything, acknowledges it and says
/// it has finished.
fn join_and_do_all(c: &mut Coordinator, at: Instant, pair: PairId) {
    c.join(at, pair).unwrap();
    let (item, work) = assigned(&drain(c), pair).remove(0);
    ack_all(c, at, pair, &work);
    c.finished(at, pair, item).unwrap();
}

#[test]
fn nothing_to_send_is_finished_at_once() {
    let mut c = Coordinator::new(Geometry::new(B, B, None).unwrap(), &[], 2);
    assert_eq!(drain(&mut c), vec![Action::Finished]);
}

#[test]
fn a_lost_pair_gives_back_only_its_unacknowledged_blocks_and_the_file_waits_for_its_fence() {
    let t0 = Instant::now();
    let g = Geometry::new(B, 8 * B, None).unwrap();
    let mut c = Coordinator::new(g, &[(1, 8 * B)], 1);
    c.join(t0, 0).unwrap();
    let (_, work) = assigned(&drain(&mut c), 0).remove(0);
    assert_eq!(work, vec![piece(1, 0, 8)]);
    c.acked(ms(t0, 1), 0, piece(1, 0, 3), &[7; 3]).unwrap();
    c.acked(ms(t0, 1), 0, piece(1, 5, 6), &[7]).unwrap();
    c.lost(ms(t0, 2), 0, ms(t0, 50)).unwrap();
    assert!(c.waiting_for_pairs());
    c.join(ms(t0, 3), 1).unwrap();
    let (item, work) = assigned(&drain(&mut c), 1).remove(0);
    assert_eq!(
        work,
        vec![piece(1, 3, 5), piece(1, 6, 8)],
        "only the 4 unacknowledged blocks are sent again"
    );
    ack_all(&mut c, ms(t0, 4), 1, &work);
    c.finished(ms(t0, 4), 1, item).unwrap();
    assert_eq!(
        drain(&mut c),
        vec![],
        "the lost pair may still write until its fence"
    );
    // The lost pair, unaware, writes one more block and says so: accepted.
    c.acked(ms(t0, 10), 0, piece(1, 7, 8), &[7]).unwrap();
    c.tick(ms(t0, 50));
    let actions = drain(&mut c);
    assert!(
        matches!(actions[..], [Action::Verify { file: 1, .. }]),
        "{actions:?}"
    );
    assert_eq!(
        c.acked(ms(t0, 51), 0, piece(1, 7, 8), &[7]),
        Err(Refused::Fenced(0))
    );
    c.verified(1, Verified::Good).unwrap();
    assert_eq!(
        drain(&mut c),
        vec![Action::Publish { file: 1 }, Action::Finished]
    );
    assert_eq!(c.verified(1, Verified::Good), Err(Refused::NotVerifying(1)));
}

#[test]
fn an_idle_pair_takes_from_the_slower_in_proportion_to_their_rates() {
    let t0 = Instant::now();
    let g = Geometry::new(B, 100 * B, None).unwrap();
    let mut c = Coordinator::new(g, &[(1, 100 * B), (2, 100 * B)], 1);
    c.join(t0, 0).unwrap();
    c.join(t0, 1).unwrap();
    let actions = drain(&mut c);
    let (i0, w0) = assigned(&actions, 0).remove(0);
    let (_, w1) = assigned(&actions, 1).remove(0);
    // Pair 0 finishes its 100 blocks in 10 ms; pair 1 did 10 in that time.
    c.acked(
        ms(t0, 10),
        1,
        Piece {
            end: w1[0].first + 10,
            ..w1[0]
        },
        &[7; 10],
    )
    .unwrap();
    ack_all(&mut c, ms(t0, 10), 0, &w0);
    c.finished(ms(t0, 10), 0, i0).unwrap();
    let actions = drain(&mut c);
    let Some(Action::Withdraw { pair: 1, keep, .. }) = actions.first() else {
        panic!("pair 1 keeps less: {actions:?}");
    };
    let (_, stolen) = assigned(&actions, 0).remove(0);
    let stolen: u64 = stolen.iter().map(Piece::blocks).sum();
    let kept: u64 = keep.iter().map(Piece::blocks).sum::<u64>() - 10;
    // 90 left, rates 10:1: the thief takes about 10/11 of them.
    assert_eq!(stolen + kept, 90);
    assert!((80..=82).contains(&stolen), "stole {stolen} of 90");
}

#[test]
fn a_leaving_pair_is_stopped_and_its_work_goes_to_the_others() {
    let t0 = Instant::now();
    let g = Geometry::new(B, 4 * B, None).unwrap();
    let mut c = Coordinator::new(g, &[(1, 16 * B)], 1);
    c.join(t0, 0).unwrap();
    c.join(t0, 1).unwrap();
    let first = drain(&mut c);
    let (_, w0) = assigned(&first, 0).remove(0);
    c.leave(ms(t0, 1), 0).unwrap();
    let mut actions = drain(&mut c);
    assert_eq!(actions[0], Action::Stop { pair: 0 });
    // Pair 1 already holds its one item: the returned work waits in the queue.
    assert!(assigned(&actions, 1).is_empty());
    actions.extend(first);
    c.stopped(ms(t0, 2), 0).unwrap();
    let views = c.pair_views(ms(t0, 2));
    assert_eq!(views[0].1.state, PairState::Gone);
    // Pair 1 works through everything, including what pair 0 had.
    let mut handed = vec![];
    actions.extend(drain(&mut c));
    let mut next = assigned(&actions, 1);
    while let Some((item, work)) = next.pop() {
        ack_all(&mut c, ms(t0, 3), 1, &work);
        handed.extend(work);
        c.finished(ms(t0, 3), 1, item).unwrap();
        let more = drain(&mut c);
        next.extend(assigned(&more, 1));
    }
    assert!(
        w0.iter().all(|p| handed.contains(p)),
        "{w0:?} not in {handed:?}"
    );
    assert!(!c.waiting_for_pairs());
}

#[test]
fn reports_that_do_not_fit_are_refused_and_change_nothing() {
    let t0 = Instant::now();
    let g = Geometry::new(B, 4 * B, None).unwrap();
    let mut c = Coordinator::new(g, &[(1, 4 * B), (2, 4 * B)], 1);
    c.join(t0, 0).unwrap();
    assert_eq!(c.join(t0, 0), Err(Refused::Rejoined(0)));
    let (item, work) = assigned(&drain(&mut c), 0).remove(0);
    let other = if work[0].file == 1 { 2 } else { 1 };
    let not_held = |file, first, end| Refused::NotHeld {
        pair: 0,
        file,
        first,
        end,
    };
    let p = piece;
    assert_eq!(
        c.acked(t0, 0, p(other, 0, 1), &[7]),
        Err(not_held(other, 0, 1))
    );
    let mine = work[0].file;
    assert_eq!(
        c.acked(t0, 0, p(mine, 3, 5), &[7, 7]),
        Err(not_held(mine, 3, 5))
    );
    assert_eq!(
        c.acked(t0, 0, p(mine, 0, 2), &[7]),
        Err(not_held(mine, 0, 2))
    );
    assert_eq!(
        c.acked(t0, 9, p(mine, 0, 1), &[7]),
        Err(Refused::UnknownPair(9))
    );
    assert_eq!(
        c.finished(t0, 0, item + 1),
        Err(Refused::NotItsItem {
            pair: 0,
            item: item + 1
        })
    );
    assert_eq!(
        c.verified(mine, Verified::Good),
        Err(Refused::NotVerifying(mine))
    );
    // A verdict nobody asked for does not give an open file up.
    assert_eq!(
        c.verified(mine, Verified::Mismatch),
        Err(Refused::NotVerifying(mine))
    );
    assert_eq!(c.progress(), (0, 8 * B));
    ack_all(&mut c, t0, 0, &work);
    c.finished(t0, 0, item).unwrap();
    let after = drain(&mut c);
    assert!(
        after
            .iter()
            .any(|a| matches!(a, Action::Verify { file, .. } if *file == mine)),
        "the file is verified as usual: {after:?}"
    );
    for id in 1..MAX_PAIRS as PairId {
        c.join(t0, id).unwrap();
    }
    assert_eq!(c.join(t0, 999), Err(Refused::TooManyPairs));
}

#[test]
fn two_acknowledgements_that_disagree_give_the_file_up_once_nothing_writes_to_it() {
    let t0 = Instant::now();
    let g = Geometry::new(B, 4 * B, None).unwrap();
    let mut c = Coordinator::new(g, &[(1, 4 * B)], 1);
    c.join(t0, 0).unwrap();
    let (item, _) = assigned(&drain(&mut c), 0).remove(0);
    c.acked(t0, 0, piece(1, 0, 1), &[7]).unwrap();
    c.acked(t0, 0, piece(1, 0, 1), &[8]).unwrap();
    let actions = drain(&mut c);
    assert!(
        matches!(&actions[..], [Action::Withdraw { pair: 0, keep, .. }] if keep.is_empty()),
        "{actions:?}"
    );
    c.finished(t0, 0, item).unwrap();
    assert_eq!(
        drain(&mut c),
        vec![
            Action::GiveUp {
                file: 1,
                why: GiveUp::SourceChanged
            },
            Action::Finished
        ]
    );
}

#[test]
fn pairs_that_are_gone_leave_room_for_new_ones() {
    let t0 = Instant::now();
    let mut c = one_file();
    for id in 0..MAX_PAIRS as PairId {
        c.join(t0, id).unwrap();
        c.leave(t0, id).unwrap();
        c.stopped(t0, id).unwrap();
    }
    c.join(t0, 1000).unwrap();
    assert!(!c.waiting_for_pairs());
}

#[test]
fn a_lost_pair_scaled_away_keeps_its_fence_and_the_file_ends() {
    let t0 = Instant::now();
    let mut c = one_file();
    c.join(t0, 0).unwrap();
    drain(&mut c);
    c.lost(ms(t0, 1), 0, ms(t0, 30)).unwrap();
    // The pool scales down and takes the dead agent with it.
    c.leave(ms(t0, 2), 0).unwrap();
    join_and_do_all(&mut c, ms(t0, 3), 1);
    assert_eq!(c.poll_timeout(), Some(ms(t0, 30)));
    c.tick(ms(t0, 30));
    let actions = drain(&mut c);
    assert!(
        matches!(actions[..], [Action::Verify { file: 1, .. }]),
        "{actions:?}"
    );
}

#[test]
fn a_second_loss_report_never_brings_the_fence_closer() {
    let t0 = Instant::now();
    let mut c = one_file();
    c.join(t0, 0).unwrap();
    drain(&mut c);
    c.lost(ms(t0, 1), 0, ms(t0, 30)).unwrap();
    c.lost(ms(t0, 2), 0, ms(t0, 3)).unwrap();
    join_and_do_all(&mut c, ms(t0, 3), 1);
    c.tick(ms(t0, 10));
    assert_eq!(drain(&mut c), vec![], "pair 0 may write until 30 ms");
    // It does, and is heard; past its fence it is refused.
    c.acked(ms(t0, 20), 0, piece(1, 0, 1), &[7]).unwrap();
    assert_eq!(
        c.acked(ms(t0, 31), 0, piece(1, 0, 1), &[7]),
        Err(Refused::Fenced(0))
    );
    assert!(matches!(
        drain(&mut c)[..],
        [Action::Verify { file: 1, .. }]
    ));
}

#[test]
fn a_started_item_is_never_cut_and_a_queued_one_behind_it_is() {
    let t0 = Instant::now();
    let g = Geometry::new(B, 50 * B, None).unwrap();
    let files = [(1, 50 * B), (2, 50 * B)];
    // Pair 1 holds both chunks (window 2) and has started both: a pair
    // that joins with the queue empty finds nothing it may take.
    let mut c = Coordinator::new(g, &files, 2);
    c.join(t0, 1).unwrap();
    let held = assigned(&drain(&mut c), 1);
    assert_eq!(held.len(), 2);
    for (item, _) in &held {
        c.started(1, *item).unwrap();
    }
    c.join(t0, 0).unwrap();
    assert!(drain(&mut c).is_empty());
    // Pair 1 started only its first: the steal cuts the second, and
    // leaves the first alone.
    let mut c = Coordinator::new(g, &files, 2);
    c.join(t0, 1).unwrap();
    let held = assigned(&drain(&mut c), 1);
    c.started(1, held[0].0).unwrap();
    c.join(t0, 0).unwrap();
    let actions = drain(&mut c);
    let Some(Action::Withdraw { item, .. }) = actions.first() else {
        panic!("the queued item is cut: {actions:?}");
    };
    assert_eq!(*item, held[1].0);
    assert!(!assigned(&actions, 0).is_empty());
    // Another pair's item is not this one's to start.
    assert_eq!(
        c.started(0, held[0].0),
        Err(Refused::NotItsItem {
            pair: 0,
            item: held[0].0
        })
    );
}

#[test]
fn a_file_the_shell_gives_up_is_withdrawn_and_given_up_once_nothing_writes_to_it() {
    let t0 = Instant::now();
    let mut c = one_file();
    c.join(t0, 0).unwrap();
    let (item, _) = assigned(&drain(&mut c), 0).remove(0);
    c.give_up(t0, 1).unwrap();
    // Pair 0 still holds it: not given up yet.
    assert!(
        !drain(&mut c)
            .iter()
            .any(|a| matches!(a, Action::GiveUp { .. }))
    );
    c.finished(t0, 0, item).unwrap();
    let actions = drain(&mut c);
    assert!(actions.contains(&Action::GiveUp {
        file: 1,
        why: GiveUp::Failed
    }));
    assert!(actions.contains(&Action::Finished));
    assert_eq!(c.give_up(t0, 1), Err(Refused::NotOpen(1)));
}
