//! The PS unit tests: a shard and its standby over a real data plane
//! (bit-identical copies, promotion without double application, malformed
//! state refused, pulls never waiting behind a slow standby).

use super::*;
use crate::context::Context;
use crate::shared::Item;
use serde_json::json;
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use trainyard_common::cluster::{wire_index, Assignment, LogLevel, PsPeer, Range, RoleKind};
use trainyard_common::cluster::{RoleKey, WorkerPeer};
use trainyard_common::spec::Strategy;
use trainyard_dataplane::handshake::Hello;
use trainyard_dataplane::ps::{self, DataCursor, Message};
use trainyard_dataplane::{plane, DataPlane, EndpointRole};

const LEN: u64 = 46;

/// Shard 0's role `role` (the shard or its standby) of a two-worker job.
fn assignment(plane: &DataPlane, role: RoleKind, consistency: serde_json::Value) -> Assignment {
    let spec: trainyard_common::JobSpec = serde_json::from_value(json!({
        "name": "standby", "model": {"kind": "mlp", "inputs": 8, "hidden": [4], "outputs": 2},
        "dataset": {"kind": "classification", "samples": 100, "features": 8, "classes": 2},
        "loss": "cross_entropy", "optimizer": {"kind": "adam", "lr": 0.01, "grad_clip": 0.5},
        "batch_size": 4, "steps": 10, "strategy": "parameter_server", "replicas": 1,
        "consistency": consistency, "workers": {"min": 2, "max": 2}
    }))
    .unwrap();
    let address = plane.local_addr().to_string();
    let ranges = vec![Range {
        param: "w".into(),
        start: 0,
        end: LEN,
        buffer: false,
    }];
    let peer = |standby| PsPeer {
        shard: 0,
        standby,
        executor_id: uuid::Uuid::nil(),
        address: address.clone(),
        ranges: ranges.clone(),
    };
    Assignment {
        key: RoleKey {
            job_id: uuid::Uuid::from_u128(7),
            generation: 3,
            role,
            index: 0,
        },
        device: None,
        strategy: Strategy::ParameterServer,
        secret: "s3cret".into(),
        spec: spec.into(),
        workers: (0..2)
            .map(|rank| WorkerPeer {
                rank,
                executor_id: uuid::Uuid::nil(),
                address: address.clone(),
                device: 0,
            })
            .collect(),
        parameter_servers: vec![peer(false), peer(true)],
        resume: None,
    }
}

/// A connection to `to` as `from`, speaking the PS protocol.
fn dial(plane: &DataPlane, from: u32, to: u32) -> TcpStream {
    dial_at(plane, from, to, 3)
}

/// [`dial`] in `generation`.
fn dial_at(plane: &DataPlane, from: u32, to: u32, generation: i64) -> TcpStream {
    let hello = Hello {
        job: uuid::Uuid::from_u128(7),
        generation,
        kind: EndpointRole::ParameterServer as u8,
        from,
        to,
    };
    let s = plane::connect(
        &plane.local_addr().to_string(),
        &hello,
        b"s3cret",
        Instant::now() + Duration::from_secs(10),
        &AtomicBool::new(false),
    )
    .unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    s
}

/// Sends `m` in generation 3 and reads the answer (values into `buf`).
fn call(s: &mut TcpStream, m: Message, payload: &[f32], buf: &mut Vec<f32>) -> Message {
    call_at(s, 3, m, payload, buf)
}

/// [`call`] in `generation`.
fn call_at(
    s: &mut TcpStream,
    generation: i64,
    m: Message,
    payload: &[f32],
    buf: &mut Vec<f32>,
) -> Message {
    ps::write_message(s, generation, &m, payload).unwrap();
    let reply = ps::read_message(s).unwrap();
    assert_eq!(reply.generation, generation);
    if reply.message.carries_values() {
        ps::read_values(s, &reply, LEN as usize, buf).unwrap();
    }
    reply.message
}

fn pull(at_least: u64) -> Message {
    Message::Pull { at_least }
}

/// Worker `r`'s push of a gradient computed at `version` (4 samples).
fn push_at(version: u64, r: u32) -> (Message, Vec<f32>) {
    let push = Message::Push {
        computed_at: version,
        samples: 4,
        lr: 0.01,
        next_cursor: DataCursor {
            epoch: 0,
            offset: (version + 1) * 8,
        },
        checkpoint: None,
    };
    (push, grad(version as u32 * 2 + r))
}

