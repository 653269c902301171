//! The Transfer controller: validity, queueing by priority, scheduling,
//! failover, completion and the finalizer.

use super::*;

#[tokio::test]
async fn an_invalid_spec_becomes_a_condition_and_an_event() {
    let mut d = Cluster::new().await;
    pools(&mut d);
    let mut bad = t("bad", 0, 1);
    bad.spec.destination.pool = Some("missing".into());
    d.transfer(&bad);
    reconcile(&d, &bad).await;
    let s = d.last_status("/transfers/bad");
    assert_eq!(s["phase"], "Pending");
    let valid = s["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "Valid")
        .unwrap();
    assert_eq!(
        (valid["status"].as_str(), valid["reason"].as_str()),
        (Some("False"), Some("PoolNotFound"))
    );
    assert!(
        valid["message"]
            .as_str()
            .unwrap()
            .contains("data/missing does not exist")
    );
    let event = d
        .calls()
        .into_iter()
        .find(|c| c.path.ends_with("/events"))
        .expect("an Event");
    assert_eq!(event.body["reason"], "PoolNotFound");
    assert_eq!(event.body["type"], "Warning");
}

#[tokio::test]
async fn higher_priority_gets_the_only_slot_and_the_other_queues() {
    let mut d = Cluster::new().await;
    pools(&mut d);
    d.lease(&lease("src", "s0", now(), None));
    d.lease(&lease("dst", "r0", now(), None));
    // Each agent has 2 slots; three transfers want them.
    let low = t("low", 0, 1);
    let high = t("high", 10, 5);
    let mid = t("mid", 5, 3);
    for x in [&low, &high, &mid] {
        d.transfer(x);
    }
    reconcile(&d, &low).await;
    let s = d.last_status("/transfers/low");
    assert_eq!(s["phase"], "Queued");
    assert_eq!(
        s["queuePosition"], 1,
        "next in line once high and mid are placed"
    );
    assert!(s.get("sender").is_none());

    reconcile(&d, &high).await;
    let s = d.last_status("/transfers/high");
    assert_eq!(s["phase"], "Running");
    assert_eq!(
        (s["sender"]["name"].as_str(), s["receiver"]["name"].as_str()),
        (Some("s0"), Some("r0"))
    );
    assert_eq!(s["tokenSecret"], "high-token");
    assert_eq!(s["attempt"], 1);
    let calls = d.calls();
    let secret = calls
        .iter()
        .find(|c| c.is("POST", "/secrets"))
        .expect("token Secret created");
    assert_eq!(
        secret.body["metadata"]["ownerReferences"][0]["kind"],
        "Transfer"
    );
    assert_eq!(
        secret.body["stringData"]["token"].as_str().unwrap().len(),
        64
    );
    let labels = calls
        .iter()
        .find(|c| c.is("PATCH", "/transfers/high") && !c.path.ends_with("/status"))
        .unwrap();
    assert_eq!(
        labels.body["metadata"]["labels"][contract::RECEIVER_LABEL],
        "r0"
    );
    let sched = calls
        .iter()
        .rev()
        .find(|c| c.path.ends_with("/events"))
        .unwrap();
    assert_eq!(sched.body["reason"], "Scheduled");

    // Looked at again before the cache shows the assignment: the ledger's copy
    // keeps it whole (agents, pools, addresses), not a stub.
    reconcile(&d, &high).await;
    let again = d.last_status("/transfers/high");
    assert_eq!(again["receiver"]["pool"], "dst");
    assert_eq!(again["receiver"]["address"], "r0.example:7700");
    assert_eq!(again["attempt"], 1);

    // The ledger counts high's slot before the cache shows it: mid takes the
    // last one and low still waits.
    reconcile(&d, &mid).await;
    assert_eq!(d.last_status("/transfers/mid")["phase"], "Running");
    reconcile(&d, &low).await;
    assert_eq!(d.last_status("/transfers/low")["phase"], "Queued");
}

// Found against a real API server: agents were known by name alone, so the
// expired Leases of same-named agents in another namespace hid live ones.
#[tokio::test]
async fn same_named_agents_of_another_namespace_are_other_agents() {
    let mut d = Cluster::new().await;
    pools(&mut d);
    for (pool, agent) in [("src", "s0"), ("dst", "r0")] {
        let mut old = lease(pool, agent, now() - 600, None);
        old.metadata.namespace = Some("last-week".into());
        d.lease(&old);
        d.lease(&lease(pool, agent, now(), None));
        let mut old = lease(pool, agent, now() - 600, None);
        old.metadata.namespace = Some("next-week".into());
        d.lease(&old);
    }
    let x = t("x", 0, 1);
    d.transfer(&x);
    reconcile(&d, &x).await;
    let s = d.last_status("/transfers/x");
    assert_eq!(s["phase"], "Running", "{s}");
    assert_eq!(
        (s["sender"]["name"].as_str(), s["receiver"]["name"].as_str()),
        (Some("s0"), Some("r0"))
    );
    // Running, the expired namesakes do not count as its agents being lost.
    let mut x = x;
    x.status = Some(serde_json::from_value(s).unwrap());
    d.transfer(&x);
    reconcile(&d, &x).await;
    let s = d.last_status("/transfers/x");
    assert_eq!(s["attempt"], 1, "{s}");
    assert!(
        s.get("failovers")
            .is_none_or(|f| f.as_array().unwrap().is_empty()),
        "{s}"
    );
}

#[tokio::test]
async fn a_stale_receiver_lease_fails_over_to_another_agent() {
    let mut d = Cluster::new().await;
    pools(&mut d);
    d.lease(&lease("src", "s0", now(), None));
    d.lease(&lease("dst", "r0", now() - 60, None));
    d.lease(&lease("dst", "r1", now(), None));
    let mut x = t("x", 0, 1);
    let mut s = wirerate_crds::TransferStatus::default();
    let ag = agent_ref;
    s.phase = Some(wirerate_crds::TransferPhase::Running);
    s.attempt = 1;
    s.sender = Some(ag("s0", "src"));
    s.receiver = Some(ag("r0", "dst"));
    s.token_secret = Some("x-token".into());
    x.status = Some(s);
    d.transfer(&x);
    reconcile(&d, &x).await;

    let s = d.last_status("/transfers/x");
    assert_eq!(s["attempt"], 2);
    assert_eq!(s["failovers"].as_array().unwrap().len(), 1);
    assert_eq!(s["failovers"][0]["agent"], "r0");
    assert!(
        s["failovers"][0]["reason"]
            .as_str()
            .unwrap()
            .contains("Lease expired")
    );
    assert_eq!(s["receiver"]["name"], "r1", "reassigned in the same pass");
    assert_eq!(s["sender"]["name"], "s0");
    assert_eq!(s["phase"], "Running");
    let reasons = event_reasons(&d);
    assert_eq!(reasons, ["Failover", "Scheduled"]);
}

#[tokio::test]
async fn the_receivers_success_completes_the_transfer_and_drops_the_labels() {
    let mut d = Cluster::new().await;
    pools(&mut d);
    d.lease(&lease("src", "s0", now(), None));
    d.lease(&lease("dst", "r0", now(), None));
    let mut x = t("x", 0, 1);
    x.metadata.labels = Some(
        [
            (contract::SENDER_LABEL.to_owned(), "s0".to_owned()),
            (contract::RECEIVER_LABEL.to_owned(), "r0".to_owned()),
        ]
        .into(),
    );
    let ag = agent_ref;
    x.status = Some(wirerate_crds::TransferStatus {
        phase: Some(wirerate_crds::TransferPhase::Verifying),
        attempt: 1,
        sender: Some(ag("s0", "src")),
        receiver: Some(ag("r0", "dst")),
        start_time: Some(Time(Timestamp::from_second(now() - 10).unwrap())),
        reports: vec![receiver_success()],
        ..Default::default()
    });
    d.transfer(&x);
    reconcile(&d, &x).await;
    let s = d.last_status("/transfers/x");
    assert_eq!(s["phase"], "Succeeded");
    assert!(s.get("completionTime").is_some());
    assert!(
        s.get("reports").is_none(),
        "the agents' reports are theirs; the operator never applies them"
    );
    let labels = d
        .calls()
        .into_iter()
        .find(|c| c.is("PATCH", "/transfers/x"))
        .unwrap();
    assert_eq!(
        labels.body["metadata"]["labels"],
        serde_json::json!({}),
        "assignment labels released"
    );
    let ev = d
        .calls()
        .into_iter()
        .rev()
        .find(|c| c.path.ends_with("/events"))
        .unwrap();
    assert_eq!(ev.body["reason"], "Succeeded");
    assert!(ev.body["note"].as_str().unwrap().contains("digest 0123"));
}

#[tokio::test]
async fn a_transfer_of_an_unbound_namespace_waits_with_what_to_do() {
    let mut d = Cluster::new().await;
    for mut p in [pool("src", "/in"), pool("dst", "/out")] {
        p.spec.allowed_namespaces = vec!["guest".into()];
        d.pool(&finalized(p, pool_controller::POOL_FINALIZER));
    }
    d.lease(&lease("src", "s0", now(), None));
    d.lease(&lease("dst", "r0", now(), None));
    let mut x = t("x", 0, 1);
    x.metadata.namespace = Some("guest".into());
    x.spec.source.pool_namespace = Some("data".into());
    x.spec.destination.pool_namespace = Some("data".into());
    // A guest writes in its own subtree of the shared pool.
    x.spec.destination.path = "/out/guest/x".into();
    d.transfer(&x);
    reconcile(&d, &x).await;
    let s = d.last_status("/transfers/x");
    assert_eq!(s["phase"], "Pending", "{s}");
    assert!(s.get("sender").is_none());
    assert!(s.to_string().contains("NamespaceNotBound"), "{s}");
    assert!(!d.calls().iter().any(|c| c.path.contains("/secrets")));

    for pool in ["src", "dst"] {
        d.binding(&binding("guest", "data", pool));
    }
    reconcile(&d, &x).await;
    assert_eq!(d.last_status("/transfers/x")["phase"], "Running");
}

// Found against a real API server: every Transfer got the finalizer, even
// one never scheduled, so deleting a namespace hung while the operator was
// down. Now it is added just before agents are given the Transfer, and
// dropped when the Transfer is over.
#[tokio::test]
async fn the_finalizer_is_held_only_while_agents_have_something_to_clean_up() {
    let finalizer_patches = |d: &Cluster, name: &str| -> Vec<serde_json::Value> {
        d.calls()
            .into_iter()
            .filter(|c| c.is("PATCH", &format!("/transfers/{name}")) && c.body.is_array())
            .map(|c| c.body)
            .collect()
    };
    let mut d = Cluster::new().await;
    pools(&mut d);
    d.lease(&lease("src", "s0", now(), None));
    d.lease(&lease("dst", "r0", now(), None));

    // Never valid, never scheduled: no finalizer.
    let mut bad = transfer("bad", "/in/a", "/out/bad");
    bad.spec.destination.pool = Some("missing".into());
    d.transfer(&bad);
    reconcile(&d, &bad).await;
    assert_eq!(d.last_status("/transfers/bad")["phase"], "Pending");
    assert!(finalizer_patches(&d, "bad").is_empty());

    // Scheduled: the finalizer first, then the assignment.
    let x = transfer("x", "/in/a", "/out/x");
    d.transfer(&x);
    reconcile(&d, &x).await;
    let calls = d.calls();
    let added = calls
        .iter()
        .position(|c| c.is("PATCH", "/transfers/x") && c.body.is_array())
        .expect("finalizer added");
    let assigned = calls
        .iter()
        .position(|c| c.is("PATCH", "/transfers/x/status"))
        .unwrap();
    assert!(added < assigned, "held before the agents are told");
    assert_eq!(
        calls[added].body[1],
        serde_json::json!({"op": "add", "path": "/metadata/finalizers", "value": [contract::TRANSFER_FINALIZER]})
    );

    // Over: the finalizer goes.
    receiver_succeeded(&mut d, finalized(x, contract::TRANSFER_FINALIZER)).await;
    let patches = finalizer_patches(&d, "x");
    assert_eq!(
        patches.last().unwrap()[1],
        serde_json::json!({"op": "remove", "path": "/metadata/finalizers/0"})
    );
}

// Found by the scale bench: after a success, a look at the cache's copy
// (which still showed the finalizer the look before had removed) failed its
// JSON patch's test with 422, counted as a failed reconcile and was retried
// 5 s later, after every Transfer that finished.
#[tokio::test]
async fn a_stale_copy_of_a_finalizer_already_removed_is_no_error() {
    let (mut d, x) = one_transfer_assigned().await;
    let done = receiver_succeeded(&mut d, x).await;
    assert_eq!(d.last_status("/transfers/x")["phase"], "Succeeded");
    let path = "/apis/wirerate.io/v1alpha1/namespaces/data/transfers/x";
    assert!(
        d.object_at(path)["metadata"]["finalizers"]
            .as_array()
            .is_none_or(|f| f.is_empty()),
        "the finalizer is gone from the API's copy"
    );
    // The cache still shows it (and the success, from our status write's event).
    let mut stale = done.clone();
    stale.status = Some(serde_json::from_value(d.last_status("/transfers/x")).unwrap());
    assert!(
        stale
            .metadata
            .finalizers
            .as_ref()
            .is_some_and(|f| !f.is_empty())
    );
    d.transfer_in_cache(&stale);
    let finalizer_patches = |d: &Cluster| {
        d.calls()
            .into_iter()
            .filter(|c| {
                c.method == "PATCH" && c.path.ends_with("/transfers/x") && c.body.is_array()
            })
            .count()
    };
    let before = finalizer_patches(&d);
    transfer_controller::reconcile(Arc::new(stale), d.ctx.clone())
        .await
        .expect("already done is not an error");
    // Found again on a real API server: that look's patch failed its test
    // (422) and cost a read besides, for every finished Transfer. The
    // operator knows it removed the finalizer a moment ago.
    assert_eq!(finalizer_patches(&d), before, "no second removal tried");
}

// Found by review: the Transfer controller waited for its own cache only. A
// restarted operator looking at a running Transfer before the Leases were
// listed saw its agents gone and failed it over.
#[tokio::test]
async fn nothing_is_decided_before_every_cache_is_listed() {
    let mut d = Cluster::listed(false).await;
    pools(&mut d);
    let mut x = t("x", 0, 1);
    let ag = agent_ref;
    x.status = Some(wirerate_crds::TransferStatus {
        phase: Some(wirerate_crds::TransferPhase::Running),
        attempt: 1,
        sender: Some(ag("s0", "src")),
        receiver: Some(ag("r0", "dst")),
        ..Default::default()
    });
    d.transfer(&x);
    let action = transfer_controller::reconcile(Arc::new(x), d.ctx.clone())
        .await
        .unwrap();
    assert_eq!(
        action,
        kube::runtime::controller::Action::requeue(std::time::Duration::from_secs(1))
    );
    assert!(
        !d.calls().iter().any(|c| c.path.ends_with("/status")),
        "no status written: {:?}",
        d.calls()
    );
}

// Found on a real API server (issue 39): every queued Transfer's place in
// line was rewritten whenever the queue moved, 76 status writes per
// Transfer. A place behind the first ten shows as a coarse bound, and a
// new one is written at most every ten seconds.
#[tokio::test]
async fn a_queue_that_moves_rewrites_few_places_in_line() {
    let mut d = Cluster::new().await;
    // No agents: nothing is placed, everything queues for the same pool.
    pools(&mut d);
    for i in 0..11 {
        d.transfer(&t(&format!("q{i}"), 0, i));
    }
    let mut last = t("last", 0, 100);
    d.transfer(&last);
    reconcile(&d, &last).await;
    let s = d.last_status("/transfers/last");
    assert_eq!(s["queuePosition"], 20, "12th, shown as at most 20th: {s}");
    last.status = Some(serde_json::from_value(s).unwrap());
    d.transfer(&last);
    // Higher priorities arrive one by one: it moves back to 25th.
    for i in 0..13 {
        d.transfer(&t(&format!("h{i}"), 10, 200 + i));
        reconcile(&d, &last).await;
    }
    let writes = d
        .calls()
        .iter()
        .filter(|c| c.is("PATCH", "/transfers/last/status"))
        .count();
    assert_eq!(writes, 1, "its place is written once, not 14 times");
}

// Found on a real API server (issue 39): a priority-100 Transfer stayed
// Queued through five rounds while priority-0 Transfers took the agent it
// needed in the pool that was not full.
#[tokio::test]
async fn a_high_priority_waiting_for_a_full_pool_keeps_its_agent_in_the_other() {
    let mut d = Cluster::new().await;
    pools(&mut d);
    d.pool(&finalized(
        pool("dst2", "/out2"),
        pool_controller::POOL_FINALIZER,
    ));
    for (p, a) in [("src", "s0"), ("src", "s1"), ("dst", "r0"), ("dst2", "q0")] {
        d.lease(&lease(p, a, now(), None));
    }
    // r0 (the only agent of dst) and s1 are full; s0 and q0 have a slot each.
    let running = |name: &str, from: (&str, &str), to: (&str, &str)| {
        let mut x = t(name, 0, 1);
        x.status = Some(wirerate_crds::TransferStatus {
            phase: Some(wirerate_crds::TransferPhase::Running),
            attempt: 1,
            sender: Some(agent_ref(from.1, from.0)),
            receiver: Some(agent_ref(to.1, to.0)),
            ..Default::default()
        });
        x
    };
    let run0 = running("run0", ("src", "s1"), ("dst", "r0"));
    d.transfer(&run0);
    d.transfer(&running("run1", ("src", "s1"), ("dst", "r0")));
    d.transfer(&running("run2", ("src", "s0"), ("dst2", "q0")));
    let high = t("high", 100, 5);
    let mut low = t("low", 0, 2);
    low.spec.destination.pool = Some("dst2".into());
    low.spec.destination.path = "/out2/low".into();
    d.transfer(&high);
    d.transfer(&low);

    reconcile(&d, &low).await;
    let s = d.last_status("/transfers/low");
    assert_eq!(s["phase"], "Queued", "s0 is held for high: {s}");
    reconcile(&d, &high).await;
    assert_eq!(d.last_status("/transfers/high")["phase"], "Queued");

    // r0 frees a slot: high gets it, and s0.
    let mut done = run0.clone();
    done.status.as_mut().unwrap().phase = Some(wirerate_crds::TransferPhase::Succeeded);
    d.transfer(&done);
    reconcile(&d, &high).await;
    let s = d.last_status("/transfers/high");
    assert_eq!(s["phase"], "Running", "{s}");
    assert_eq!(
        (s["sender"]["name"].as_str(), s["receiver"]["name"].as_str()),
        (Some("s0"), Some("r0"))
    );
}

// Found against a real API server by bench/scale with 100 real agents: a
// look at the cache's copy from before the operator's own last write
// (which still showed the Transfer waiting) wrote "Running" again with a
// new startTime, and the assignment labels again; the look after it wrote
// the first status back. Three status writes and two label patches where
// one of each would do.
#[tokio::test]
async fn a_copy_from_before_the_operators_own_write_is_not_written_again() {
    let (d, x) = one_transfer_assigned().await;
    let writes = |d: &Cluster| {
        d.calls()
            .into_iter()
            .filter(|c| c.method == "PATCH" && c.path.contains("/transfers/x"))
            .map(|c| c.path)
            .collect::<Vec<_>>()
    };
    let first = writes(&d);
    assert!(
        first.iter().any(|p| p.ends_with("/transfers/x/status")),
        "{first:?}"
    );
    assert_eq!(d.last_status("/transfers/x")["phase"], "Running");
    // The cache still holds `x` as it was created: look again from it.
    reconcile(&d, &x).await;
    assert_eq!(writes(&d), first, "nothing new to write");
}

/// Two Transfers to one destination: the later waits, with a
/// DestinationInUse condition naming its path, and starts once the other
/// is over; a Transfer to another destination is not held up meanwhile.
#[tokio::test]
async fn a_second_transfer_to_a_destination_in_use_waits_for_the_first() {
    let mut d = Cluster::new().await;
    pools(&mut d);
    d.lease(&lease("src", "s0", now(), None));
    d.lease(&lease("dst", "r0", now(), None));
    d.lease(&lease("dst", "r1", now(), None));
    let x = t("x", 0, 1);
    let mut y = t("y", 0, 2);
    // A file inside the tree x writes.
    y.spec.destination.path = "/out/x/inside.h5".into();
    let z = t("z", 0, 3);
    for t in [&x, &y, &z] {
        d.transfer(t);
    }
    reconcile(&d, &x).await;
    assert_eq!(d.last_status("/transfers/x")["phase"], "Running");
    reconcile(&d, &y).await;
    let s = d.last_status("/transfers/y");
    assert_eq!(s["phase"], "Queued", "{s}");
    let scheduled = condition(&d, "/transfers/y", "Scheduled");
    assert_eq!(scheduled["reason"], "DestinationInUse", "{s}");
    let message = scheduled["message"].as_str().unwrap();
    assert!(
        message.contains("spec.destination.path /out/x/inside.h5"),
        "{message}"
    );
    reconcile(&d, &z).await;
    assert_eq!(d.last_status("/transfers/z")["phase"], "Running");

    // x lands: y goes.
    let mut x = x;
    x.status = Some(serde_json::from_value(d.last_status("/transfers/x")).unwrap());
    let mut x = receiver_succeeded(&mut d, x).await;
    let s = d.last_status("/transfers/x");
    assert_eq!(s["phase"], "Succeeded");
    x.status = Some(serde_json::from_value(s).unwrap());
    d.transfer(&x);
    reconcile(&d, &y).await;
    let s = d.last_status("/transfers/y");
    assert_eq!(s["phase"], "Running", "{s}");
}

/// A Transfer being deleted keeps its destination until its agents have
/// stopped (its finalizer stays until then): its receiver's clean-up
/// removes temporary files by name, and would remove the next one's.
#[tokio::test]
async fn a_transfer_being_deleted_keeps_its_destination_until_its_agents_stop() {
    let (mut d, x) = one_transfer_assigned().await;
    let mut x = x;
    x.status = Some(serde_json::from_value(d.last_status("/transfers/x")).unwrap());
    x.metadata.deletion_timestamp = Some(Time(Timestamp::now()));
    d.transfer(&x);
    let mut y = t("y", 0, 2);
    y.spec.destination.path = "/out/x".into();
    d.transfer(&y);
    reconcile(&d, &y).await;
    let s = d.last_status("/transfers/y");
    assert_eq!(s["phase"], "Queued", "{s}");
    assert!(s.to_string().contains("DestinationInUse"), "{s}");
}

// Issue 34: a Transfer over three pairs is given three distinct receivers
// in one write, labelled so that every agent can find it; into a pool
// that does not declare shared storage it is refused, naming the field.
#[tokio::test]
async fn a_transfer_over_three_pairs_gets_three_receivers_only_on_shared_storage() {
    let mut d = Cluster::new().await;
    pools(&mut d);
    d.lease(&lease("src", "s0", now(), None));
    for r in ["r0", "r1", "r2", "r3"] {
        d.lease(&lease("dst", r, now(), None));
    }
    let mut x = t("x", 0, 1);
    x.spec.pairs = Some(3);
    d.transfer(&x);
    reconcile(&d, &x).await;
    let valid = condition(&d, "/transfers/x", "Valid");
    assert_eq!(valid["reason"], "StorageNotShared");
    assert!(
        valid["message"]
            .as_str()
            .unwrap()
            .contains("does not declare spec.sharedStorage"),
        "{valid}"
    );
    assert!(d.last_status("/transfers/x").get("receivers").is_none());

    shared_dst(&mut d);
    reconcile(&d, &x).await;
    let s = d.last_status("/transfers/x");
    assert_eq!(s["phase"], "Running", "{s}");
    assert_eq!(s["pairs"], 3);
    assert_eq!(s["sender"]["name"], "s0");
    assert!(s.get("receiver").is_none(), "{s}");
    let mut names: Vec<&str> = s["receivers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["name"].as_str().unwrap())
        .collect();
    names.sort_unstable();
    names.dedup();
    assert_eq!(names.len(), 3, "three distinct receivers: {names:?}");
    let labels = d
        .calls()
        .into_iter()
        .filter(|c| c.is("PATCH", "/transfers/x"))
        .find_map(|c| c.body["metadata"].get("labels").cloned())
        .unwrap();
    assert_eq!(labels[contract::PAIRS_LABEL], "3", "{labels}");
    // Each receiver by a label of its own, which it watches by.
    for r in &names {
        let key = contract::pair_receiver_label("data", "dst", r);
        assert_eq!(labels[key.as_str()], "true", "{r}: {labels}");
    }
    assert_eq!(labels[contract::SENDER_LABEL], "s0", "{labels}");
}

// Issue 34: a Transfer over several pairs that lost one is given a free
// agent in its place, in the same attempt, labelled so that the agent
// sees it, with an Event; it keeps no place in line meanwhile.
#[tokio::test]
async fn a_lost_pair_is_replaced_by_a_free_agent_in_the_same_attempt() {
    let mut d = Cluster::new().await;
    pools(&mut d);
    shared_dst(&mut d);
    d.lease(&lease("src", "s0", now(), None));
    for r in ["r0", "r2", "r3"] {
        d.lease(&lease("dst", r, now(), None));
    }
    d.lease(&lease("dst", "r1", now() - 60, None));
    let mut x = t("x", 0, 1);
    x.spec.pairs = Some(3);
    x.status = Some(wirerate_crds::TransferStatus {
        phase: Some(wirerate_crds::TransferPhase::Running),
        attempt: 1,
        sender: Some(agent_ref("s0", "src")),
        receivers: vec![agent_ref("r0", "dst"), agent_ref("r2", "dst")],
        token_secret: Some("x-token".into()),
        ..Default::default()
    });
    d.transfer(&x);
    reconcile(&d, &x).await;

    let s = d.last_status("/transfers/x");
    let names = receiver_names(&s);
    assert_eq!(names, ["r0", "r2", "r3"], "{s}");
    assert_eq!(
        (s["attempt"].as_i64(), s["pairs"].as_i64()),
        (Some(1), Some(3))
    );
    assert!(s.get("queuePosition").is_none(), "{s}");
    let degraded = condition(&d, "/transfers/x", "Degraded");
    assert_eq!(degraded["status"], "False", "{degraded}");
    let scheduled = condition(&d, "/transfers/x", "Scheduled");
    assert_eq!(scheduled["status"], "True", "{scheduled}");
    let labels = d
        .calls()
        .into_iter()
        .filter(|c| c.is("PATCH", "/transfers/x"))
        .find_map(|c| c.body["metadata"].get("labels").cloned())
        .unwrap();
    let key = contract::pair_receiver_label("data", "dst", "r3");
    assert_eq!(labels[key.as_str()], "true", "{labels}");
    let reasons = event_reasons(&d);
    assert_eq!(reasons, ["PairReplaced"]);
}

// Issue 34: pairsPolicy Auto starts on the receivers free and, when the
// pool scales up (a new agent's Lease), the running Transfer takes it in.
#[tokio::test]
async fn an_auto_transfer_starts_on_the_free_receivers_and_grows_when_the_pool_scales_up() {
    let mut d = Cluster::new().await;
    pools(&mut d);
    shared_dst(&mut d);
    d.lease(&lease("src", "s0", now(), None));
    d.lease(&lease("dst", "r0", now(), None));
    let mut x = t("x", 0, 1);
    x.spec.pairs = Some(4);
    x.spec.pairs_policy = Some(wirerate_crds::transfer::PairsPolicy::Auto);
    d.transfer(&x);
    reconcile(&d, &x).await;
    let s = d.last_status("/transfers/x");
    assert_eq!(s["phase"], "Running", "{s}");
    assert_eq!(s["pairs"], 1, "{s}");

    // The pool scales up: the new agent joins the running Transfer.
    d.lease(&lease("dst", "r1", now(), None));
    let mut running = x.clone();
    running.status = Some(serde_json::from_value(s).unwrap());
    d.transfer(&running);
    reconcile(&d, &running).await;
    let s = d.last_status("/transfers/x");
    let names = receiver_names(&s);
    assert_eq!(names, ["r0", "r1"], "{s}");
    assert_eq!(
        (s["attempt"].as_i64(), s["pairs"].as_i64()),
        (Some(1), Some(2))
    );
    let reasons = event_reasons(&d);
    assert_eq!(reasons, ["Scheduled", "PairAdded"]);
}

/// The receivers a written status names.
fn receiver_names(s: &serde_json::Value) -> Vec<&str> {
    s["receivers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["name"].as_str().unwrap())
        .collect()
}

/// The reasons of the Events posted, in order.
fn event_reasons(d: &Cluster) -> Vec<String> {
    d.calls()
        .iter()
        .filter(|c| c.path.ends_with("/events"))
        .map(|c| c.body["reason"].as_str().unwrap().to_owned())
        .collect()
}

/// The receiving pool `dst`, declaring shared storage.
fn shared_dst(d: &mut Cluster) {
    let mut dst = pool("dst", "/out");
    dst.spec.shared_storage = true;
    d.pool(&finalized(dst, pool_controller::POOL_FINALIZER));
}
