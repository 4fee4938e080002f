//! The pure parts of the measurements: percentiles and summaries of
//! durations, `/proc/PID/status` and `/proc/PID/stat` parsing (peak RSS and
//! CPU time), the API server's Prometheus text (`apiserver_request_total`),
//! and the dev server's `/admin/stats` counters grouped into logins, fetches
//! and the rest.

use std::collections::BTreeMap;

use serde::Serialize;
use serde_json::Value;

/// The `q`-th percentile (0..=100) of `values` by the nearest-rank method;
/// `None` for no values.
pub fn percentile(values: &[f64], q: f64) -> Option<f64> {
    if values.is_empty() {
        return None;
    }
    let mut v: Vec<f64> = values.to_vec();
    v.sort_by(f64::total_cmp);
    let q = q.clamp(0.0, 100.0);
    // Nearest rank: the smallest value with at least q% of the values at or
    // below it.
    let rank = ((q / 100.0) * v.len() as f64).ceil() as usize;
    Some(v[rank.clamp(1, v.len()) - 1])
}

/// Count, p50, p99, max and mean of a sample (seconds or any unit).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Summary {
    /// Number of values.
    pub n: usize,
    /// Median (nearest rank).
    pub p50: Option<f64>,
    /// 99th percentile (nearest rank).
    pub p99: Option<f64>,
    /// Largest value.
    pub max: Option<f64>,
    /// Mean.
    pub mean: Option<f64>,
}

impl Summary {
    /// Summarise `values`.
    pub fn of(values: &[f64]) -> Self {
        let n = values.len();
        Self {
            n,
            p50: percentile(values, 50.0),
            p99: percentile(values, 99.0),
            max: values.iter().copied().reduce(f64::max),
            mean: (n > 0).then(|| values.iter().sum::<f64>() / n as f64),
        }
    }
}

/// The API server's counters in a Prometheus text: the sum of every
/// `apiserver_request_total` sample and the sums by verb and by request;
/// the bytes and events its watches sent, by resource
/// (`apiserver_watch_events_sizes_sum` and `apiserver_watch_events_total`,
/// counted per watch: an event sent to three watchers counts three times).
pub fn apiserver_requests(metrics: &str) -> ApiRequests {
    let mut out = ApiRequests::default();
    for (labels, v) in samples(metrics, "apiserver_request_total") {
        out.total += v;
        let verb = label(labels, "verb").unwrap_or_default();
        let mut resource = label(labels, "resource").unwrap_or_default();
        if let Some(sub) = label(labels, "subresource").filter(|s| !s.is_empty()) {
            resource = format!("{resource}/{sub}");
        }
        *out.by_request
            .entry(format!("{verb} {resource}"))
            .or_default() += v;
        *out.by_verb.entry(verb).or_default() += v;
    }
    let watched = |labels: &str| {
        label(labels, "resource")
            .or_else(|| label(labels, "kind"))
            .unwrap_or_default()
    };
    for (labels, v) in samples(metrics, "apiserver_watch_events_sizes_sum") {
        *out.watch_bytes.entry(watched(labels)).or_default() += v;
    }
    for (labels, v) in samples(metrics, "apiserver_watch_events_total") {
        *out.watch_events.entry(watched(labels)).or_default() += v;
    }
    out
}

/// The samples of the metric `name` (exactly: not a longer name it begins),
/// as their label set (`a="x",b="y"`, empty without labels) and value.
fn samples<'a>(metrics: &'a str, name: &'a str) -> impl Iterator<Item = (&'a str, f64)> + 'a {
    metrics.lines().filter_map(move |line| {
        let rest = line.strip_prefix(name)?;
        let (labels, value) = match rest.strip_prefix('{') {
            Some(r) => {
                let end = r.rfind('}')?;
                (&r[..end], r[end + 1..].trim())
            }
            None if rest.starts_with(' ') => ("", rest.trim()),
            None => return None,
        };
        let v = value.split_whitespace().next()?.parse::<f64>().ok()?;
        Some((labels, v))
    })
}

/// The API server's request counter at one moment.
#[derive(Clone, Debug, Default)]
pub struct ApiRequests {
    /// Every request.
    pub total: f64,
    /// By verb (`GET`, `APPLY`, …).
    pub by_verb: BTreeMap<String, f64>,
    /// By verb and resource (`APPLY kmssecrets/status`).
    pub by_request: BTreeMap<String, f64>,
    /// Bytes the API server's watches sent, by resource (every watcher).
    pub watch_bytes: BTreeMap<String, f64>,
    /// Events the API server's watches sent, by resource (every watcher).
    pub watch_events: BTreeMap<String, f64>,
}

