//! Prometheus metrics of the operator (the table in `docs/metrics.md`).
//!
//! Every family is registered at start on a registry the caller owns, and
//! every known label combination is touched so series exist (at 0) from the
//! first scrape. Label values are bounded: controllers, shard numbers,
//! results, route templates and status codes — never names of objects.

use std::time::Duration;

use crate::api::kinds::KINDS;
use crate::kms::auth::LoginMethod;
use prometheus::{
    Encoder, Gauge, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec,
    Opts, Registry, TextEncoder,
};

/// Reconcile results, as metric label values.
pub const RESULTS: [&str; 3] = ["success", "error", "requeue"];
/// Workload kinds that can be reloaded.
pub const RELOAD_KINDS: [&str; 3] = ["Deployment", "StatefulSet", "DaemonSet"];
/// KMS routes other than the logins (those come from [`LoginMethod`]), as
/// metric label values.
pub const KMS_ENDPOINTS: [&str; 18] = [
    "POST /api/v1/auth/token/renew",
    "GET /api/v2/service-token",
    "POST /api/v1/events/subscribe/project-events",
    "GET /api/v3/secrets/raw",
    "GET /api/v3/secrets/raw/:secretName",
    "POST /api/v3/secrets/raw/:secretName",
    "PATCH /api/v3/secrets/raw/:secretName",
    "DELETE /api/v3/secrets/raw/:secretName",
    "POST /api/v3/secrets/batch/raw",
    "PATCH /api/v3/secrets/batch/raw",
    "DELETE /api/v3/secrets/batch/raw",
    "GET /api/v2/workspace/:slug",
    "GET /api/v1/workspace/:id",
    "GET /api/v1/folders",
    "POST /api/v1/folders",
    "POST /api/v1/dynamic-secrets/leases",
    "POST /api/v1/dynamic-secrets/leases/:leaseId/renew",
    "DELETE /api/v1/dynamic-secrets/leases/:leaseId",
];
/// Kinds whose objects may fail to decode (watched custom resources), as
/// metric label values: ours ([`KINDS`]) and this one.
const DECODED_KINDS_MORE: [&str; 1] = ["ClusterGenerator"];

/// Creates metrics and registers them. Registration only fails on
/// duplicate or invalid names, which are constants here: a failure is a
/// programming error, caught by the tests.
#[derive(Default)]
struct Registrar {
    registry: Registry,
}

impl Registrar {
    fn register<C: prometheus::core::Collector + Clone + 'static>(&self, c: C) -> C {
        self.registry
            .register(Box::new(c.clone()))
            .expect("metric registration");
        c
    }

    fn counter_vec(&self, name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
        self.register(IntCounterVec::new(Opts::new(name, help), labels).expect("metric"))
    }

    fn gauge_vec(&self, name: &str, help: &str, labels: &[&str]) -> IntGaugeVec {
        self.register(IntGaugeVec::new(Opts::new(name, help), labels).expect("metric"))
    }

    fn float_gauge_vec(&self, name: &str, help: &str, labels: &[&str]) -> prometheus::GaugeVec {
        self.register(prometheus::GaugeVec::new(Opts::new(name, help), labels).expect("metric"))
    }

    fn histogram_vec(
        &self,
        name: &str,
        help: &str,
        buckets: &[f64],
        labels: &[&str],
    ) -> HistogramVec {
        let opts = HistogramOpts::new(name, help).buckets(buckets.to_vec());
        self.register(HistogramVec::new(opts, labels).expect("metric"))
    }

    fn counter(&self, name: &str, help: &str) -> IntCounter {
        self.register(IntCounter::new(name, help).expect("metric"))
    }

    fn int_gauge(&self, name: &str, help: &str) -> IntGauge {
        self.register(IntGauge::new(name, help).expect("metric"))
    }

    fn gauge(&self, name: &str, help: &str) -> Gauge {
        self.register(Gauge::new(name, help).expect("metric"))
    }
}