fn init(values: &[f32]) -> (Message, &[f32]) {
    let m = Message::Init {
        version: 0,
        cursor: DataCursor::default(),
    };
    (m, values)
}

/// The version of a `Weights`, `Ack` or `Rejected` answer.
fn version(m: Message) -> u64 {
    match m {
        Message::Weights { version, .. }
        | Message::Ack { version, .. }
        | Message::Rejected { version } => version,
        other => panic!("no version in {other:?}"),
    }
}

fn acked(m: Message) -> bool {
    matches!(m, Message::Ack { .. })
}

fn grad(seed: u32) -> Vec<f32> {
    (0..LEN as u32)
        .map(|i| ((i * 7919 + seed * 104_729) % 1000) as f32 / 997.0 - 0.5)
        .collect()
}

/// Two workers train three sync steps (and three async ones) through a
/// shard with a standby: the standby ends with the shard's very bits
/// (values, Adam's moments and step count, version, cursor), and it
/// refuses an update that does not follow from its version.
#[test]
fn a_standby_ends_with_the_shards_very_bits_and_refuses_an_update_it_cannot_follow() {
    for consistency in [json!("sync"), json!("async")] {
        let plane = DataPlane::bind("127.0.0.1:0").unwrap();
        let primary = assignment(&plane, RoleKind::Ps, consistency.clone());
        let standby = assignment(&plane, RoleKind::Standby, consistency.clone());
        let (tx, _rx) = tokio::sync::mpsc::unbounded_channel();
        let stop = AtomicBool::new(false);
        let init_values: Vec<f32> = (0..LEN).map(|i| i as f32 / 100.0).collect();
        let (shard, copy) = std::thread::scope(|scope| {
            let sb = scope.spawn(|| serve_standby(&standby, 0, &stop, &tx, &plane, None));
            let pr = scope.spawn(|| {
                serve_shard(
                    &primary,
                    &stop,
                    &tx,
                    &plane,
                    None,
                    crate::storage::no_storage(),
                    &Context::for_tests(),
                )
            });
            let mut w: Vec<TcpStream> = (0..2).map(|r| dial(&plane, r, 0)).collect();
            let mut buf = Vec::new();
            let (m, values) = init(&init_values);
            let ack = call(&mut w[0], m, values, &mut buf);
            assert!(
                matches!(
                    ack,
                    Message::Ack {
                        values_taken: true,
                        ..
                    }
                ),
                "{ack:?}"
            );
            for step in 0..3u32 {
                for (r, link) in w.iter_mut().enumerate() {
                    let at_least = if consistency == "sync" {
                        u64::from(step)
                    } else {
                        0
                    };
                    let got = call(link, pull(at_least), &[], &mut buf);
                    assert!(matches!(got, Message::Weights { .. }), "{got:?}");
                    let push = Message::Push {
                        computed_at: version(got),
                        samples: 4,
                        lr: 0.01,
                        next_cursor: DataCursor {
                            epoch: 0,
                            offset: u64::from(step + 1) * 8,
                        },
                        checkpoint: None,
                    };
                    let g = grad(step * 2 + r as u32);
                    assert!(acked(call(link, push, &g, &mut buf)));
                }
            }
            // The latest version is published: the standby has it.
            let want = if consistency == "sync" { 3 } else { 6 };
            let last = call(&mut w[0], pull(want), &[], &mut buf);
            assert!(matches!(last, Message::Weights { .. }), "{last:?}");
            // An update the standby cannot follow is refused.
            let mut odd = dial(&plane, 0, wire_index(RoleKind::Standby, 0));
            let update = Message::Update {
                before: 999,
                samples: 0,
                lr: 0.0,
                cursor: DataCursor::default(),
            };
            let reply = call(&mut odd, update, &grad(9), &mut buf);
            assert_eq!(
                reply,
                Message::Rejected {
                    version: version(last)
                }
            );
            stop.store(true, Ordering::Relaxed);
            (pr.join().unwrap().unwrap(), sb.join().unwrap().unwrap())
        });
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        let (a, b) = (shard.weights.unwrap(), copy.weights.unwrap());
        assert_eq!(bits(&a), bits(&b), "{consistency}");
        assert_ne!(bits(&a), bits(&init_values));
        for (x, y) in shard.opt.state().iter().zip(copy.opt.state()) {
            assert_eq!(bits(x), bits(y));
        }
        assert_eq!(shard.opt.t, copy.opt.t);
        assert_eq!(shard.version, copy.version);
        assert_eq!(
            (shard.cursor.epoch, shard.cursor.offset),
            (copy.cursor.epoch, copy.cursor.offset)
        );
        let want = if consistency == "sync" { 3 } else { 6 };
        assert_eq!(shard.version, want, "{consistency}");
    }
}

