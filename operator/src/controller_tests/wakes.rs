//! Who is woken when: the plan wakes the Transfer a freed slot goes to, and
//! the agent watcher the Transfers of an agent whose Lease ran out.

use super::*;

/// The Transfers woken so far (by the planner or the agent watcher).
fn woken(
    rx: &mut futures::channel::mpsc::UnboundedReceiver<
        kube::runtime::reflector::ObjectRef<Transfer>,
    >,
) -> Vec<String> {
    let mut out = Vec::new();
    while let Ok(r) = rx.try_recv() {
        out.push(r.name);
    }
    out
}

// Queued Transfers were polled every 3 s, each poll planning the whole
// cluster. Now the plan that frees a slot wakes the Transfer it gives it to.
#[tokio::test]
async fn a_freed_slot_wakes_the_transfer_it_goes_to() {
    let mut d = Cluster::new().await;
    let mut wakes = d.ctx.wakes().unwrap();
    pools(&mut d);
    d.lease(&lease("src", "s0", now(), None));
    d.lease(&lease("dst", "r0", now(), None));
    let (high, mid, low) = (t("high", 10, 1), t("mid", 5, 2), t("low", 0, 3));
    for x in [&high, &mid, &low] {
        d.transfer(x);
    }
    reconcile(&d, &high).await;
    reconcile(&d, &mid).await;
    reconcile(&d, &low).await;
    assert_eq!(d.last_status("/transfers/low")["phase"], "Queued");
    let first = woken(&mut wakes.transfers);
    assert!(first.contains(&"high".to_owned()) && first.contains(&"mid".to_owned()));
    assert!(!first.contains(&"low".to_owned()), "{first:?}");

    // The planner, after high succeeded: low gets the slot, and is woken.
    let mut done = receiver_succeeded(&mut d, high).await;
    done.status = Some(serde_json::from_value(d.last_status("/transfers/high")).unwrap());
    assert_eq!(
        done.status.as_ref().unwrap().phase,
        Some(wirerate_crds::TransferPhase::Succeeded)
    );
    d.transfer(&done);
    let plan = d.ctx.plan(Timestamp::now());
    assert!(plan.placements.contains_key(&("data".into(), "low".into())));
    assert_eq!(woken(&mut wakes.transfers), vec!["low".to_owned()]);
    reconcile(&d, &low).await;
    assert_eq!(d.last_status("/transfers/low")["phase"], "Running");

    // Nothing changed: the same plan, nobody woken.
    let again = d.ctx.plan(Timestamp::now());
    assert!(Arc::ptr_eq(&plan, &d.ctx.plan(Timestamp::now())) || again == plan);
    assert!(woken(&mut wakes.transfers).is_empty());
}

// Running Transfers were polled every 3 s to notice a lost agent. Now the
// agent watcher wakes them when a Lease runs out, which sends no event.
#[tokio::test]
async fn a_lease_running_out_wakes_the_transfers_of_its_agent() {
    let mut d = Cluster::new().await;
    let mut wakes = d.ctx.wakes().unwrap();
    pools(&mut d);
    d.lease(&lease("src", "s0", now(), None));
    // Valid for 15 s, renewed 11 s ago: runs out in 4 s, after the watcher
    // has seen it live (CI failed it once with 1 s to spare: under load the
    // setup took longer, and the Lease ran out before the watcher began).
    d.lease(&lease("dst", "r0", now() - 11, None));
    let x = t("x", 0, 1);
    d.transfer(&x);
    reconcile(&d, &x).await;
    assert_eq!(d.last_status("/transfers/x")["phase"], "Running");
    let mut running = x.clone();
    running.status = Some(serde_json::from_value(d.last_status("/transfers/x")).unwrap());
    d.transfer(&running);
    woken(&mut wakes.transfers);

    let watcher = tokio::spawn(d.ctx.clone().watch_agents());
    let mut pools_woken = Vec::new();
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
    let mut transfers_woken = Vec::new();
    while tokio::time::Instant::now() < deadline && transfers_woken.is_empty() {
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        transfers_woken = woken(&mut wakes.transfers);
        while let Ok(p) = wakes.pools.try_recv() {
            pools_woken.push(p.name);
        }
    }
    watcher.abort();
    assert_eq!(transfers_woken, vec!["x".to_owned()]);
    // The other agent only renewed: its pool is left alone.
    assert_eq!(pools_woken, vec!["dst".to_owned()]);
}