/// All metric families of the operator.
#[derive(Clone)]
pub struct Metrics {
    registry: Registry,
    /// `controller_runtime_reconcile_total{controller,result,shard}`.
    pub reconcile_total: IntCounterVec,
    /// `controller_runtime_reconcile_errors_total{controller,shard}`.
    pub reconcile_errors: IntCounterVec,
    /// `controller_runtime_reconcile_time_seconds{controller,shard}`.
    pub reconcile_time: HistogramVec,
    /// `kms_operator_shard_owned{shard}`.
    pub shard_owned: IntGaugeVec,
    /// `kms_operator_shard_handovers_total{shard,direction}`.
    pub shard_handovers: IntCounterVec,
    /// `kms_operator_lease_renew_failures_total{shard}`.
    pub lease_renew_failures: IntCounterVec,
    /// `kms_operator_queue_depth{controller,shard}`.
    pub queue_depth: IntGaugeVec,
    /// `kms_operator_queue_oldest_seconds{controller,shard}`.
    pub queue_oldest: prometheus::GaugeVec,
    /// `kms_operator_managed_objects{controller,shard}`.
    pub managed_objects: IntGaugeVec,
    /// `kms_operator_cached_objects{kind,shard}`.
    pub cached_objects: IntGaugeVec,
    /// `kms_operator_kms_requests_total{endpoint,code}`.
    pub kms_requests: IntCounterVec,
    /// `kms_operator_kms_request_duration_seconds{endpoint}`.
    pub kms_request_duration: HistogramVec,
    /// `kms_operator_kms_logins_total{method}`.
    pub kms_logins: IntCounterVec,
    /// `kms_operator_kms_throttled_total`.
    pub kms_throttled: IntCounter,
    /// `kms_operator_kms_refused_served_total`.
    pub kms_refused_served: IntCounter,
    /// `kms_operator_kms_answer_waits_total`.
    pub kms_answer_waits: IntCounter,
    /// `kms_operator_kms_budget_rate`.
    pub kms_budget_rate: Gauge,
    /// `kms_operator_template_renders_stopped_total`.
    pub renders_stopped: IntCounter,
    /// `kms_operator_demand`.
    pub demand: Gauge,
    /// `kms_operator_worker_scale`.
    pub worker_scale: Gauge,
    /// `kms_operator_cache_hits_total{shard}`.
    pub cache_hits: IntCounterVec,
    /// `kms_operator_cache_misses_total{shard}`.
    pub cache_misses: IntCounterVec,
    /// `kms_operator_cache_errors_total{shard}`.
    pub cache_errors: IntCounterVec,
    /// `kms_operator_dynamic_leases{shard}`.
    pub dynamic_leases: IntGaugeVec,
    /// `kms_operator_reloads_total{kind}`.
    pub reloads: IntCounterVec,
    /// `kms_operator_undecodable_objects{kind}`.
    pub undecodable_objects: IntGaugeVec,
    /// `kms_operator_resource_ready{kind, resource_namespace, status, reason}`.
    pub resource_ready: IntGaugeVec,
    /// `kms_operator_resource_condition{kind, resource_namespace, name,
    /// status, reason}` (with `--metrics-per-resource`).
    pub resource_condition: IntGaugeVec,
    process_rss: IntGauge,
    process_cpu: Gauge,
    process_fds: IntGauge,
}

/// The status-code label of a KMS response (`304` is its own code;
/// transport failures are `error`).
pub fn code_label(status: Option<u16>) -> String {
    status.map_or_else(|| "error".to_owned(), |s| s.to_string())
}

/// The readiness families (`controllers::readiness`).
fn readiness_families(r: &Registrar) -> (IntGaugeVec, IntGaugeVec) {
    (
        r.gauge_vec(
            "kms_operator_resource_ready",
            "Resources this replica owns, by kind, namespace and the status and reason of \
             their Ready condition.",
            &["kind", "resource_namespace", "status", "reason"],
        ),
        r.gauge_vec(
            "kms_operator_resource_condition",
            "1 per resource this replica owns, with the status and reason of its Ready \
             condition (--metrics-per-resource only).",
            &["kind", "resource_namespace", "name", "status", "reason"],
        ),
    )
}