/// The primary dies after its standby applied an update but before
/// the last worker read its acknowledgement: the standby, promoted (it
/// becomes the shard on its executor at the next generation), serves
/// the version the primary had reached, with the primary's very bits;
/// the worker's push of the version already applied is refused, never
/// applied twice; and the shard trains on. A standby promoted before
/// it ever received state says so in an error-level line.
#[test]
fn a_promoted_standby_serves_the_applied_version_and_never_applies_a_push_twice() {
    let plane = DataPlane::bind("127.0.0.1:0").unwrap();
    let primary = assignment(&plane, RoleKind::Ps, json!("sync"));
    let standby = assignment(&plane, RoleKind::Standby, json!("sync"));
    let (tx, _rx) = tokio::sync::mpsc::unbounded_channel();
    let stop = AtomicBool::new(false);
    let init_values: Vec<f32> = (0..LEN).map(|i| i as f32 / 100.0).collect();
    let (dead, copy) = std::thread::scope(|scope| {
        let sb = scope.spawn(|| serve_standby(&standby, 0, &stop, &tx, &plane, None));
        let pr = scope.spawn(|| {
            serve_shard(
                &primary,
                &stop,
                &tx,
                &plane,
                None,
                crate::storage::no_storage(),
                &Context::for_tests(),
            )
        });
        let mut w: Vec<TcpStream> = (0..2).map(|r| dial(&plane, r, 0)).collect();
        let mut buf = Vec::new();
        let (m, values) = init(&init_values);
        call(&mut w[0], m, values, &mut buf);
        let (m, g) = push_at(0, 0);
        assert!(acked(call(&mut w[0], m, &g, &mut buf)));
        // The last push completes version 1; its answer is never read.
        let (m, g) = push_at(0, 1);
        ps::write_message(&mut w[1], 3, &m, &g).unwrap();
        // Version 1 exists once the standby has it.
        assert_eq!(version(call(&mut w[0], pull(1), &[], &mut buf)), 1);
        stop.store(true, Ordering::Relaxed);
        (pr.join().unwrap().unwrap(), sb.join().unwrap().unwrap())
    });
    assert_eq!((dead.version, copy.version), (1, 1));

    // Generation 4: the standby's executor holds the shard, no standby.
    let mut promoted = assignment(&plane, RoleKind::Ps, json!("sync"));
    promoted.key.generation = 4;
    promoted.parameter_servers.retain(|p| !p.standby);
    let stop = AtomicBool::new(false);
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let shard = std::thread::scope(|scope| {
        let sh = scope.spawn(|| {
            serve_shard(
                &promoted,
                &stop,
                &tx,
                &plane,
                Some(copy),
                crate::storage::no_storage(),
                &Context::for_tests(),
            )
        });
        let mut w: Vec<TcpStream> = (0..2).map(|r| dial_at(&plane, r, 0, 4)).collect();
        let mut buf = Vec::new();
        let got = call_at(&mut w[1], 4, pull(0), &[], &mut buf);
        assert!(
            matches!(got, Message::Weights { version: 1, .. }),
            "{got:?}"
        );
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&buf), bits(dead.weights.as_ref().unwrap()));
        // The push whose acknowledgement was lost, again: refused.
        let (m, g) = push_at(0, 1);
        let again = call_at(&mut w[1], 4, m, &g, &mut buf);
        assert_eq!(again, Message::Rejected { version: 1 });
        // Training goes on from version 1.
        for (r, link) in w.iter_mut().enumerate() {
            let (m, g) = push_at(1, r as u32);
            assert!(acked(call_at(link, 4, m, &g, &mut buf)));
        }
        assert_eq!(version(call_at(&mut w[0], 4, pull(2), &[], &mut buf)), 2);
        stop.store(true, Ordering::Relaxed);
        sh.join().unwrap().unwrap()
    });
    assert_eq!((shard.version, shard.applied), (2, 2));
    let mut errors = || {
        let mut out = Vec::new();
        while let Ok(item) = rx.try_recv() {
            if let Item::Log(LogLevel::Error, m) = item {
                out.push(m);
            }
        }
        out
    };
    assert!(errors().is_empty());

    // A standby that never got its shard's state, promoted.
    let mut empty = Shard::new(&promoted, shard.ranges.clone());
    empty.was_standby = true;
    let stop = AtomicBool::new(true);
    serve_shard(
        &promoted,
        &stop,
        &tx,
        &plane,
        Some(empty),
        crate::storage::no_storage(),
        &Context::for_tests(),
    );
    let errors = errors();
    assert!(
        errors
            .iter()
            .any(|m| m.contains("never received the shard's state")),
        "{errors:?}"
    );
}

