//! Seeded simulation of one transfer over several pairs through the
//! engine's real coordinator (`stripes::Coordinator`), with pairs that run
//! at different rates, are lost (and go on writing until their fence,
//! their acknowledgements sometimes lost with them), leave when their pool
//! scales down, and join when it scales up; blocks acknowledged twice;
//! sources that change while they are read; a shared destination that
//! holds each file's temporary copy and its published one.
//!
//! Properties, checked on every run:
//! - the run ends, within a bounded number of steps, with every file
//!   published or given up, and no file that did not change is given up;
//! - a published file holds its source as listed, block for block, and
//!   nothing is written to it after it is published;
//! - a file is published once, after its verification;
//! - no block is handed out again once it is durable: a lost pair's work
//!   costs at most its unacknowledged blocks;
//! - each block is handed to at most one running pair at a time, except a
//!   steal's blocks already in flight;
//! - an idle pair takes work from a busy one (steals happen in runs with
//!   several pairs);
//! - in runs whose pairs run one session per item (half the seeds), no
//!   steal cuts an item its pair has started: only a failed file's pieces
//!   are taken back from one (its session writes on, as a shell's does),
//!   and every such file ends given up.
//!
//! What is modelled, not real: the pairs' shells (reading, sending,
//! writing, acknowledging), the network between them and the coordinator,
//! the shared file system, and the agents' self-fencing (a lost agent
//! stops writing by its fence, which its Lease's expiry sets).
//!
//! `SIM_SEEDS=N` runs N seeds (default 2,000); `SIM_SEED=S` replays one
//! and prints its trace.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::time::{Duration, Instant};

use wirerate_engine::digest::{block_checksum, file_digest};
use wirerate_engine::stripes::{Action, Coordinator, Geometry, PairState, Verified, Work};

mod common;
use common::Rng;

const BLOCK: u64 = 4096;
const MAX_STEPS: u64 = 20_000;
const STEP: Duration = Duration::from_millis(1);

/// The checksum of `block` of `file` at `version` of its source.
fn content(file: u32, block: u64, version: u32) -> u64 {
    block_checksum(format!("{file}:{block}:{version}").as_bytes())
}

/// A block of a file, or (`None`) an empty file's creation.
type Unit = (u32, Option<u64>);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Life {
    Running,
    /// Thought lost: goes on until its fence, its acks delivered or not.
    Zombie {
        fence: u64,
        acks: bool,
    },
    Leaving,
    Dead,
}

/// A block (or an empty file's creation) on its way to the destination.
struct Flight {
    item: u64,
    file: u32,
    block: Option<u64>,
    sum: u64,
    lands: u64,
}

struct SimPair {
    life: Life,
    /// Blocks started per step.
    rate: u64,
    delay: u64,
    todo: Vec<(u64, VecDeque<Unit>)>,
    flights: Vec<Flight>,
    /// Items it has started (told the coordinator, in a world of
    /// session shells).
    started: HashSet<u64>,
}

#[derive(Default)]
struct Dest {
    temp: HashMap<u32, Vec<Option<u64>>>,
    published: HashMap<u32, Vec<Option<u64>>>,
    given_up: HashSet<u32>,
}

struct World {
    rng: Rng,
    step: u64,
    base: Instant,
    coord: Coordinator,
    sizes: BTreeMap<u32, u64>,
    version: BTreeMap<u32, u32>,
    pairs: BTreeMap<u32, SimPair>,
    /// Files whose pieces were taken back from a started item.
    cut_started: HashSet<u32>,
    next_pair: u32,
    dest: Dest,
    /// Blocks durable and acknowledged, as the coordinator was told.
    acked: HashSet<Unit>,
    verifying: HashSet<u32>,
    finished: bool,
    steals: u64,
    /// The pairs' shells run one session per item and cannot cut one
    /// short once started (`sender::pairs`): they say so, and no steal
    /// may then cut it.
    sessions: bool,
    trace: Vec<String>,
    verbose: bool,
}

fn blocks_of(size: u64) -> u64 {
    size.div_ceil(BLOCK)
}