impl ApiRequests {
    /// What was counted since `before`, leaving out what did not change.
    pub fn since(&self, before: &Self) -> Self {
        let diff = |now: &BTreeMap<String, f64>, then: &BTreeMap<String, f64>| {
            now.iter()
                .map(|(k, v)| (k.clone(), v - then.get(k).copied().unwrap_or(0.0)))
                .filter(|(_, v)| *v > 0.0)
                .collect()
        };
        Self {
            total: self.total - before.total,
            by_verb: diff(&self.by_verb, &before.by_verb),
            by_request: diff(&self.by_request, &before.by_request),
            watch_bytes: diff(&self.watch_bytes, &before.watch_bytes),
            watch_events: diff(&self.watch_events, &before.watch_events),
        }
    }
}

/// The value of label `name` in a Prometheus label set (`a="x",b="y"`).
fn label(labels: &str, name: &str) -> Option<String> {
    let pat = format!("{name}=\"");
    let mut search = labels;
    loop {
        let i = search.find(&pat)?;
        // Only a whole label name: at the start or after a comma.
        if i == 0 || search[..i].ends_with(',') {
            let rest = &search[i + pat.len()..];
            return Some(rest[..rest.find('"')?].to_owned());
        }
        search = &search[i + pat.len()..];
    }
}

/// KMS requests by kind, from the dev server's `/admin/stats` answer.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct KmsCounts {
    /// Logins (every `…/login` route).
    pub logins: u64,
    /// Secret reads: the v3 and v4 list routes and the single-secret read.
    pub fetches: u64,
    /// Of the fetches, those answered `304 Not Modified`.
    pub fetches_not_modified: u64,
    /// Every request.
    pub total: u64,
    /// Requests by route (`METHOD /template`), every status together.
    pub by_route: BTreeMap<String, u64>,
    /// Distinct folders read (a `200` or a `304`) since the counters were
    /// reset (the dev server's `foldersRead`).
    #[serde(default)]
    pub folders_read: u64,
}

impl KmsCounts {
    /// Group the counters of an `/admin/stats` answer.
    pub fn from_stats(stats: &Value) -> Self {
        let mut out = Self {
            folders_read: stats["foldersRead"].as_u64().unwrap_or(0),
            ..Self::default()
        };
        let Some(routes) = stats["requests"].as_object() else {
            return out;
        };
        for (route, by_status) in routes {
            let Some(m) = by_status.as_object() else {
                continue;
            };
            let n: u64 = m.values().filter_map(Value::as_u64).sum();
            let not_modified = m.get("304").and_then(Value::as_u64).unwrap_or(0);
            out.total += n;
            *out.by_route.entry(route.clone()).or_default() += n;
            if is_login(route) {
                out.logins += n;
            } else if is_fetch(route) {
                out.fetches += n;
                out.fetches_not_modified += not_modified;
            }
        }
        out
    }

    /// What `self` counted beyond `before` (counters only grow between
    /// resets).
    pub fn since(&self, before: &Self) -> Self {
        let by_route = self
            .by_route
            .iter()
            .map(|(k, v)| {
                let b = before.by_route.get(k).copied().unwrap_or(0);
                (k.clone(), v.saturating_sub(b))
            })
            .filter(|(_, v)| *v > 0)
            .collect();
        Self {
            logins: self.logins.saturating_sub(before.logins),
            fetches: self.fetches.saturating_sub(before.fetches),
            fetches_not_modified: self
                .fetches_not_modified
                .saturating_sub(before.fetches_not_modified),
            total: self.total.saturating_sub(before.total),
            by_route,
            // Distinct since the reset: not a counter to subtract.
            folders_read: self.folders_read,
        }
    }
}

fn is_login(route: &str) -> bool {
    route.starts_with("POST ") && route.ends_with("/login")
}

