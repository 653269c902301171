//! What a sender over several pairs writes of them into the Transfer's
//! status (`status.stripes`): the split, each pair, and the totals.

use wirerate_crds::transfer::{PairReport, StripesReport};
use wirerate_engine::progress::PairsShown;

/// The agents of the endpoints a sender over several pairs sends to and
/// through, each as (endpoint, agent).
pub struct Names<'a> {
    /// The receivers'.
    pub receivers: &'a [(String, String)],
    /// The relays'.
    pub relays: &'a [(String, String)],
}

/// The agent at `endpoint` by `names` (an endpoint without one stands for
/// itself).
fn agent_at(names: &[(String, String)], endpoint: &str) -> String {
    names
        .iter()
        .find(|(e, _)| e == endpoint)
        .map_or_else(|| endpoint.to_owned(), |(_, n)| n.clone())
}

/// `status.stripes` for attempt `attempt`, sent by `sender`, from what the
/// engine shows of its pairs, each receiver and relay named by `names`.
pub fn report(attempt: i32, sender: &str, shown: &PairsShown, names: &Names<'_>) -> StripesReport {
    let pairs: Vec<PairReport> = shown
        .pairs
        .iter()
        .map(|p| PairReport {
            receiver: agent_at(names.receivers, &p.to),
            relay: p.via.as_deref().map(|v| agent_at(names.relays, v)),
            endpoint: p.to.clone(),
            state: p.state.to_owned(),
            bytes: i64::try_from(p.bytes).unwrap_or(i64::MAX),
            rate_bps: i64::try_from(p.rate_bps).unwrap_or(i64::MAX),
            chunks_done: i64::try_from(p.chunks_done).unwrap_or(i64::MAX),
        })
        .collect();
    StripesReport {
        attempt,
        sender: sender.to_owned(),
        chunk_bytes: i64::try_from(shown.chunk_bytes).unwrap_or(i64::MAX),
        streams_per_pair: i32::from(shown.streams_per_pair),
        running: pairs.iter().filter(|p| p.state == "running").count() as i32,
        bytes: pairs.iter().map(|p| p.bytes).fold(0, i64::saturating_add),
        rate_bps: pairs
            .iter()
            .filter(|p| p.state == "running")
            .map(|p| p.rate_bps)
            .fold(0, i64::saturating_add),
        pairs,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use wirerate_engine::progress::PairShown;

    #[test]
    fn each_pair_is_named_by_its_agent_and_the_totals_add_up() {
        let pair = |to: &str, state, bytes, rate| PairShown {
            to: to.into(),
            via: (to == "10.0.0.4:7700").then(|| "10.0.1.9:7701".to_owned()),
            state,
            bytes,
            rate_bps: rate,
            chunks_done: 2,
        };
        let shown = PairsShown {
            chunk_bytes: 64 << 20,
            streams_per_pair: 4,
            pairs: vec![
                pair("10.0.0.2:7700", "running", 300, 10),
                pair("10.0.0.3:7700", "gone", 100, 7),
                pair("10.0.0.4:7700", "running", 200, 5),
            ],
        };
        let names = vec![
            ("10.0.0.2:7700".to_owned(), "r0".to_owned()),
            ("10.0.0.3:7700".to_owned(), "r1".to_owned()),
        ];
        let relays = vec![("10.0.1.9:7701".to_owned(), "s1".to_owned())];
        let names = Names {
            receivers: &names,
            relays: &relays,
        };
        let r = report(2, "s0", &shown, &names);
        let receivers: Vec<&str> = r.pairs.iter().map(|p| p.receiver.as_str()).collect();
        assert_eq!(receivers, ["r0", "r1", "10.0.0.4:7700"]);
        let relays: Vec<Option<&str>> = r.pairs.iter().map(|p| p.relay.as_deref()).collect();
        assert_eq!(relays, [None, None, Some("s1")]);
        assert_eq!(
            (r.running, r.bytes, r.rate_bps),
            (2, 600, 15),
            "a gone pair's rate is not counted"
        );
        assert_eq!(
            (
                r.attempt,
                r.sender.as_str(),
                r.chunk_bytes,
                r.streams_per_pair
            ),
            (2, "s0", 64 << 20, 4)
        );
    }
}
