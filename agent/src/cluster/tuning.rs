//! What a sender's tuner and optimizer did, as `status.tuning` and the
//! Events that tell a Transfer's watchers: pure, from what the engine
//! reported into the job's progress.

use wirerate_crds::transfer::{MAX_TUNING_CHANGES, TuningReport};
use wirerate_engine::optimizer::StreamChange;
use wirerate_engine::tuner::StreamChoice;

/// The most characters of one reason or change that status and Events
/// carry (an Event's note holds 1 KiB).
const MOST_CHARS: usize = 1000;

fn clipped(s: &str) -> String {
    s.chars().take(MOST_CHARS).collect()
}

/// How one change reads in `status.tuning.changes`.
fn change_line(c: &StreamChange) -> String {
    clipped(&format!(
        "after {:.1} s: {} -> {}: {}",
        c.after_secs, c.from, c.to, c.reason
    ))
}

/// `status.tuning` of `attempt`: the streams open now (the tuner's choice
/// and what the optimizer added since) and the latest changes.
pub fn report(attempt: i32, choice: &StreamChoice, changes: &[StreamChange]) -> TuningReport {
    let streams = changes.last().map_or(choice.streams, |c| c.to);
    TuningReport {
        attempt,
        streams: streams.into(),
        reason: clipped(&choice.reason),
        changes: changes
            .iter()
            .skip(changes.len().saturating_sub(MAX_TUNING_CHANGES))
            .map(change_line)
            .collect(),
    }
}

/// The note of the Event that tells the tuner's choice.
pub fn chosen_note(attempt: i32, c: &StreamChoice) -> String {
    clipped(&format!(
        "attempt {attempt}: {} data streams: {}",
        c.streams, c.reason
    ))
}

/// The note of the Event that tells one of the optimizer's additions.
pub fn added_note(attempt: i32, c: &StreamChange) -> String {
    clipped(&format!("attempt {attempt}: {}", change_line(c)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn change(from: u16, to: u16) -> StreamChange {
        StreamChange {
            after_secs: f64::from(from),
            from,
            to,
            reason: format!("{from} streams carry 2.00 Gbit/s: trying {to}"),
        }
    }

    #[test]
    fn the_report_counts_the_added_streams_and_keeps_the_latest_changes() {
        let choice = StreamChoice {
            streams: 4,
            reason: "4, the default".into(),
        };
        let t = report(2, &choice, &[]);
        assert_eq!((t.streams, t.changes.len()), (4, 0));
        assert_eq!(
            chosen_note(2, &choice),
            "attempt 2: 4 data streams: 4, the default"
        );
        let t = report(2, &choice, &[change(4, 6), change(6, 9)]);
        assert_eq!(t.streams, 9);
        assert_eq!(t.reason, "4, the default");
        assert_eq!(
            t.changes,
            [
                "after 4.0 s: 4 -> 6: 4 streams carry 2.00 Gbit/s: trying 6",
                "after 6.0 s: 6 -> 9: 6 streams carry 2.00 Gbit/s: trying 9"
            ]
        );
        assert_eq!(
            added_note(2, &change(6, 9)),
            "attempt 2: after 6.0 s: 6 -> 9: 6 streams carry 2.00 Gbit/s: trying 9"
        );
        // Bounded: the latest, and the count of the last.
        let many: Vec<_> = (1..40).map(|n| change(n, n + 1)).collect();
        let t = report(1, &choice, &many);
        assert_eq!(t.changes.len(), MAX_TUNING_CHANGES);
        assert!(
            t.changes[MAX_TUNING_CHANGES - 1].contains("39 -> 40"),
            "{t:?}"
        );
        assert_eq!(t.streams, 40);
        // Long reasons are clipped, on character boundaries.
        let long = StreamChange {
            reason: "é".repeat(5000),
            ..change(4, 6)
        };
        assert_eq!(added_note(1, &long).chars().count(), MOST_CHARS);
        assert_eq!(
            report(1, &choice, &[long]).changes[0].chars().count(),
            MOST_CHARS
        );
    }
}
