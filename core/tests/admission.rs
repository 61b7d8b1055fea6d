//! The admission gate: rates, concurrency, fair shares, bands, deadlines, bounds.

use std::sync::Arc;

use headroom_core::admission::{
    Ask, Gate, GateConfig, Over, Permit, Poll, Refusal, TenantLimits, Ticket,
};

fn gate(per_replica: u32, max_queued: usize) -> Arc<Gate> {
    Gate::new(GateConfig {
        per_replica,
        max_queued,
        max_wait_s: 5.0,
        poll_s: 0.005,
    })
}

fn ask(tenant: &str, limits: TenantLimits, deadline_s: f64) -> Ask<'_> {
    Ask {
        tenant,
        limits,
        tokens: 100,
        deadline_s,
        replicas: 1,
    }
}

fn go(t: &mut Ticket, now: f64) -> Permit {
    match t.poll(now) {
        Poll::Go(p) => p,
        other => panic!("expected go, got {other:?}"),
    }
}

fn waits(t: &mut Ticket, now: f64) -> bool {
    matches!(t.poll(now), Poll::Wait(_))
}

fn refused(t: &mut Ticket, now: f64) -> Refusal {
    match t.poll(now) {
        Poll::Refuse(r) => r,
        other => panic!("expected a refusal, got {other:?}"),
    }
}

const FREE: TenantLimits = TenantLimits {
    weight: 1.0,
    priority: 0,
    rpm: 0.0,
    tpm: 0.0,
    max_concurrency: 0,
};

#[test]
fn without_limits_everyone_starts_at_once() {
    let g = gate(0, 4);
    let permits: Vec<Permit> = (0..100)
        .map(|_| go(&mut g.arrive(&ask("a", FREE, 1.0), 0.0).unwrap(), 0.0))
        .collect();
    assert_eq!(g.load()[0].running, 100);
    drop(permits);
    assert_eq!(g.load()[0].running, 0);
}

#[test]
fn request_rate_refuses_with_the_time_the_bucket_needs() {
    let g = gate(0, 16);
    let l = TenantLimits { rpm: 2.0, ..FREE };
    for _ in 0..2 {
        go(&mut g.arrive(&ask("a", l, 100.0), 0.0).unwrap(), 0.0);
    }
    let r = g.arrive(&ask("a", l, 100.0), 0.0).unwrap_err();
    assert_eq!((r.over, r.reason), (Over::Tenant, "rate_requests"));
    assert!((r.retry_after_s - 30.0).abs() < 1e-6, "{}", r.retry_after_s);
    assert_eq!(r.retry_after_secs(), 30);
    // Another tenant is not affected; the bucket refills.
    assert!(g.arrive(&ask("b", l, 100.0), 0.0).is_ok());
    assert!(g.arrive(&ask("a", l, 100.0), 30.0).is_ok());
}

#[test]
fn token_rate_counts_tokens_and_says_when_a_request_can_never_fit() {
    let g = gate(0, 16);
    let l = TenantLimits { tpm: 250.0, ..FREE };
    assert!(g.arrive(&ask("a", l, 9.0), 0.0).is_ok());
    assert!(g.arrive(&ask("a", l, 9.0), 0.0).is_ok());
    let r = g.arrive(&ask("a", l, 9.0), 0.0).unwrap_err();
    assert_eq!(r.reason, "rate_tokens");
    assert!((r.retry_after_s - 50.0 * 60.0 / 250.0).abs() < 1e-6);
    let big = Ask {
        tokens: 1000,
        ..ask("b", l, 9.0)
    };
    let r = g.arrive(&big, 0.0).unwrap_err();
    assert!(r.message.contains("alone exceeds"), "{}", r.message);
    assert_eq!(r.retry_after_secs(), 3600);
}