impl Metrics {
    /// Register every family on a new registry, with series for `shards`
    /// shards.
    pub fn new(shards: u32) -> Self {
        let r = Registrar::default();
        let (resource_ready, resource_condition) = readiness_families(&r);
        let m = Self {
            reconcile_total: r.counter_vec(
                "controller_runtime_reconcile_total",
                "Reconciles per controller, result and shard.",
                &["controller", "result", "shard"],
            ),
            reconcile_errors: r.counter_vec(
                "controller_runtime_reconcile_errors_total",
                "Failed reconciles per controller and shard.",
                &["controller", "shard"],
            ),
            reconcile_time: r.histogram_vec(
                "controller_runtime_reconcile_time_seconds",
                "Reconcile duration.",
                &[
                    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
                ],
                &["controller", "shard"],
            ),
            shard_owned: r.gauge_vec(
                "kms_operator_shard_owned",
                "1 if this replica owns the shard.",
                &["shard"],
            ),
            shard_handovers: r.counter_vec(
                "kms_operator_shard_handovers_total",
                "Shard ownership changes of this replica.",
                &["shard", "direction"],
            ),
            lease_renew_failures: r.counter_vec(
                "kms_operator_lease_renew_failures_total",
                "Failed renewals of shard Leases.",
                &["shard"],
            ),
            queue_depth: r.gauge_vec(
                "kms_operator_queue_depth",
                "Queued objects.",
                &["controller", "shard"],
            ),
            queue_oldest: r.float_gauge_vec(
                "kms_operator_queue_oldest_seconds",
                "Age of the oldest ready object in the queue.",
                &["controller", "shard"],
            ),
            managed_objects: r.gauge_vec(
                "kms_operator_managed_objects",
                "Resources owned by this replica.",
                &["controller", "shard"],
            ),
            cached_objects: r.gauge_vec(
                "kms_operator_cached_objects",
                "Objects in this replica's watch caches, by kind and shard (shard \"all\" \
                 with --watch-scope=cluster).",
                &["kind", "shard"],
            ),
            kms_requests: r.counter_vec(
                "kms_operator_kms_requests_total",
                "KMS HTTP requests by route template and status code.",
                &["endpoint", "code"],
            ),
            kms_request_duration: r.histogram_vec(
                "kms_operator_kms_request_duration_seconds",
                "KMS request latency.",
                &[
                    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0,
                ],
                &["endpoint"],
            ),
            kms_logins: r.counter_vec(
                "kms_operator_kms_logins_total",
                "KMS logins by method.",
                &["method"],
            ),
            kms_throttled: r.counter(
                "kms_operator_kms_throttled_total",
                "KMS requests delayed by the request budget or a 429.",
            ),
            kms_refused_served: r.counter(
                "kms_operator_kms_refused_served_total",
                "KMS reads refused by a 429 (or its pause) and served from the folder's latest answer this replica kept.",
            ),
            renders_stopped: r.counter(
                "kms_operator_template_renders_stopped_total",
                "Resources whose templates ran past --render-timeout and were stopped.",
            ),
            kms_answer_waits: r.counter(
                "kms_operator_kms_answer_waits_total",
                "KMS answers that waited for --kms-memory-budget (other answers held it).",
            ),
            kms_budget_rate: r.gauge(
                "kms_operator_kms_budget_rate",
                "KMS requests per second this replica may make now: its part of --kms-rate-limit, by the demand every replica publishes.",
            ),
            demand: r.gauge(
                "kms_operator_demand",
                "The demand this replica publishes: KMS work of its shards added as due, waiting or in progress.",
            ),
            worker_scale: r.gauge(
                "kms_operator_worker_scale",
                "The multiple of --workers each controller of this replica reconciles at once: its part of the replicas' demand (0.5 to 2; 1 with none).",
            ),
            cache_hits: r.counter_vec(
                "kms_operator_cache_hits_total",
                "Persistent cache hits.",
                &["shard"],
            ),
            cache_misses: r.counter_vec(
                "kms_operator_cache_misses_total",
                "Persistent cache misses.",
                &["shard"],
            ),
            cache_errors: r.counter_vec(
                "kms_operator_cache_errors_total",
                "Persistent cache records that could not be read or written.",
                &["shard"],
            ),
            dynamic_leases: r.gauge_vec(
                "kms_operator_dynamic_leases",
                "Active dynamic-secret leases held.",
                &["shard"],
            ),
            reloads: r.counter_vec(
                "kms_operator_reloads_total",
                "Workload rollouts triggered.",
                &["kind"],
            ),
            undecodable_objects: r.gauge_vec(
                "kms_operator_undecodable_objects",
                "Watched objects skipped because this version cannot decode them.",
                &["kind"],
            ),
            resource_ready,
            resource_condition,
            process_rss: r.int_gauge(
                "process_resident_memory_bytes",
                "Resident memory size in bytes.",
            ),
            process_cpu: r.gauge(
                "process_cpu_seconds_total",
                "User and system CPU time in seconds.",
            ),
            process_fds: r.int_gauge("process_open_fds", "Open file descriptors."),
            registry: r.registry,
        };
        m.touch_known_series(shards);
        m
    }