impl World {
    fn new(seed: u64, verbose: bool) -> Self {
        let mut rng = Rng(seed);
        let mut sizes = BTreeMap::new();
        for id in 0..1 + rng.below(12) as u32 {
            let blocks = if rng.chance(150) { 0 } else { rng.below(40) };
            let tail = if blocks > 0 { rng.below(BLOCK) } else { 0 };
            sizes.insert(id, (blocks * BLOCK).saturating_sub(tail));
        }
        let stripe = match rng.below(4) {
            0 => None,
            n => Some(BLOCK << (n - 1)),
        };
        let mut geometry = Geometry::new(BLOCK, BLOCK * (1 + rng.below(8)), stripe).unwrap();
        // Half the worlds bundle small files below a chunk, as a tree
        // over several pairs does.
        if rng.below(2) == 0 {
            geometry = geometry.bundled(BLOCK * (1 + rng.below(4)), rng.below(4));
        }
        let files: Vec<(u32, u64)> = sizes.iter().map(|(&k, &v)| (k, v)).collect();
        let window = 1 + rng.below(3) as usize;
        let sessions = rng.below(2) == 0;
        let version = sizes.keys().map(|&k| (k, 0)).collect();
        let mut w = Self {
            rng,
            step: 0,
            base: Instant::now(),
            coord: Coordinator::new(geometry, &files, window),
            sizes,
            version,
            pairs: BTreeMap::new(),
            cut_started: HashSet::new(),
            next_pair: 0,
            dest: Dest::default(),
            acked: HashSet::new(),
            verifying: HashSet::new(),
            finished: false,
            steals: 0,
            sessions,
            trace: Vec::new(),
            verbose,
        };
        let first = 1 + w.rng.below(5);
        for _ in 0..first {
            w.join();
        }
        w
    }

    fn now(&self) -> Instant {
        self.base + STEP * self.step as u32
    }

    fn note(&mut self, line: String) {
        if self.verbose {
            println!("{:>5} {line}", self.step);
        }
        self.trace.push(format!("{:>5} {line}", self.step));
        if self.trace.len() > 60 {
            self.trace.remove(0);
        }
    }

    fn join(&mut self) {
        let id = self.next_pair;
        self.next_pair += 1;
        let pair = SimPair {
            life: Life::Running,
            rate: 1 + self.rng.below(4),
            delay: 1 + self.rng.below(6),
            todo: Vec::new(),
            flights: Vec::new(),
            started: HashSet::new(),
        };
        self.note(format!("pair {id} joins at {} blocks/step", pair.rate));
        self.pairs.insert(id, pair);
        let now = self.now();
        self.coord.join(now, id).unwrap();
        self.drain();
    }

    fn running(&self) -> Vec<u32> {
        self.pairs
            .iter()
            .filter(|(_, p)| p.life == Life::Running)
            .map(|(&id, _)| id)
            .collect()
    }

    /// Carries out what the coordinator asks, as the shells would.
    fn drain(&mut self) {
        while let Some(action) = self.coord.poll() {
            self.note(format!("{action:?}"));
            match action {
                Action::Assign { pair, item, work } => self.assign(pair, item, &work),
                Action::Withdraw { pair, item, keep } => self.withdraw(pair, item, &keep),
                Action::Stop { pair } => {
                    let p = self.pairs.get_mut(&pair).unwrap();
                    assert_eq!(p.life, Life::Leaving, "only a leaving pair is stopped");
                    p.todo.clear();
                }
                Action::Verify { file, digest } => self.verify(file, digest),
                Action::Publish { file } => self.publish(file),
                Action::GiveUp { file, .. } => {
                    assert!(
                        !self.dest.published.contains_key(&file),
                        "file {file} given up after it was published"
                    );
                    assert!(
                        self.dest.given_up.insert(file),
                        "file {file} given up twice"
                    );
                    self.dest.temp.remove(&file);
                }
                Action::Finished => {
                    assert!(!self.finished, "finished twice");
                    self.finished = true;
                }
            }
        }
    }