/// A whole state sent out of order, or a payload of the wrong length,
/// ends the connection without touching the standby's state.
#[test]
fn a_standby_refuses_malformed_state() {
    let plane = DataPlane::bind("127.0.0.1:0").unwrap();
    let standby = assignment(&plane, RoleKind::Standby, json!("sync"));
    let (tx, _rx) = tokio::sync::mpsc::unbounded_channel();
    let stop = AtomicBool::new(false);
    let copy = std::thread::scope(|scope| {
        let sb = scope.spawn(|| serve_standby(&standby, 0, &stop, &tx, &plane, None));
        // Part 1 of 3 before part 0.
        let state = |part| Message::State {
            version: 0,
            cursor: DataCursor::default(),
            optimizer_steps: 0,
            part,
            parts: 3,
        };
        let mut s = dial(&plane, 0, wire_index(RoleKind::Standby, 0));
        ps::write_message(&mut s, 3, &state(1), &vec![1.0; LEN as usize]).unwrap();
        assert!(ps::read_message(&mut s).is_err());
        // Part 0 one value short.
        let mut s = dial(&plane, 0, wire_index(RoleKind::Standby, 0));
        ps::write_message(&mut s, 3, &state(0), &vec![1.0; LEN as usize - 1]).unwrap();
        assert!(ps::read_message(&mut s).is_err());
        // A worker's message.
        let mut s = dial(&plane, 0, wire_index(RoleKind::Standby, 0));
        ps::write_message(&mut s, 3, &pull(0), &[]).unwrap();
        assert!(ps::read_message(&mut s).is_err());
        stop.store(true, Ordering::Relaxed);
        sb.join().unwrap().unwrap()
    });
    assert!(copy.weights.is_none());
}