    fn touch_known_series(&self, shards: u32) {
        // Until the first share: `--workers` as configured.
        self.worker_scale.set(1.0);
        for shard in 0..shards {
            let s = shard.to_string();
            let s = s.as_str();
            for c in KINDS.iter().map(|k| k.controller) {
                for r in RESULTS {
                    self.reconcile_total.with_label_values(&[c, r, s]);
                }
                self.reconcile_errors.with_label_values(&[c, s]);
                self.reconcile_time.with_label_values(&[c, s]);
                self.queue_depth.with_label_values(&[c, s]);
                self.queue_oldest.with_label_values(&[c, s]);
                self.managed_objects.with_label_values(&[c, s]);
            }
            self.shard_owned.with_label_values(&[s]);
            for d in ["gained", "lost"] {
                self.shard_handovers.with_label_values(&[s, d]);
            }
            self.lease_renew_failures.with_label_values(&[s]);
            self.cache_hits.with_label_values(&[s]);
            self.cache_misses.with_label_values(&[s]);
            self.cache_errors.with_label_values(&[s]);
            self.dynamic_leases.with_label_values(&[s]);
        }
        let logins = LoginMethod::ALL
            .iter()
            .filter_map(|m| m.route().map(|r| r.0));
        for e in KMS_ENDPOINTS.into_iter().chain(logins) {
            self.kms_request_duration.with_label_values(&[e]);
        }
        for m in LoginMethod::ALL {
            self.kms_logins.with_label_values(&[m.label()]);
        }
        for k in RELOAD_KINDS {
            self.reloads.with_label_values(&[k]);
        }
        for k in KINDS.iter().map(|k| k.kind).chain(DECODED_KINDS_MORE) {
            self.undecodable_objects.with_label_values(&[k]);
        }
    }

    /// Record one KMS request.
    pub fn kms_request(&self, endpoint: &'static str, status: Option<u16>, elapsed: Duration) {
        self.kms_requests
            .with_label_values(&[endpoint, &code_label(status)])
            .inc();
        self.kms_request_duration
            .with_label_values(&[endpoint])
            .observe(elapsed.as_secs_f64());
    }

    /// Record one reconcile.
    pub fn reconcile(&self, controller: &str, shard: u32, result: &str, elapsed: Duration) {
        let s = shard.to_string();
        self.reconcile_total
            .with_label_values(&[controller, result, &s])
            .inc();
        if result == "error" {
            self.reconcile_errors
                .with_label_values(&[controller, &s])
                .inc();
        }
        self.reconcile_time
            .with_label_values(&[controller, &s])
            .observe(elapsed.as_secs_f64());
    }