    fn assign(&mut self, pair: u32, item: u64, work: &Work) {
        let mut queue = VecDeque::new();
        for piece in work {
            if piece.first == piece.end {
                assert!(
                    !self.acked.contains(&(piece.file, None)),
                    "an empty file handed out after it was created"
                );
                queue.push_back((piece.file, None));
            }
            for b in piece.first..piece.end {
                assert!(
                    !self.acked.contains(&(piece.file, Some(b))),
                    "block {b} of file {} handed out again after it was durable",
                    piece.file
                );
                queue.push_back((piece.file, Some(b)));
            }
        }
        for (&other, p) in &self.pairs {
            if p.life != Life::Running {
                continue;
            }
            let held: HashSet<&Unit> = p.todo.iter().flat_map(|(_, t)| t).collect();
            if let Some(b) = queue.iter().find(|b| held.contains(b)) {
                panic!("{b:?} handed to pair {pair} while running pair {other} still has it to do");
            }
        }
        let p = self.pairs.get_mut(&pair).unwrap();
        assert_eq!(
            p.life,
            Life::Running,
            "work handed to pair {pair}, which is {:?}",
            p.life
        );
        p.todo.push((item, queue));
    }

    fn withdraw(&mut self, pair: u32, item: u64, keep: &Work) {
        self.steals += 1;
        let kept: HashSet<Unit> = keep
            .iter()
            .flat_map(|p| {
                let empty = (p.first == p.end).then_some((p.file, None));
                (p.first..p.end)
                    .map(move |b| (p.file, Some(b)))
                    .chain(empty)
            })
            .collect();
        let p = self.pairs.get_mut(&pair).unwrap();
        let Some((_, todo)) = p.todo.iter_mut().find(|(i, _)| *i == item) else {
            return;
        };
        if p.started.contains(&item) {
            // A session shell cannot cut a running session, and writes
            // on; only a file that failed may be taken back from one (an
            // ack that contradicts another), and it must end given up.
            let cut = todo.iter().filter(|b| !kept.contains(b)).map(|b| b.0);
            self.cut_started.extend(cut);
            return;
        }
        todo.retain(|b| kept.contains(b));
    }

    fn verify(&mut self, file: u32, digest: u128) {
        assert!(self.verifying.insert(file), "file {file} verified twice");
        let result = if self.version[&file] != 0 {
            Verified::SourceChanged
        } else {
            let temp = self.dest.temp.get(&file);
            let sums: Option<Vec<u64>> = temp.map(|t| t.iter().copied().collect()).unwrap_or(None);
            match sums {
                Some(s) if file_digest(&s) == digest => Verified::Good,
                _ => Verified::Mismatch,
            }
        };
        self.note(format!("file {file} verified: {result:?}"));
        self.coord.verified(file, result).unwrap();
    }

    fn publish(&mut self, file: u32) {
        assert!(
            self.verifying.contains(&file),
            "file {file} published unverified"
        );
        let temp = self
            .dest
            .temp
            .remove(&file)
            .expect("a published file was written");
        for (b, sum) in temp.iter().enumerate() {
            assert_eq!(
                *sum,
                Some(content(file, b as u64, 0)),
                "file {file} block {b} published not as listed"
            );
        }
        assert!(
            self.dest.published.insert(file, temp).is_none(),
            "file {file} published twice"
        );
    }

    /// One step of every pair's shell.
    fn step_pairs(&mut self) {
        let ids: Vec<u32> = self.pairs.keys().copied().collect();
        for id in ids {
            self.land(id);
            self.start(id);
            self.finish_items(id);
        }
    }

    /// Blocks due land at the destination and are acknowledged.
    fn land(&mut self, id: u32) {
        let step = self.step;
        let p = self.pairs.get_mut(&id).unwrap();
        let (due, rest): (Vec<Flight>, Vec<Flight>) = std::mem::take(&mut p.flights)
            .into_iter()
            .partition(|f| f.lands <= step);
        p.flights = rest;
        let life = p.life;
        for f in due {
            assert!(
                !self.dest.published.contains_key(&f.file),
                "pair {id} wrote file {} after it was published",
                f.file
            );
            assert!(
                !self.dest.given_up.contains(&f.file),
                "pair {id} wrote file {} after it was given up",
                f.file
            );
            let len = blocks_of(self.sizes[&f.file]) as usize;
            let temp = self
                .dest
                .temp
                .entry(f.file)
                .or_insert_with(|| vec![None; len]);
            if let Some(b) = f.block {
                temp[b as usize] = Some(f.sum);
            }
            if let Life::Zombie { acks: false, .. } = life {
                continue;
            }
            self.ack(id, &f);
            if self.rng.chance(50) {
                self.ack(id, &f);
            }
        }
    }