/// Replication runs off the shard's lock: while the standby is slow to
/// take an update (the test hook holds each one back), a pull of the
/// version already published is answered at once, a pull of the new
/// version and the push that made it wait for the standby, and the
/// standby has the version before anyone sees it.
#[test]
fn a_slow_standby_holds_back_only_the_versions_it_has_not_acknowledged() {
    let pause = Duration::from_millis(1500);
    let plane = DataPlane::bind("127.0.0.1:0").unwrap();
    let primary = assignment(&plane, RoleKind::Ps, json!("async"));
    let standby = assignment(&plane, RoleKind::Standby, json!("async"));
    let (tx, _rx) = tokio::sync::mpsc::unbounded_channel();
    let stop = AtomicBool::new(false);
    let mut ctx = Context::for_tests();
    ctx.hooks.slow_standby = Some((0, pause));
    let init_values: Vec<f32> = (0..LEN).map(|i| i as f32 / 100.0).collect();
    let (shard, copy) = std::thread::scope(|scope| {
        let sb = scope.spawn(|| serve_standby(&standby, 0, &stop, &tx, &plane, None));
        let pr = scope.spawn(|| {
            serve_shard(
                &primary,
                &stop,
                &tx,
                &plane,
                None,
                crate::storage::no_storage(),
                &ctx,
            )
        });
        let mut w: Vec<TcpStream> = (0..2).map(|r| dial(&plane, r, 0)).collect();
        let mut buf = Vec::new();
        let (m, values) = init(&init_values);
        call(&mut w[0], m, values, &mut buf);
        assert_eq!(version(call(&mut w[1], pull(0), &[], &mut buf)), 0);
        // Worker 0's push makes version 1, which the standby takes late.
        let (m, g) = push_at(0, 0);
        let mut w0 = w.remove(0);
        let pushed = Instant::now();
        let pusher = scope.spawn(move || {
            let mut buf = Vec::new();
            let answer = call(&mut w0, m, &g, &mut buf);
            (answer, pushed.elapsed())
        });
        std::thread::sleep(Duration::from_millis(200));
        let asked = Instant::now();
        let got = call(&mut w[0], pull(0), &[], &mut buf);
        assert!(
            asked.elapsed() < pause / 2,
            "a pull of the published version waited {:?} for the standby",
            asked.elapsed()
        );
        assert_eq!(version(got), 0, "version 1 is not published yet");
        assert_eq!(bits(&buf), bits(&init_values));
        let got = call(&mut w[0], pull(1), &[], &mut buf);
        assert_eq!(version(got), 1);
        let (answer, took) = pusher.join().unwrap();
        assert_eq!(version(answer), 1);
        assert!(acked(answer));
        assert!(
            took >= pause,
            "acknowledged after {took:?}, before the standby had it"
        );
        stop.store(true, Ordering::Relaxed);
        (pr.join().unwrap().unwrap(), sb.join().unwrap().unwrap())
    });
    assert_eq!((shard.version, copy.version), (1, 1));
    assert_eq!(
        bits(shard.weights.as_ref().unwrap()),
        bits(copy.weights.as_ref().unwrap())
    );
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// The step rank 0 flags is checkpointed with the values the flagged
/// version produced, once the standby has that version; a draining
/// executor's shard asks rank 0 (and only rank 0) for a checkpoint, once.
#[test]
fn a_flagged_version_is_checkpointed_once_replicated_and_a_drain_asks_rank_0_once() {
    let dir = std::env::temp_dir().join(format!("ty-ps-ckpt-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let cache = Arc::new(trainyard_store::cache::Cache::open(&dir.join("cache"), 1 << 20).unwrap());
    let storage = crate::storage::Storage::open(
        &format!("file://{}", dir.join("store").display()),
        &[],
        cache,
        rt.handle().clone(),
    )
    .unwrap();
    let plane = DataPlane::bind("127.0.0.1:0").unwrap();
    let primary = assignment(&plane, RoleKind::Ps, json!("sync"));
    let standby = assignment(&plane, RoleKind::Standby, json!("sync"));
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let stop = AtomicBool::new(false);
    let ctx = Context::for_tests();
    ctx.drain.start();
    let init_values: Vec<f32> = (0..LEN).map(|i| i as f32 / 100.0).collect();
    let (shard, copy) = std::thread::scope(|scope| {
        let sb = scope.spawn(|| serve_standby(&standby, 0, &stop, &tx, &plane, None));
        let pr = scope.spawn(|| {
            serve_shard(
                &primary,
                &stop,
                &tx,
                &plane,
                None,
                Ok(Arc::new(storage)),
                &ctx,
            )
        });
        let mut w: Vec<TcpStream> = (0..2).map(|r| dial(&plane, r, 0)).collect();
        let mut buf = Vec::new();
        let (m, values) = init(&init_values);
        call(&mut w[0], m, values, &mut buf);
        let mut asks = Vec::new();
        for step in 0..2u64 {
            for (r, link) in w.iter_mut().enumerate() {
                assert_eq!(version(call(link, pull(step), &[], &mut buf)), step);
                let (mut m, g) = push_at(step, r as u32);
                if let Message::Push { checkpoint, .. } = &mut m {
                    *checkpoint = std::num::NonZeroU64::new(1);
                }
                match call(link, m, &g, &mut buf) {
                    Message::Ack {
                        checkpoint_wanted, ..
                    } => asks.push((r, checkpoint_wanted)),
                    other => panic!("{other:?}"),
                }
            }
        }
        // Rank 0's first answer asks; nobody else's, and never again.
        assert_eq!(asks, [(0, true), (1, false), (0, false), (1, false)]);
        stop.store(true, Ordering::Relaxed);
        (pr.join().unwrap().unwrap(), sb.join().unwrap().unwrap())
    });
    assert_eq!((shard.version, copy.version), (2, 2));
    let mut checkpoints = Vec::new();
    while let Ok(item) = rx.try_recv() {
        if let Item::Checkpoint(c) = item {
            checkpoints.push(c);
        }
    }
    // Step 1, flagged twice (by the version it completes and the next),
    // is written once, by the version that completed it.
    assert_eq!(checkpoints.len(), 1, "{checkpoints:?}");
    let c = &checkpoints[0];
    assert_eq!((c.step, c.shard, c.shards, c.state_tensors), (1, 0, 1, 2));
    let _ = std::fs::remove_dir_all(&dir);
}
