//! Reading the operator's Prometheus text: counters and one histogram's
//! quantiles.

/// A histogram's cumulative buckets (upper bound, count), `+Inf` last.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct Histogram {
    pub(crate) buckets: Vec<(f64, f64)>,
    pub(crate) count: f64,
}

/// Whether a sample line is `name{...}` with every label of `labels`.
fn sample<'a>(line: &'a str, name: &str, labels: &[(&str, &str)]) -> Option<(&'a str, f64)> {
    let rest = line.strip_prefix(name)?;
    let (label_text, value) = match rest.strip_prefix('{') {
        Some(r) => {
            let (l, v) = r.split_once('}')?;
            (l, v)
        }
        None if rest.starts_with(' ') => ("", rest),
        None => return None,
    };
    if !labels
        .iter()
        .all(|(k, v)| label_text.contains(&format!("{k}=\"{v}\"")))
    {
        return None;
    }
    Some((label_text, value.split_whitespace().next()?.parse().ok()?))
}

/// The sum of every sample of `name` carrying `labels`.
pub(crate) fn counter(text: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    text.lines()
        .filter_map(|l| sample(l, name, labels))
        // A fold from +0: an empty f64 sum is -0, which prints as "-0".
        .fold(0.0, |acc, (_, v)| acc + v)
}

/// The histogram `name` with `labels`.
pub(crate) fn histogram(text: &str, name: &str, labels: &[(&str, &str)]) -> Histogram {
    let bucket = format!("{name}_bucket");
    let mut buckets: Vec<(f64, f64)> = text
        .lines()
        .filter_map(|l| sample(l, &bucket, labels))
        .filter_map(|(l, v)| {
            let le = l.split("le=\"").nth(1)?.split('"').next()?;
            let bound = if le == "+Inf" {
                f64::INFINITY
            } else {
                le.parse().ok()?
            };
            Some((bound, v))
        })
        .collect();
    buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
    Histogram {
        buckets,
        count: counter(text, &format!("{name}_count"), labels),
    }
}

impl Histogram {
    /// The `q` quantile, interpolated linearly inside its bucket as
    /// Prometheus' `histogram_quantile` does; a quantile in the `+Inf`
    /// bucket is the highest finite bound (see `beyond`).
    pub(crate) fn quantile(&self, q: f64) -> Option<f64> {
        if self.count <= 0.0 {
            return None;
        }
        let rank = q * self.count;
        let mut lower = (0.0, 0.0);
        for &(bound, cum) in &self.buckets {
            if cum >= rank {
                if bound.is_infinite() {
                    return Some(lower.0);
                }
                let inside = cum - lower.1;
                let frac = if inside > 0.0 {
                    (rank - lower.1) / inside
                } else {
                    1.0
                };
                return Some(lower.0 + (bound - lower.0) * frac);
            }
            lower = (bound, cum);
        }
        Some(lower.0)
    }

    /// Whether the `q` quantile lies past the last finite bound, so that
    /// `quantile` gives only a lower bound.
    pub(crate) fn beyond(&self, q: f64) -> bool {
        let finite = self
            .buckets
            .iter()
            .rfind(|(b, _)| b.is_finite())
            .map_or(0.0, |(_, c)| *c);
        self.count > 0.0 && finite < q * self.count
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = r#"# HELP wirerate_operator_reconcile_duration_seconds Reconcile duration
wirerate_operator_reconcile_duration_seconds_bucket{controller="transfer",le="0.005"} 50
wirerate_operator_reconcile_duration_seconds_bucket{controller="transfer",le="0.01"} 90
wirerate_operator_reconcile_duration_seconds_bucket{controller="transfer",le="0.05"} 99
wirerate_operator_reconcile_duration_seconds_bucket{controller="transfer",le="+Inf"} 100
wirerate_operator_reconcile_duration_seconds_count{controller="transfer"} 100
wirerate_operator_reconcile_duration_seconds_count{controller="dtnpool"} 7
wirerate_operator_reconcile_errors_total{controller="transfer",error="kube"} 2
wirerate_operator_reconcile_errors_total{controller="transfer",error="finalizer"} 1
"#;

    #[test]
    fn quantiles_interpolate_within_buckets() {
        let h = histogram(
            TEXT,
            "wirerate_operator_reconcile_duration_seconds",
            &[("controller", "transfer")],
        );
        assert_eq!(h.count, 100.0);
        assert_eq!(h.quantile(0.5), Some(0.005));
        assert!((h.quantile(0.7).unwrap() - 0.0075).abs() < 1e-9);
        assert_eq!(
            h.quantile(0.995),
            Some(0.05),
            "past the last bound: at least it"
        );
        assert!(h.beyond(0.995) && !h.beyond(0.99));
        assert_eq!(
            counter(
                TEXT,
                "wirerate_operator_reconcile_errors_total",
                &[("controller", "transfer")]
            ),
            3.0
        );
    }
}
