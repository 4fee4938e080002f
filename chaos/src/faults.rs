//! Carrying out the schedule: the process track (signals, restarts, cache
//! damage, scaling, control-plane restarts) runs on a thread of its own, the
//! KMS track (the dev server's fault injection) as a task; each step is
//! recorded with its times and target.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::Serialize;
use serde_json::json;

use crate::cluster::ControlPlane;
use crate::history::{History, Ms, Pause, Window, now_ms};
use crate::kms::DevServer;
use crate::replicas::Fleet;
use crate::rng::Rng;
use crate::scenario::{FaultKind, Track};
use crate::schedule::Step;

/// One fault as it happened.
#[derive(Clone, Debug, Serialize)]
pub struct FaultRecord {
    /// Its track.
    pub track: Track,
    /// Position in the track.
    pub index: usize,
    /// The fault.
    pub kind: FaultKind,
    /// The replica it hit, if any.
    pub target: Option<String>,
    /// Injected at.
    pub from: Ms,
    /// Over at.
    pub to: Ms,
    /// Parameters and observations.
    pub detail: String,
    /// Why it was not injected, if it was not.
    pub skipped: Option<String>,
}

/// What the process track works with.
pub struct ProcessTrack {
    /// The replicas (processes, or pods on a node).
    pub replicas: Box<dyn Fleet>,
    /// The control plane.
    pub control_plane: Arc<ControlPlane>,
    /// The run's history (pauses and control-plane windows go there).
    pub history: Arc<Mutex<History>>,
    /// `--lease-duration`.
    pub lease_duration: Duration,
    /// Graceful stop durations observed (SIGTERM → exit).
    pub graceful_stops: Vec<Duration>,
    /// Replicas that exited without being told to, and were restarted.
    pub unexpected_exits: Vec<String>,
}

fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd.flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}

/// Damage the files of a cache directory: random bytes written over part
/// of each file, every other file truncated to half. Returns what was done.
pub fn corrupt(dir: &Path, seed: u64) -> String {
    use std::io::{Seek, SeekFrom, Write};
    let mut rng = Rng::new(seed);
    let files = files_under(dir);
    let mut touched = 0;
    for (i, f) in files.iter().enumerate() {
        let Ok(len) = std::fs::metadata(f).map(|m| m.len()) else {
            continue;
        };
        if len == 0 {
            continue;
        }
        let Ok(mut file) = std::fs::OpenOptions::new().write(true).open(f) else {
            continue;
        };
        let n = len.min(4096);
        let at = rng.below(len - n + 1);
        let junk: Vec<u8> = (0..n).map(|_| rng.next_u64() as u8).collect();
        if file.seek(SeekFrom::Start(at)).is_ok() && file.write_all(&junk).is_ok() {
            touched += 1;
        }
        if i % 2 == 1 {
            let _ = file.set_len(len / 2);
        }
    }
    format!(
        "{touched} of {} cache files overwritten, every other one truncated",
        files.len()
    )
}

impl ProcessTrack {
    fn pick(&self, step: &Step) -> Result<String, String> {
        let live = self.replicas.live();
        if step.kind.takes_a_replica_out() && live.len() < 2 {
            return Err(format!("only {} replica(s) running", live.len()));
        }
        live.get((step.pick % live.len().max(1) as u64) as usize)
            .cloned()
            .ok_or_else(|| "no replica running".to_owned())
    }

    fn restart(&mut self, name: &str) -> String {
        match self.replicas.restart(name) {
            Ok(()) => String::new(),
            Err(e) => format!("; restart failed: {e}"),
        }
    }

    fn stop_gracefully(&mut self, name: &str) -> String {
        let took = self.replicas.terminate(name, Duration::from_secs(30));
        self.stopped(took)
    }

    fn stopped(&mut self, took: Option<Duration>) -> String {
        match took {
            Some(d) => {
                self.graceful_stops.push(d);
                format!("stopped in {} ms", d.as_millis())
            }
            None => "did not stop within 30 s: killed".to_owned(),
        }
    }

    /// Restart replicas that exited on their own.
    pub fn check_exits(&mut self) {
        for (name, what) in self.replicas.exited() {
            self.unexpected_exits.push(format!("{} {what}", now_ms()));
            let _ = self.replicas.restart(&name);
        }
    }