#[test]
fn concurrency_limit_queues_then_refuses_by_the_deadline() {
    let g = gate(0, 16);
    let l = TenantLimits {
        max_concurrency: 2,
        ..FREE
    };
    let p1 = go(&mut g.arrive(&ask("a", l, 1.0), 0.0).unwrap(), 0.0);
    let _p2 = go(&mut g.arrive(&ask("a", l, 1.0), 0.0).unwrap(), 0.0);
    let mut t3 = g.arrive(&ask("a", l, 1.0), 0.0).unwrap();
    assert!(waits(&mut t3, 0.0));
    // A slot frees at 0.5 s: the waiter takes it.
    p1.release(0.5);
    let p3 = go(&mut t3, 0.51);
    assert!(p3.waited());
    let mut t4 = g.arrive(&ask("a", l, 1.0), 0.6).unwrap();
    assert!(waits(&mut t4, 0.6));
    let r = refused(&mut t4, 1.0);
    assert_eq!((r.over, r.reason), (Over::Tenant, "concurrency"));
    // Hold time 0.5 s learned from p1; two running, one (itself) waiting.
    assert!(
        (r.retry_after_s - 0.5 * 1.0 / 2.0).abs() < 1e-9,
        "{}",
        r.retry_after_s
    );
    assert_eq!(g.load()[0].queued, 0, "the refused waiter left the queue");
}

#[test]
fn a_noisy_tenant_cannot_take_another_tenants_share() {
    // Capacity 4, equal weights: each tenant's share under overload is 2.
    let g = gate(4, 64);
    let mut noisy: Vec<Permit> = (0..4)
        .map(|_| go(&mut g.arrive(&ask("noisy", FREE, 10.0), 0.0).unwrap(), 0.0))
        .collect();
    let mut waiting: Vec<Ticket> = (0..20)
        .map(|_| g.arrive(&ask("noisy", FREE, 10.0), 0.0).unwrap())
        .collect();
    assert!(waiting.iter_mut().all(|t| waits(t, 0.0)));
    // The quiet tenant starts at once although the node is at capacity.
    let q1 = go(&mut g.arrive(&ask("quiet", FREE, 10.0), 0.1).unwrap(), 0.1);
    let q2 = go(&mut g.arrive(&ask("quiet", FREE, 10.0), 0.1).unwrap(), 0.1);
    // Beyond its share it waits like anyone else.
    let mut q3 = g.arrive(&ask("quiet", FREE, 10.0), 0.1).unwrap();
    assert!(waits(&mut q3, 0.1));
    // Noisy finishes two: it is over its share (4 ≥ 2) and the node still full, so
    // the freed slots go to nobody of noisy's until the node is under capacity.
    noisy.pop().unwrap().release(0.2);
    assert!(waiting.iter_mut().all(|t| waits(t, 0.2)));
    noisy.pop().unwrap().release(0.3);
    // 2 noisy + 2 quiet = 4: at capacity, both at their share: nobody starts.
    assert!(waits(&mut q3, 0.3));
    // Quiet finishes one: the node is under capacity, so the slot goes by virtual
    // time — to noisy, which has started nothing since quiet came — and quiet, under
    // its share again, starts its waiter too.
    q1.release(0.4);
    let _q3 = go(&mut q3, 0.4);
    let load = g.load();
    let n = load.iter().find(|l| l.tenant == "noisy").unwrap();
    assert_eq!(n.running, 3);
    drop(q2);
}

#[test]
fn weights_split_capacity_under_overload() {
    let g = gate(8, 1024);
    let heavy = TenantLimits {
        weight: 3.0,
        ..FREE
    };
    let mut tickets: Vec<(bool, Ticket)> = Vec::new();
    for _ in 0..200 {
        tickets.push((true, g.arrive(&ask("heavy", heavy, 1e9), 0.0).unwrap()));
        tickets.push((true, g.arrive(&ask("heavy", heavy, 1e9), 0.0).unwrap()));
        tickets.push((false, g.arrive(&ask("light", FREE, 1e9), 0.0).unwrap()));
    }
    // Repeatedly: collect grants, then finish the oldest running request.
    let mut running: std::collections::VecDeque<(bool, Permit)> = Default::default();
    let mut started = [0u32; 2];
    let mut now = 0.0;
    for step in 0..450 {
        now += 0.01;
        if step == 200 {
            started = [0, 0]; // past the start; both stay backlogged to the end
        }
        let mut i = 0;
        while i < tickets.len() {
            if let Poll::Go(p) = tickets[i].1.poll(now) {
                let (h, _) = tickets.swap_remove(i);
                started[h as usize] += 1;
                running.push_back((h, p));
            } else {
                i += 1;
            }
        }
        if let Some((_, p)) = running.pop_front() {
            p.release(now);
        }
    }
    let share = f64::from(started[1]) / f64::from(started[0] + started[1]);
    assert!(
        (share - 0.75).abs() < 0.05,
        "heavy got {share} of the starts"
    );
}