    /// Refresh the process gauges from `/proc/self`.
    pub fn refresh_process(&self) {
        if let Ok(statm) = std::fs::read_to_string("/proc/self/statm")
            && let Some(rss_pages) = statm
                .split_whitespace()
                .nth(1)
                .and_then(|v| v.parse::<i64>().ok())
        {
            self.process_rss.set(rss_pages * 4096);
        }
        if let Ok(stat) = std::fs::read_to_string("/proc/self/stat") {
            // Fields after the command name: utime and stime are the 12th and
            // 13th (in clock ticks, 100 per second on Linux).
            if let Some(rest) = stat.rsplit_once(')').map(|(_, r)| r) {
                let f: Vec<&str> = rest.split_whitespace().collect();
                if let (Some(u), Some(s)) = (f.get(11), f.get(12)) {
                    let ticks = u.parse::<f64>().unwrap_or(0.0) + s.parse::<f64>().unwrap_or(0.0);
                    self.process_cpu.set(ticks / 100.0);
                }
            }
        }
        if let Ok(dir) = std::fs::read_dir("/proc/self/fd") {
            self.process_fds
                .set(i64::try_from(dir.count()).unwrap_or(i64::MAX));
        }
    }

    /// The registry, for tests that read values.
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// The text exposition of every family.
    pub fn encode(&self) -> String {
        self.refresh_process();
        let mut buf = Vec::new();
        let encoder = TextEncoder::new();
        if encoder.encode(&self.registry.gather(), &mut buf).is_err() {
            return String::new();
        }
        String::from_utf8(buf).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_family_of_the_spec_is_exposed_from_the_start() {
        let m = Metrics::new(4);
        let text = m.encode();
        for name in [
            "controller_runtime_reconcile_total",
            "controller_runtime_reconcile_errors_total",
            "controller_runtime_reconcile_time_seconds",
            "kms_operator_shard_owned",
            "kms_operator_shard_handovers_total",
            "kms_operator_lease_renew_failures_total",
            "kms_operator_queue_depth",
            "kms_operator_queue_oldest_seconds",
            "kms_operator_managed_objects",
            "kms_operator_kms_request_duration_seconds",
            "kms_operator_kms_logins_total",
            "kms_operator_kms_throttled_total",
            "kms_operator_kms_refused_served_total",
            "kms_operator_kms_answer_waits_total",
            "kms_operator_kms_budget_rate",
            "kms_operator_template_renders_stopped_total",
            "kms_operator_demand",
            "kms_operator_worker_scale",
            "kms_operator_cache_hits_total",
            "kms_operator_cache_misses_total",
            "kms_operator_cache_errors_total",
            "kms_operator_dynamic_leases",
            "kms_operator_reloads_total",
            "process_resident_memory_bytes",
            "process_cpu_seconds_total",
            "process_open_fds",
        ] {
            assert!(text.contains(&format!("# TYPE {name} ")), "{name} missing");
        }
        assert!(text.contains(r#"controller_runtime_reconcile_total{controller="kmssecret",result="success",shard="3"} 0"#));
        assert!(text.contains(r#"kms_operator_shard_owned{shard="0"} 0"#));
        // Every login method and its route, cloud ones included.
        for m in LoginMethod::ALL {
            let label = m.label();
            assert!(
                text.contains(&format!(
                    r#"kms_operator_kms_logins_total{{method="{label}"}} 0"#
                )),
                "{label}"
            );
            if let Some((route, _)) = m.route() {
                assert!(text.contains(&format!(r#"endpoint="{route}""#)), "{route}");
            }
        }
    }

    #[test]
    fn kms_requests_count_304_on_its_own() {
        let m = Metrics::new(1);
        m.kms_request(
            "GET /api/v3/secrets/raw",
            Some(304),
            Duration::from_millis(3),
        );
        m.kms_request("GET /api/v3/secrets/raw", None, Duration::from_millis(3));
        let text = m.encode();
        assert!(text.contains(
            r#"kms_operator_kms_requests_total{code="304",endpoint="GET /api/v3/secrets/raw"} 1"#
        ));
        assert!(text.contains(
            r#"kms_operator_kms_requests_total{code="error",endpoint="GET /api/v3/secrets/raw"} 1"#
        ));
    }
}