    /// Carry out one step (blocking).
    pub fn step(&mut self, step: &Step) -> FaultRecord {
        let mut rec = FaultRecord {
            track: Track::Process,
            index: step.index,
            kind: step.kind,
            target: None,
            from: now_ms(),
            to: 0,
            detail: String::new(),
            skipped: None,
        };
        let target = match step.kind {
            FaultKind::ApiserverRestart | FaultKind::EtcdRestart | FaultKind::ScaleUp => None,
            _ => match self.pick(step) {
                Ok(t) => Some(t),
                Err(why) => {
                    rec.skipped = Some(why);
                    rec.to = now_ms();
                    return rec;
                }
            },
        };
        rec.target = target.clone();
        let t = target.unwrap_or_default();
        match step.kind {
            FaultKind::Kill => {
                self.replicas.kill(&t);
                std::thread::sleep(step.hold);
                rec.detail = format!("down {} ms{}", step.hold.as_millis(), self.restart(&t));
            }
            FaultKind::Term => {
                let how = self.stop_gracefully(&t);
                std::thread::sleep(step.hold);
                rec.detail = format!(
                    "{how}; down {} ms{}",
                    step.hold.as_millis(),
                    self.restart(&t)
                );
            }
            FaultKind::Pause => {
                let from = now_ms();
                self.replicas.pause(&t);
                std::thread::sleep(self.lease_duration + step.hold);
                self.replicas.resume(&t);
                let to = now_ms();
                self.history
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .pauses
                    .push(Pause {
                        replica: t.clone(),
                        from,
                        to,
                    });
                rec.detail = format!("stopped {} ms", to - from);
            }
            FaultKind::ApiserverRestart | FaultKind::EtcdRestart => {
                let component = if step.kind == FaultKind::EtcdRestart {
                    "etcd"
                } else {
                    "apiserver"
                };
                if !self.control_plane.restartable() {
                    rec.skipped = Some("the control plane is not a local testenv".into());
                } else {
                    let from = now_ms();
                    let result = self.control_plane.restart(component);
                    let to = now_ms();
                    self.history
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .control_plane
                        .push(Window { from, to });
                    rec.detail = match result {
                        Ok(d) => format!("{component} back after {} ms", d.as_millis()),
                        Err(e) => format!("{component} restart failed: {e}"),
                    };
                }
            }
            FaultKind::CacheDelete => {
                let how = self.stop_gracefully(&t);
                let what = self.replicas.delete_cache(&t);
                std::thread::sleep(step.hold);
                rec.detail = format!("{how}; {what}{}", self.restart(&t));
            }
            FaultKind::CacheCorrupt => {
                // Stopped first, so nothing writes the cache while it is
                // damaged; then killed, and restarted on the damage.
                self.replicas.pause(&t);
                let what = self
                    .replicas
                    .cache_dir(&t)
                    .map(|d| corrupt(&d, step.param))
                    .unwrap_or_default();
                self.replicas.kill(&t);
                std::thread::sleep(step.hold);
                rec.detail = format!("{what}{}", self.restart(&t));
            }
            FaultKind::ScaleUp => match self.replicas.scale_up() {
                Ok(name) => {
                    rec.target = Some(name);
                    rec.detail = format!("{} replicas now", self.replicas.live().len());
                }
                Err(e) => rec.detail = format!("scale-up failed: {e}"),
            },
            FaultKind::ScaleDown => {
                let (name, took) = self.replicas.scale_down(&t, Duration::from_secs(30));
                rec.target = Some(name);
                let how = self.stopped(took);
                rec.detail = format!("{how}; {} replicas now", self.replicas.live().len());
            }
            other => rec.skipped = Some(format!("{other} is not a process fault")),
        }
        rec.to = now_ms();
        rec
    }

    /// Run the whole track (blocking), stopping early when `stop` is set.
    pub fn run(&mut self, steps: &[Step], stop: &AtomicBool) -> Vec<FaultRecord> {
        let mut out = Vec::new();
        for s in steps {
            if sleep_unless(s.gap_before, stop) {
                break;
            }
            self.check_exits();
            let rec = self.step(s);
            eprintln!(
                "kms-chaos: [{}] {}{} {}{}",
                s.index,
                s.kind,
                rec.target
                    .as_deref()
                    .map(|t| format!(" {t}"))
                    .unwrap_or_default(),
                rec.detail,
                rec.skipped
                    .as_deref()
                    .map(|w| format!(" (skipped: {w})"))
                    .unwrap_or_default()
            );
            out.push(rec);
        }
        self.check_exits();
        out
    }
}