#[test]
fn higher_band_first_then_earliest_deadline() {
    let g = gate(1, 64);
    let hold = go(&mut g.arrive(&ask("low", FREE, 9.0), 0.0).unwrap(), 0.0);
    let mut late = g.arrive(&ask("low", FREE, 9.0), 0.0).unwrap();
    let mut early = g.arrive(&ask("low", FREE, 5.0), 0.0).unwrap();
    let hi = TenantLimits {
        priority: 5,
        ..FREE
    };
    let mut urgent = g.arrive(&ask("high", hi, 9.0), 0.1).unwrap();
    for t in [&mut late, &mut early, &mut urgent] {
        assert!(waits(t, 0.1));
    }
    hold.release(0.2);
    let p = go(&mut urgent, 0.2);
    assert!(waits(&mut late, 0.2) && waits(&mut early, 0.2));
    p.release(0.3);
    let p = go(&mut early, 0.3);
    assert!(waits(&mut late, 0.3));
    drop(p);
    go(&mut late, 0.4);
}

#[test]
fn queues_are_bounded_per_tenant_and_per_node() {
    let g = gate(1, 4);
    let _run = go(&mut g.arrive(&ask("a", FREE, 9.0), 0.0).unwrap(), 0.0);
    let _q: Vec<Ticket> = (0..4)
        .map(|_| g.arrive(&ask("a", FREE, 9.0), 0.0).unwrap())
        .collect();
    let r = g.arrive(&ask("a", FREE, 9.0), 0.0).unwrap_err();
    assert_eq!((r.over, r.reason), (Over::Tenant, "share"), "{r:?}");
    // With b active, a's part of the queue is half: b still finds room... the node
    // queue is full though, and b runs nothing: that is the fleet's fault (503).
    let r = g.arrive(&ask("b", FREE, 9.0), 0.0).unwrap_err();
    assert_eq!((r.over, r.reason), (Over::Fleet, "queue_full"), "{r:?}");
}

#[test]
fn a_tenant_with_nothing_running_that_cannot_start_is_refused_as_fleet_overload() {
    // Capacity 2 over three tenants: shares are ⌊2/3⌋ = 0.
    let g = gate(2, 64);
    let _a = go(&mut g.arrive(&ask("a", FREE, 9.0), 0.0).unwrap(), 0.0);
    let _b = go(&mut g.arrive(&ask("b", FREE, 9.0), 0.0).unwrap(), 0.0);
    let mut c = g.arrive(&ask("c", FREE, 1.0), 0.0).unwrap();
    assert!(waits(&mut c, 0.5));
    let r = refused(&mut c, 1.0);
    assert_eq!((r.over, r.reason), (Over::Fleet, "capacity"));
    assert!(r.retry_after_s > 0.0);
}

#[test]
fn leaving_gives_back_the_place_or_the_slot() {
    let g = gate(1, 64);
    let p = go(&mut g.arrive(&ask("a", FREE, 9.0), 0.0).unwrap(), 0.0);
    let t1 = g.arrive(&ask("a", FREE, 9.0), 0.0).unwrap();
    let mut t2 = g.arrive(&ask("a", FREE, 9.0), 0.0).unwrap();
    p.release(0.1); // t1 is granted the slot...
    drop(t1); // ...and leaves without collecting it: t2 gets it.
    let _p2 = go(&mut t2, 0.2);
    let l = &g.load()[0];
    assert_eq!((l.running, l.queued), (1, 0));
}

#[test]
fn every_waiter_ends_by_its_deadline() {
    let g = gate(1, 1024);
    let _p = go(&mut g.arrive(&ask("a", FREE, 100.0), 0.0).unwrap(), 0.0);
    for deadline in [0.0, 0.003, 0.25, 2.0] {
        let mut t = g.arrive(&ask("a", FREE, deadline), 0.0).unwrap();
        let mut now = 0.0;
        let end = loop {
            match t.poll(now) {
                Poll::Wait(w) => {
                    assert!(w > 0.0 && now + w <= deadline.max(now + 0.001) + 1e-9);
                    now += w;
                }
                Poll::Refuse(_) => break now,
                Poll::Go(_) => panic!("no slot frees"),
            }
        };
        assert!(end <= deadline + 0.001 + 1e-9, "{end} > {deadline}");
    }
}