fn is_fetch(route: &str) -> bool {
    matches!(
        route,
        "GET /api/v3/secrets/raw" | "GET /api/v4/secrets" | "GET /api/v3/secrets/raw/:secretName"
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn percentiles_by_nearest_rank() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&v, 50.0), Some(50.0));
        assert_eq!(percentile(&v, 99.0), Some(99.0));
        assert_eq!(percentile(&v, 100.0), Some(100.0));
        assert_eq!(percentile(&v, 0.0), Some(1.0));
        assert_eq!(percentile(&[3.0, 1.0, 2.0], 50.0), Some(2.0));
        assert_eq!(percentile(&[7.0], 99.0), Some(7.0));
        assert_eq!(percentile(&[], 50.0), None);
        // p99 of ten values is the largest.
        let ten: Vec<f64> = (1..=10).map(f64::from).collect();
        assert_eq!(percentile(&ten, 99.0), Some(10.0));
    }

    #[test]
    fn summary_of_a_sample() {
        let s = Summary::of(&[2.0, 4.0, 9.0]);
        assert_eq!(s.n, 3);
        assert_eq!(s.p50, Some(4.0));
        assert_eq!(s.max, Some(9.0));
        assert_eq!(s.mean, Some(5.0));
        assert_eq!(Summary::of(&[]).p50, None);
    }

    #[test]
    fn apiserver_request_totals() {
        let text = "# HELP apiserver_request_total x\n# TYPE apiserver_request_total counter\n\
apiserver_request_total{code=\"200\",component=\"apiserver\",dry_run=\"\",group=\"\",resource=\"secrets\",scope=\"namespace\",subresource=\"\",verb=\"GET\",version=\"v1\"} 12\n\
apiserver_request_total{code=\"201\",component=\"apiserver\",resource=\"secrets\",verb=\"POST\"} 3\n\
apiserver_request_total{code=\"200\",resource=\"leases\",subverb=\"x\",verb=\"PUT\"} 1.5e1\n\
apiserver_request_duration_seconds_bucket{verb=\"GET\",le=\"0.1\"} 99\n\
apiserver_request_total_other 5\n\
apiserver_watch_events_sizes_bucket{group=\"\",kind=\"Secret\",version=\"v1\",le=\"1024\"} 3\n\
apiserver_watch_events_sizes_sum{group=\"\",kind=\"Secret\",version=\"v1\"} 2500\n\
apiserver_watch_events_sizes_sum{group=\"coordination.k8s.io\",resource=\"leases\",version=\"v1\"} 700\n\
apiserver_watch_events_sizes_count{group=\"\",kind=\"Secret\",version=\"v1\"} 4\n\
apiserver_watch_events_total{group=\"\",kind=\"Secret\",version=\"v1\"} 4\n";
        let counted = apiserver_requests(text);
        assert_eq!(counted.total, 30.0);
        assert_eq!(counted.by_verb["GET"], 12.0);
        assert_eq!(counted.by_verb["POST"], 3.0);
        assert_eq!(counted.by_verb["PUT"], 15.0);
        assert_eq!(counted.by_verb.len(), 3);
        assert_eq!(counted.by_request["GET secrets"], 12.0);
        assert_eq!(counted.by_request["PUT leases"], 15.0);
        assert_eq!(
            counted.watch_bytes,
            BTreeMap::from([("Secret".to_owned(), 2500.0), ("leases".to_owned(), 700.0)]),
            "sums only, by kind or resource"
        );
        assert_eq!(
            counted.watch_events,
            BTreeMap::from([("Secret".to_owned(), 4.0)])
        );
        let mut later = counted.clone();
        later.total += 2.0;
        *later.by_verb.get_mut("GET").unwrap() += 2.0;
        *later.by_request.get_mut("GET secrets").unwrap() += 2.0;
        let d = later.since(&counted);
        assert_eq!(d.total, 2.0);
        assert_eq!(d.by_verb.len(), 1);
        assert_eq!(d.by_request["GET secrets"], 2.0);
    }

    #[test]
    fn dev_server_stats_grouped() {
        let stats = json!({"requests": {
            "POST /api/v1/auth/universal-auth/login": {"200": 3, "429": 1},
            "GET /api/v3/secrets/raw": {"200": 10, "304": 40},
            "GET /api/v2/workspace/:slug": {"200": 2},
            "POST /api/v1/auth/token/renew": {"200": 1},
            "GET *": {"404": 1, "dropped": 1}
        }, "rateLimited": {}});
        let c = KmsCounts::from_stats(&stats);
        assert_eq!(c.logins, 4);
        assert_eq!(c.fetches, 50);
        assert_eq!(c.fetches_not_modified, 40);
        assert_eq!(c.total, 59);
        assert_eq!(c.by_route["GET /api/v2/workspace/:slug"], 2);
        assert_eq!(c.folders_read, 0, "an answer without foldersRead");
        let later = KmsCounts::from_stats(&json!({"foldersRead": 7, "requests": {
            "POST /api/v1/auth/universal-auth/login": {"200": 4, "429": 1},
            "GET /api/v3/secrets/raw": {"200": 10, "304": 45},
            "GET /api/v2/workspace/:slug": {"200": 2},
            "POST /api/v1/auth/token/renew": {"200": 1},
            "GET *": {"404": 1, "dropped": 1}
        }}));
        let d = later.since(&c);
        assert_eq!(
            (d.logins, d.fetches, d.fetches_not_modified, d.total),
            (1, 5, 5, 6)
        );
        assert_eq!(d.folders_read, 7, "distinct folders since the reset");
        assert_eq!(d.by_route.len(), 2);
        assert_eq!(KmsCounts::from_stats(&json!({})).total, 0);
    }
}