fn sleep_unless(d: Duration, stop: &AtomicBool) -> bool {
    let end = std::time::Instant::now() + d;
    while std::time::Instant::now() < end {
        if stop.load(Ordering::SeqCst) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(100).min(end - std::time::Instant::now()));
    }
    stop.load(Ordering::SeqCst)
}

/// The admin fault body of a KMS step.
pub fn kms_fault(step: &Step) -> serde_json::Value {
    let p = step.param;
    match step.kind {
        FaultKind::KmsOutage => json!({"outage": true}),
        FaultKind::KmsLatency => json!({"latencyMs": 300 + p % 2701}),
        FaultKind::Kms429 => json!({"rateLimitPerMinute": 20 + p % 41}),
        FaultKind::Kms5xx => {
            let status = [500, 502, 503][((p >> 8) % 3) as usize];
            json!({
                "errorRate": 0.3 + (p % 51) as f64 / 100.0,
                "status": status,
                "seed": p % 1_000_000
            })
        }
        FaultKind::KmsDrop if p.is_multiple_of(2) => json!({"dropConnections": true}),
        FaultKind::KmsDrop => json!({"route": "GET /api/v3/secrets/raw", "dropConnections": true}),
        _ => json!({}),
    }
}

/// Run the KMS track, stopping early when `stop` is set.
pub async fn run_kms_track(steps: &[Step], kms: &DevServer, stop: &AtomicBool) -> Vec<FaultRecord> {
    let mut out = Vec::new();
    for s in steps {
        if stop.load(Ordering::SeqCst) {
            break;
        }
        tokio::time::sleep(s.gap_before).await;
        let body = kms_fault(s);
        let from = now_ms();
        let set = kms.fault(body.clone()).await;
        tokio::time::sleep(s.hold).await;
        let cleared = kms.clear_faults().await;
        let rec = FaultRecord {
            track: Track::Kms,
            index: s.index,
            kind: s.kind,
            target: None,
            from,
            to: now_ms(),
            detail: format!("{body} for {} ms", s.hold.as_millis()),
            skipped: match (set, cleared) {
                (Err(e), _) => Some(format!("could not set: {e}")),
                (_, Err(e)) => Some(format!("could not clear: {e}")),
                _ => None,
            },
        };
        eprintln!("kms-chaos: [kms {}] {} {}", s.index, s.kind, rec.detail);
        out.push(rec);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn corruption_overwrites_and_truncates() {
        let dir = std::env::temp_dir().join(format!("kms-chaos-corrupt-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("sub")).unwrap();
        std::fs::write(dir.join("a"), vec![0u8; 10_000]).unwrap();
        std::fs::write(dir.join("sub/b"), vec![0u8; 100]).unwrap();
        let what = corrupt(&dir, 9);
        assert!(what.starts_with("2 of 2"), "{what}");
        let a = std::fs::read(dir.join("a")).unwrap();
        assert!(a.iter().any(|&b| b != 0));
        assert_eq!(std::fs::metadata(dir.join("sub/b")).unwrap().len(), 50);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn kms_faults_are_valid_admin_bodies() {
        let step = |kind, param| Step {
            index: 0,
            track: Track::Kms,
            kind,
            gap_before: Duration::ZERO,
            hold: Duration::ZERO,
            pick: 0,
            param,
        };
        assert_eq!(kms_fault(&step(FaultKind::KmsOutage, 1))["outage"], true);
        let e = kms_fault(&step(FaultKind::Kms5xx, 12345));
        let rate = e["errorRate"].as_f64().unwrap();
        assert!((0.3..=0.8).contains(&rate));
        assert!([500, 502, 503].contains(&e["status"].as_u64().unwrap()));
        let l = kms_fault(&step(FaultKind::KmsLatency, 99_999))["latencyMs"]
            .as_u64()
            .unwrap();
        assert!((300..=3000).contains(&l));
        assert!(kms_fault(&step(FaultKind::KmsDrop, 3))["route"].is_string());
    }
}