    fn ack(&mut self, id: u32, f: &Flight) {
        let (first, end, sums) = match f.block {
            Some(b) => (b, b + 1, vec![f.sum]),
            None => (0, 0, vec![]),
        };
        let piece = wirerate_engine::stripes::Piece {
            file: f.file,
            first,
            end,
        };
        let now = self.now();
        self.coord.acked(now, id, piece, &sums).unwrap();
        if !self.dest.given_up.contains(&f.file) {
            self.acked.insert((f.file, f.block));
        }
        self.drain();
    }

    /// A running pair (or a zombie that does not know) reads and sends its
    /// next blocks.
    fn start(&mut self, id: u32) {
        let step = self.step;
        let p = self.pairs.get_mut(&id).unwrap();
        if !matches!(p.life, Life::Running | Life::Zombie { .. }) {
            return;
        }
        for _ in 0..p.rate {
            let Some((item, todo)) = p.todo.iter_mut().find(|(_, t)| !t.is_empty()) else {
                break;
            };
            if self.sessions && p.started.insert(*item) {
                let said = self.coord.started(id, *item);
                // A zombie's item may be gone with it already.
                assert!(
                    said.is_ok() || p.life != Life::Running,
                    "pair {id} could not start item {item}: {said:?}"
                );
            }
            let (file, block) = todo.pop_front().unwrap();
            let sum = block.map_or(0, |b| content(file, b, self.version[&file]));
            let lands = step + 1 + self.rng.below(p.delay);
            p.flights.push(Flight {
                item: *item,
                file,
                block,
                sum,
                lands,
            });
        }
    }

    /// Items with nothing left and nothing in flight are reported finished;
    /// a leaving pair with nothing in flight has stopped.
    fn finish_items(&mut self, id: u32) {
        let p = self.pairs.get_mut(&id).unwrap();
        let done: Vec<u64> = p
            .todo
            .iter()
            .filter(|(i, t)| t.is_empty() && !p.flights.iter().any(|f| f.item == *i))
            .map(|(i, _)| *i)
            .collect();
        p.todo.retain(|(i, _)| !done.contains(i));
        let life = p.life;
        let quiet = p.flights.is_empty();
        let now = self.now();
        match life {
            Life::Running | Life::Zombie { .. } => {
                for item in done {
                    self.coord.finished(now, id, item).unwrap();
                    self.drain();
                }
            }
            Life::Leaving if quiet => {
                self.pairs.get_mut(&id).unwrap().life = Life::Dead;
                self.coord.stopped(now, id).unwrap();
                self.drain();
            }
            Life::Leaving | Life::Dead => {}
        }
    }

    /// Losses, departures, arrivals and source changes, drawn from the seed.
    fn perturb(&mut self, faults: &Faults) {
        let now = self.now();
        let running = self.running();
        if !running.is_empty() && self.rng.chance(faults.loss) {
            let id = running[self.rng.below(running.len() as u64) as usize];
            let fence = self.step + 1 + self.rng.below(20);
            let acks = self.rng.chance(500);
            self.note(format!("pair {id} lost, fenced at {fence}, acks {acks}"));
            self.pairs.get_mut(&id).unwrap().life = Life::Zombie { fence, acks };
            self.coord
                .lost(now, id, self.base + STEP * fence as u32)
                .unwrap();
            self.drain();
        } else if !running.is_empty() && self.rng.chance(faults.leave) {
            let id = running[self.rng.below(running.len() as u64) as usize];
            self.note(format!("pair {id} leaves"));
            self.pairs.get_mut(&id).unwrap().life = Life::Leaving;
            self.coord.leave(now, id).unwrap();
            self.drain();
        }
        self.report_zombie_again();
        let live = self.pairs.values().filter(|p| p.life != Life::Dead).count();
        let waiting = self.coord.waiting_for_pairs() && self.rng.chance(200);
        if (waiting || self.rng.chance(faults.join)) && live < 40 {
            self.join();
        }
        if self.rng.chance(faults.change) {
            let file = *self
                .sizes
                .keys()
                .nth(self.rng.below(self.sizes.len() as u64) as usize)
                .unwrap();
            self.note(format!("source {file} changes"));
            *self.version.get_mut(&file).unwrap() += 1;
        }
    }

