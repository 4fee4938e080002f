//! Coordinators against a real API server: several replicas in one process,
//! each with its own identity, sharing the Leases of one namespace.
//!
//! Durations are short (Lease 3 s, renew deadline 2 s, retry 1 s). Every test
//! runs a [`support::Monitor`] that fails it if two coordinators ever own the
//! same shard at once, or if a Lease passes straight from one holder to
//! another before it was left unchanged for the Lease duration.

mod support;

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;
use shard::{Config, Coordinator, Event, LossReason};
use support::{Monitor, balanced, config, owned, owners, wait_until};
use tokio::time::Instant;

const S: u32 = 16;

/// What the drain hook saw for a shard: (shard, token cancelled and not owned,
/// holder in the Lease at that moment).
type DrainSeen = (u32, bool, Option<String>);
const LEASE: Duration = Duration::from_secs(3);
const RETRY: Duration = Duration::from_secs(1);

async fn start(client: &kube::Client, monitor: &Monitor, ns: &str, identity: &str) -> Coordinator {
    let c = Coordinator::start(client.clone(), config(ns, identity, S)).expect("start");
    monitor.add(&c);
    c
}

async fn settle(monitor: &Monitor, what: &str) {
    let ok = wait_until(Duration::from_secs(8), || balanced(&monitor.list(), S)).await;
    assert!(ok, "{what}: not balanced: {:?}", owners(&monitor.list(), S));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_replicas_share_all_shards_and_stop_cleanly() {
    let client = support::client().await;
    let ns = support::namespace(&client, "shard-balance").await;
    let monitor = Monitor::start(&client, &ns, S);
    let began = Instant::now();
    let mut cs = Vec::new();
    for id in ["kms-0", "kms-1", "kms-2"] {
        cs.push(start(&client, &monitor, &ns, id).await);
    }
    settle(&monitor, "three replicas").await;
    eprintln!("three replicas balanced after {:?}", began.elapsed());
    let mut counts: Vec<usize> = cs.iter().map(|c| owned(c).len()).collect();
    counts.sort_unstable();
    assert_eq!(counts, vec![5, 5, 6]);

    // Every replica sees the same members, assignment and holders.
    let ok = wait_until(Duration::from_secs(3), || {
        cs.iter().all(|c| {
            let v = c.view();
            v.synced
                && v.members == ["kms-0", "kms-1", "kms-2"]
                && v.mismatches.is_empty()
                && v.status
                    .values()
                    .all(|s| s.holder.is_some() && s.holder == s.assigned)
        })
    })
    .await;
    assert!(
        ok,
        "views disagree: {:#?}",
        cs.iter().map(|c| c.view()).collect::<Vec<_>>()
    );
    assert!(cs.iter().all(|c| c.members() == 3));
    for c in &cs {
        let mut sub = c.subscribe();
        assert_eq!(*sub.borrow_and_update(), owned(c));
        let v = c.view();
        assert_eq!(v.owned, owned(c));
    }
    // The ring answers alike everywhere.
    assert!(
        cs.iter()
            .all(|c| c.shard_of("team-a") == cs[0].shard_of("team-a"))
    );

    for c in &cs {
        c.shutdown().await;
        assert!(c.is_stopped());
        assert!(owned(c).is_empty());
    }
    let api: Api<Lease> = Api::namespaced(client.clone(), &ns);
    let leases = api.list(&Default::default()).await.expect("list");
    let names: Vec<String> = leases
        .items
        .iter()
        .filter_map(|l| l.metadata.name.clone())
        .collect();
    assert!(
        !names.iter().any(|n| n.contains("-member-")),
        "member Leases left: {names:?}"
    );
    let shard_leases: Vec<&Lease> = leases
        .items
        .iter()
        .filter(|l| {
            l.metadata
                .name
                .as_deref()
                .is_some_and(|n| n.contains("-shard-"))
        })
        .collect();
    assert_eq!(shard_leases.len(), S as usize);
    for l in shard_leases {
        assert_eq!(
            shard::lease::holder(l),
            None,
            "{:?} still held",
            l.metadata.name
        );
    }
    monitor.finish(LEASE).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn graceful_shutdown_hands_over_in_order_within_a_second() {
    let client = support::client().await;
    let ns = support::namespace(&client, "shard-graceful").await;
    let monitor = Monitor::start(&client, &ns, S);
    let a = start(&client, &monitor, &ns, "kms-0").await;
    let b = start(&client, &monitor, &ns, "kms-1").await;
    let c = start(&client, &monitor, &ns, "kms-2").await;
    settle(&monitor, "three replicas").await;

    // The drain hook records, per shard: was the token already cancelled and
    // `owns` false, and did the Lease still name us (not cleared yet)?
    let seen: Arc<Mutex<Vec<DrainSeen>>> = Arc::default();
    let tokens: Vec<(u32, tokio_util::sync::CancellationToken)> = owned(&c)
        .into_iter()
        .map(|s| (s, c.cancellation(s)))
        .collect();
    {
        let seen = seen.clone();
        let api: Api<Lease> = Api::namespaced(client.clone(), &ns);
        let handle = c.clone();
        c.set_drain_hook(move |shard| {
            let seen = seen.clone();
            let api = api.clone();
            let handle = handle.clone();
            async move {
                let stopped = !handle.owns(shard) && handle.cancellation(shard).is_cancelled();
                let holder = api
                    .get(&shard::shard_lease_name("kms-test", shard))
                    .await
                    .ok()
                    .and_then(|l| shard::lease::holder(&l).map(str::to_owned));
                if let Ok(mut s) = seen.lock() {
                    s.push((shard, stopped, holder));
                }
            }
        });
    }
    let mut events = c.events();
    let theirs = owned(&c);
    assert!(!theirs.is_empty());

    let t0 = Instant::now();
    c.shutdown().await;
    let stopped_in = t0.elapsed();
    let ok = wait_until(Duration::from_secs(3), || {
        theirs.iter().all(|&s| a.owns(s) || b.owns(s))
    })
    .await;
    let handed_over_in = t0.elapsed();
    assert!(
        ok,
        "shards of the stopped replica not taken: {:?}",
        owners(&[a.clone(), b.clone()], S)
    );
    eprintln!("shutdown took {stopped_in:?}; shards owned by the others after {handed_over_in:?}");
    assert!(
        handed_over_in < Duration::from_millis(1000),
        "hand-over took {handed_over_in:?}"
    );

    // Order: token cancelled → drain (Lease still ours) → Lease cleared.
    let mut seen = seen.lock().map(|s| s.clone()).unwrap_or_default();
    seen.sort();
    assert_eq!(seen.iter().map(|s| s.0).collect::<Vec<_>>(), theirs);
    for (shard, stopped, holder) in &seen {
        assert!(*stopped, "shard {shard}: drained while still owned");
        assert_eq!(
            holder.as_deref(),
            Some("kms-2"),
            "shard {shard}: Lease cleared before the drain"
        );
    }
    assert!(tokens.iter().all(|(_, t)| t.is_cancelled()));
    let mut lost = BTreeSet::new();
    let mut released = BTreeSet::new();
    while let Ok(e) = events.try_recv() {
        match e {
            Event::Lost { shard, reason } => {
                assert_eq!(reason, LossReason::Shutdown);
                assert!(!released.contains(&shard), "released before lost");
                lost.insert(shard);
            }
            Event::Released(shard) => {
                released.insert(shard);
            }
            _ => {}
        }
    }
    let theirs_set: BTreeSet<u32> = theirs.iter().copied().collect();
    assert_eq!(lost, theirs_set);
    assert_eq!(released, theirs_set);

    // The member Lease is gone; the remaining two rebalance to 8/8.
    let api: Api<Lease> = Api::namespaced(client.clone(), &ns);
    assert!(
        api.get_opt("kms-test-member-kms-2")
            .await
            .expect("get")
            .is_none()
    );
    monitor
        .coordinators
        .lock()
        .expect("list")
        .retain(|x| x.config().identity != "kms-2");
    settle(&monitor, "after the stop").await;
    a.shutdown().await;
    b.shutdown().await;
    monitor.finish(LEASE).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crashed_replica_is_replaced_after_expiry_and_gets_its_shards_back() {
    let client = support::client().await;
    let ns = support::namespace(&client, "shard-crash").await;
    let monitor = Monitor::start(&client, &ns, S);
    let a = start(&client, &monitor, &ns, "kms-0").await;
    let b = start(&client, &monitor, &ns, "kms-1").await;
    let c = start(&client, &monitor, &ns, "kms-2").await;
    settle(&monitor, "three replicas").await;
    let before = owned(&c);
    assert!(!before.is_empty());

    // Crash: the tasks end, nothing is released.
    let t0 = Instant::now();
    c.abort();
    assert!(owned(&c).is_empty());
    assert!(before.iter().all(|&s| c.cancellation(s).is_cancelled()));
    let ok = wait_until(Duration::from_secs(8), || {
        before.iter().all(|&s| a.owns(s) || b.owns(s))
    })
    .await;
    let took = t0.elapsed();
    assert!(
        ok,
        "not taken over: {:?}",
        owners(&[a.clone(), b.clone()], S)
    );
    eprintln!("crashed replica's shards taken over after {took:?}");
    // Not before the Lease could have expired (its last renewal was at most
    // one retry period before the crash), and within duration + retry + 1 s.
    assert!(
        took + RETRY + Duration::from_millis(200) >= LEASE,
        "taken over too early: {took:?}"
    );
    assert!(
        took <= LEASE + RETRY + Duration::from_secs(1),
        "taken over too late: {took:?}"
    );
    monitor
        .coordinators
        .lock()
        .expect("list")
        .retain(|x| x.config().identity != "kms-2");
    settle(&monitor, "two replicas").await;

    // Restarted under the same name: the same shards come back.
    let c2 = start(&client, &monitor, &ns, "kms-2").await;
    settle(&monitor, "restarted").await;
    assert_eq!(owned(&c2), before, "the restarted replica got other shards");

    for x in [&a, &b, &c2] {
        x.shutdown().await;
    }
    monitor.finish(LEASE).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn different_shard_counts_refuse_to_share() {
    let client = support::client().await;
    let ns = support::namespace(&client, "shard-mismatch").await;
    let monitor = Monitor::start(&client, &ns, S);
    let a = start(&client, &monitor, &ns, "kms-0").await;
    assert!(wait_until(Duration::from_secs(5), || owned(&a).len() == S as usize).await);
    let mut a_events = a.events();

    // The second replica runs with 8 shards.
    let b = Coordinator::start(client.clone(), config(&ns, "kms-1", 8)).expect("start");
    let mut b_events = b.events();
    let ok = wait_until(Duration::from_secs(5), || {
        !b.view().mismatches.is_empty() && !a.view().mismatches.is_empty()
    })
    .await;
    assert!(ok, "mismatch not reported: {:?} / {:?}", a.view(), b.view());
    let bm = &b.view().mismatches[0];
    assert_eq!(
        (bm.member.as_str(), bm.shards, bm.our_shards),
        ("kms-0", Some(16), 8)
    );
    let message = bm.to_string();
    assert!(
        message.contains("kms-0") && message.contains("16") && message.contains('8'),
        "{message}"
    );
    let am = &a.view().mismatches[0];
    assert_eq!(
        (am.member.as_str(), am.shards, am.our_shards),
        ("kms-1", Some(8), 16)
    );

    // Give them time: the second acquires nothing, the first keeps everything.
    tokio::time::sleep(LEASE).await;
    assert!(
        (0..8).all(|s| !b.owns(s)),
        "the mismatched replica acquired shards"
    );
    assert_eq!(
        owned(&a).len(),
        S as usize,
        "the first replica gave shards away"
    );
    let got = |rx: &mut tokio::sync::broadcast::Receiver<Event>| {
        std::iter::from_fn(|| rx.try_recv().ok()).collect::<Vec<_>>()
    };
    let b_seen = got(&mut b_events);
    assert!(
        b_seen
            .iter()
            .any(|e| matches!(e, Event::ConfigMismatch(m) if m.member == "kms-0")),
        "{b_seen:?}"
    );
    assert!(!b_seen.iter().any(|e| matches!(e, Event::Gained(_))));
    let a_seen = got(&mut a_events);
    assert!(
        a_seen
            .iter()
            .any(|e| matches!(e, Event::ConfigMismatch(m) if m.member == "kms-1"))
    );

    // When the odd one leaves, the first replica reports agreement again.
    b.shutdown().await;
    let ok = wait_until(Duration::from_secs(3), || a.view().mismatches.is_empty()).await;
    assert!(ok);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(got(&mut a_events).contains(&Event::ConfigAgreed));
    assert_eq!(owned(&a).len(), S as usize);
    a.shutdown().await;
    monitor.finish(LEASE).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scale_up_and_down_keeps_every_shard_covered() {
    let client = support::client().await;
    let ns = support::namespace(&client, "shard-scale").await;
    let monitor = Monitor::start(&client, &ns, S);
    let a = start(&client, &monitor, &ns, "kms-0").await;
    settle(&monitor, "one replica").await;
    // Scale 1 → 3 → 1 and check coverage gaps: every shard owned by someone
    // at every 20 ms sample, except during hand-overs, which must be short.
    let covered = Arc::new(Mutex::new(Vec::<Duration>::new()));
    let probe = {
        let list = monitor.coordinators.clone();
        let covered = covered.clone();
        tokio::spawn(async move {
            let mut uncovered_since: Vec<Option<Instant>> = vec![None; S as usize];
            loop {
                let cs: Vec<Coordinator> = list.lock().map(|l| l.clone()).unwrap_or_default();
                let now = Instant::now();
                for s in 0..S {
                    let owned = cs.iter().any(|c| c.owns(s));
                    let slot = &mut uncovered_since[s as usize];
                    match (owned, *slot) {
                        (false, None) => *slot = Some(now),
                        (true, Some(since)) => {
                            if let Ok(mut c) = covered.lock() {
                                c.push(now - since);
                            }
                            *slot = None;
                        }
                        _ => {}
                    }
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
    };
    let b = start(&client, &monitor, &ns, "kms-1").await;
    let c = start(&client, &monitor, &ns, "kms-2").await;
    settle(&monitor, "scaled to three").await;
    for x in [&b, &c] {
        x.shutdown().await;
    }
    monitor
        .coordinators
        .lock()
        .expect("list")
        .retain(|x| x.config().identity == "kms-0");
    settle(&monitor, "scaled back to one").await;
    probe.abort();
    let gaps = covered.lock().map(|c| c.clone()).unwrap_or_default();
    let worst = gaps.iter().max().copied().unwrap_or_default();
    eprintln!("{} hand-overs, longest gap {worst:?}", gaps.len());
    assert!(
        worst < Duration::from_secs(1),
        "a shard was unowned for {worst:?}"
    );
    a.shutdown().await;
    monitor.finish(LEASE).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalled_replica_is_fenced_before_anyone_takes_over() {
    let client = support::client().await;
    let ns = support::namespace(&client, "shard-stall").await;
    let monitor = Monitor::start(&client, &ns, S);
    let proxy = support::StallProxy::start().await;
    let a = start(&client, &monitor, &ns, "kms-0").await;
    let b = start(&client, &monitor, &ns, "kms-1").await;
    let c = Coordinator::start(proxy.client().await, config(&ns, "kms-2", S)).expect("start");
    monitor.add(&c);
    settle(&monitor, "three replicas").await;
    let before = owned(&c);
    let mut events = c.events();

    // Its traffic hangs: it must stop owning by the renew deadline, before the
    // others may take its shards (the monitor checks there is no overlap).
    let t0 = Instant::now();
    proxy.pause(true);
    let ok = wait_until(Duration::from_secs(8), || {
        before.iter().all(|&s| a.owns(s) || b.owns(s))
    })
    .await;
    let took = t0.elapsed();
    assert!(
        ok,
        "not taken over: {:?}",
        owners(&[a.clone(), b.clone()], S)
    );
    assert!(
        owned(&c).is_empty(),
        "the stalled replica still claims {:?}",
        owned(&c)
    );
    assert!(
        took <= LEASE + RETRY + Duration::from_secs(1),
        "taken over after {took:?}"
    );
    eprintln!("stalled replica's shards taken over after {took:?}");
    let lost: Vec<Event> = std::iter::from_fn(|| events.try_recv().ok()).collect();
    assert!(
        lost.iter().any(|e| matches!(
            e,
            Event::Lost {
                reason: LossReason::RenewDeadline,
                ..
            }
        )),
        "{lost:?}"
    );

    // Resumed: its stale writes fail their precondition, it rejoins and gets
    // the same shards back.
    proxy.pause(false);
    settle(&monitor, "resumed").await;
    assert_eq!(owned(&c), before);
    for x in [&a, &b, &c] {
        x.shutdown().await;
    }
    monitor.finish(LEASE).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_api_server_that_answers_within_the_renew_deadline_keeps_the_shards() {
    let client = support::client().await;
    let ns = support::namespace(&client, "shard-slow").await;
    let monitor = Monitor::start(&client, &ns, S);
    let proxy = support::StallProxy::start().await;
    // Renew deadline 8 s, retry 1 s: a renewal sent a retry period after the
    // last one may wait 7 s for its answer (a new connection through the
    // slowed relay takes three delays: two of the TLS handshake, one of the
    // request).
    let lease = Duration::from_secs(10);
    let config = Config {
        lease_duration: lease,
        renew_deadline: Duration::from_secs(8),
        ..support::config(&ns, "kms-0", S)
    };
    let a = Coordinator::start(proxy.client().await, config).expect("start");
    monitor.add(&a);
    settle(&monitor, "one replica").await;
    let before = owned(&a);
    let mut events = a.events();

    // Every request reaches the API server 1.5 s late for 10 s: later than a
    // retry period (each write waited one retry period before), well within
    // the renew deadline.
    proxy.slow(Duration::from_millis(1500));
    let t0 = Instant::now();
    let mut dropped = None;
    while t0.elapsed() < Duration::from_secs(10) {
        if owned(&a) != before {
            dropped = Some((t0.elapsed(), owned(&a)));
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    proxy.slow(Duration::ZERO);
    let seen: Vec<Event> = std::iter::from_fn(|| events.try_recv().ok()).collect();
    assert_eq!(dropped, None, "shards dropped while slow; events {seen:?}");
    assert!(
        !seen.iter().any(|e| matches!(e, Event::Lost { .. })),
        "{seen:?}"
    );
    a.shutdown().await;
    monitor.finish(lease).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_that_hangs_lets_the_lease_expire_instead_of_clearing_it() {
    let client = support::client().await;
    let ns = support::namespace(&client, "shard-hang").await;
    let monitor = Monitor::start(&client, &ns, S);
    let a = start(&client, &monitor, &ns, "kms-0").await;
    let mut cfg = config(&ns, "kms-1", S);
    cfg.drain_timeout = Duration::from_secs(1);
    let b = Coordinator::start_with_drain_hook(client.clone(), cfg, |_| std::future::pending())
        .expect("start");
    monitor.add(&b);
    settle(&monitor, "two replicas").await;
    let theirs = owned(&b);

    let t0 = Instant::now();
    b.shutdown().await;
    let stopped = t0.elapsed();
    assert!(
        stopped >= Duration::from_secs(1),
        "did not wait for the drain: {stopped:?}"
    );
    assert!(theirs.iter().all(|&s| !b.owns(s)));
    // Not cleared: the Leases still name the stopped replica until they
    // expire on the other replica's clock.
    let api: Api<Lease> = Api::namespaced(client.clone(), &ns);
    let still = api
        .get(&shard::shard_lease_name("kms-test", theirs[0]))
        .await
        .expect("get");
    assert_eq!(shard::lease::holder(&still), Some("kms-1"));
    let ok = wait_until(Duration::from_secs(6), || theirs.iter().all(|&s| a.owns(s))).await;
    let took = t0.elapsed();
    assert!(
        ok,
        "not taken over: {:?}",
        owners(std::slice::from_ref(&a), S)
    );
    eprintln!("hung drain: stop took {stopped:?}, taken over after {took:?}");
    assert!(
        took >= LEASE,
        "taken over before the Lease expired: {took:?}"
    );
    a.shutdown().await;
    monitor.finish(LEASE).await;
}