    /// A pair thought lost is reported again: scaled away by its pool
    /// (`leave`), or lost a second time with a fence counted from now. Its
    /// real fence, which it keeps, is the first one.
    fn report_zombie_again(&mut self) {
        let zombies: Vec<u32> = self
            .pairs
            .iter()
            .filter(|(_, p)| matches!(p.life, Life::Zombie { .. }))
            .map(|(&id, _)| id)
            .collect();
        if zombies.is_empty() || !self.rng.chance(20) {
            return;
        }
        let id = zombies[self.rng.below(zombies.len() as u64) as usize];
        let now = self.now();
        if self.rng.chance(500) {
            self.note(format!("pair {id}, lost, is scaled away"));
            self.coord.leave(now, id).unwrap();
        } else {
            self.note(format!("pair {id} reported lost again, fence now"));
            self.coord.lost(now, id, now).unwrap();
        }
        self.drain();
    }

    fn fence(&mut self) {
        for p in self.pairs.values_mut() {
            if let Life::Zombie { fence, .. } = p.life
                && fence <= self.step
            {
                // Self-fenced: what it had in flight never lands.
                p.life = Life::Dead;
                p.flights.clear();
                p.todo.clear();
            }
        }
        let now = self.now();
        self.coord.tick(now);
        self.drain();
    }
}

#[derive(Debug, Clone, Copy)]
struct Faults {
    loss: u64,
    leave: u64,
    join: u64,
    change: u64,
}

fn run(seed: u64, verbose: bool) -> World {
    let mut w = World::new(seed, verbose);
    let driven = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| drive(&mut w)));
    if let Err(e) = driven {
        eprintln!("seed {seed} failed (replay with SIM_SEED={seed}); its last events:");
        for line in &w.trace {
            eprintln!("{line}");
        }
        std::panic::resume_unwind(e);
    }
    w
}

fn drive(w: &mut World) {
    let faults = Faults {
        loss: w.rng.below(30),
        leave: w.rng.below(20),
        join: w.rng.below(20),
        change: if w.rng.chance(300) {
            w.rng.below(10)
        } else {
            0
        },
    };
    while !w.finished {
        assert!(w.step < MAX_STEPS, "no end after {MAX_STEPS} steps");
        w.step += 1;
        w.fence();
        w.perturb(&faults);
        w.step_pairs();
    }
    for (&file, &v) in &w.version {
        let published = w.dest.published.contains_key(&file);
        assert!(
            published || w.dest.given_up.contains(&file),
            "file {file} has no end"
        );
        assert!(
            published || v != 0,
            "file {file} did not change, and was given up"
        );
    }
    for file in &w.cut_started {
        assert!(
            w.dest.given_up.contains(file),
            "file {file} was cut from a started item, and not given up"
        );
    }
    assert!(w.coord.is_finished());
}

#[test]
fn seeded_runs_keep_every_property() {
    if let Ok(seed) = std::env::var("SIM_SEED") {
        run(seed.parse().expect("SIM_SEED is a number"), true);
        return;
    }
    let seeds: u64 = std::env::var("SIM_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(2_000);
    let mut steals = 0;
    let mut lost = 0;
    for seed in 0..seeds {
        let w = run(seed, false);
        steals += w.steals;
        lost += w
            .coord
            .pair_views(w.now())
            .iter()
            .filter(|(_, v)| v.state == PairState::Gone)
            .count();
    }
    println!("{seeds} seeds: {steals} withdrawals, {lost} pairs gone");
    assert!(
        steals > 0 && lost > 0,
        "the runs stole no work or lost no pair"
    );
}
