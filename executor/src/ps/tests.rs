//! The PS unit tests: a shard and its standby over a real data plane
//! (bit-identical copies, promotion without double application, malformed
//! state refused, pulls never waiting behind a slow standby), and a
//! shard's buffer tail (rank 0's values taken as they are, never
//! optimized; replicated and checkpointed with the weights).

use super::shard::Rules;
use super::*;
use crate::context::Context;
use crate::reports::Item;
use serde_json::json;
use std::net::TcpStream;
use std::sync::Arc;
use std::time::{Duration, Instant};
use trainyard_common::cluster::{wire_index, Assignment, LogLevel, PsPeer, Range, RoleKind};
use trainyard_common::cluster::{RoleKey, WorkerPeer};
use trainyard_common::spec::Strategy;
use trainyard_dataplane::handshake::Hello;
use trainyard_dataplane::ps::{self, DataCursor, Message, PushHeader};
use trainyard_dataplane::{plane, DataPlane, EndpointRole};
use trainyard_shutdown::Shutdown;

const LEN: u64 = 46;

/// Elements of the shard's parameter ranges; the rest of its `LEN` are
/// buffers.
const HEAD: usize = 40;

/// The shard's ranges: a parameter, then two buffers (a float one and an
/// integer counter).
fn ranges() -> Vec<Range> {
    let r = |param: &str, end, buffer| Range {
        param: param.into(),
        start: 0,
        end,
        buffer,
    };
    vec![
        r("w", HEAD as u64, false),
        r("bn.running_mean", LEN - HEAD as u64 - 1, true),
        r("bn.num_batches_tracked", 1, true),
    ]
}

/// Shard 0's role `role` (the shard or its standby) of a two-worker job.
fn assignment(plane: &DataPlane, role: RoleKind, consistency: serde_json::Value) -> Assignment {
    let adam = json!({"kind": "adam", "lr": 0.01, "grad_clip": 0.5, "weight_decay": 0.01});
    assignment_with(plane, role, consistency, adam)
}

/// [`assignment`] with another optimizer.
fn assignment_with(
    plane: &DataPlane,
    role: RoleKind,
    consistency: serde_json::Value,
    optimizer: serde_json::Value,
) -> Assignment {
    let spec: trainyard_common::JobSpec = serde_json::from_value(json!({
        "name": "standby", "model": {"kind": "mlp", "inputs": 8, "hidden": [4], "outputs": 2},
        "dataset": {"kind": "classification", "samples": 100, "features": 8, "classes": 2},
        "loss": "cross_entropy", "optimizer": optimizer,
        "batch_size": 4, "steps": 10, "strategy": "parameter_server", "replicas": 1,
        "consistency": consistency, "workers": {"min": 2, "max": 2}
    }))
    .unwrap();
    let address = plane.local_addr().to_string();
    let ranges = ranges();
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
        spec,
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
        data_policy: trainyard_common::artifact::DataPolicy::unrestricted(),
        checkpoint_wanted: false,
        restarts: None,
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
        &Shutdown::new(),
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

/// The header of a push computed at `version` over `samples` samples at
/// `lr`.
fn header(version: u64, samples: u64, lr: f64) -> PushHeader {
    PushHeader {
        computed_at: version,
        samples,
        lr,
        next_cursor: DataCursor::default(),
        checkpoint: None,
    }
}

/// Worker `r`'s push of a gradient computed at `version` (4 samples);
/// rank 0's carries its buffers after `version`'s step.
fn push_at(version: u64, r: u32) -> (Message, Vec<f32>) {
    let push = Message::Push(PushHeader {
        computed_at: version,
        samples: 4,
        lr: 0.01,
        next_cursor: DataCursor {
            epoch: 0,
            offset: (version + 1) * 8,
        },
        checkpoint: None,
    });
    (push, pushed(version as u32 * 2 + r, r, version))
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

/// Rank 0's buffers after step `step`: running means of a few units (far
/// from what an optimizer step or a scaling would leave them) and the
/// integer count of batches, as an exact f32.
fn tail_at(step: u64) -> Vec<f32> {
    let n = LEN as usize - HEAD;
    (0..n)
        .map(|i| {
            if i == n - 1 {
                (step + 1) as f32
            } else {
                3.0 + i as f32 * 0.37 - step as f32 * 0.11
            }
        })
        .collect()
}

/// What worker `rank` pushes at step `step` (as the replica's gradients
/// are): a gradient over the parameters, then rank 0's buffers or the
/// other ranks' zeros.
fn pushed(seed: u32, rank: u32, step: u64) -> Vec<f32> {
    let mut g = grad(seed);
    if rank == 0 {
        g[HEAD..].copy_from_slice(&tail_at(step));
    } else {
        g[HEAD..].fill(0.0);
    }
    g
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
        let stop = Shutdown::new();
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
                    let push = Message::Push(PushHeader {
                        computed_at: version(got),
                        samples: 4,
                        lr: 0.01,
                        next_cursor: DataCursor {
                            epoch: 0,
                            offset: u64::from(step + 1) * 8,
                        },
                        checkpoint: None,
                    });
                    let g = pushed(step * 2 + r as u32, r as u32, u64::from(step));
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
                carries_state: true,
                momentum: None,
            };
            let reply = call(&mut odd, update, &grad(9), &mut buf);
            assert_eq!(
                reply,
                Message::Rejected {
                    version: version(last)
                }
            );
            stop.trigger();
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
        // Both hold rank 0's last buffers, and no optimizer state for them.
        assert_eq!(bits(&a[HEAD..]), bits(&tail_at(2)), "{consistency}");
        for t in shard.opt.state().iter().chain(copy.opt.state()) {
            assert!(t[HEAD..].iter().all(|x| x.to_bits() == 0), "{consistency}");
        }
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
    let stop = Shutdown::new();
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
        stop.trigger();
        (pr.join().unwrap().unwrap(), sb.join().unwrap().unwrap())
    });
    assert_eq!((dead.version, copy.version), (1, 1));
    // The standby holds version 1 either as the replayed update (applied 1)
    // or, where it connected after the primary applied it, as the whole
    // state (applied 0): the count to compare with is its own.
    let copied = copy.applied;

    // Generation 4: the standby's executor holds the shard, no standby.
    let mut promoted = assignment(&plane, RoleKind::Ps, json!("sync"));
    promoted.key.generation = 4;
    promoted.parameter_servers.retain(|p| !p.standby);
    let stop = Shutdown::new();
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
        assert_eq!(bits(&buf[HEAD..]), bits(&tail_at(0)), "rank 0's buffers");
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
        stop.trigger();
        sh.join().unwrap().unwrap()
    });
    assert_eq!((shard.version, shard.applied), (2, copied + 1));
    let w = shard.weights.as_ref().unwrap();
    assert_eq!(bits(&w[HEAD..]), bits(&tail_at(1)));
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
    let mut empty = Shard::new(&promoted, shard.ranges.clone()).unwrap();
    empty.was_standby = true;
    let stop = Shutdown::triggered();
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
    let stop = Shutdown::new();
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
        stop.trigger();
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
    let stop = Shutdown::new();
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
        stop.trigger();
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
    let stop = Shutdown::new();
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
                if let Message::Push(p) = &mut m {
                    p.checkpoint = std::num::NonZeroU64::new(1);
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
        stop.trigger();
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

/// A shard of `ranges` for assignment `a`, holding `init`.
fn seeded(a: &Assignment, init: &[f32]) -> Shard {
    let mut shard = Shard::new(a, ranges()).unwrap();
    shard.weights = Some(Arc::new(init.to_vec()));
    shard
}

fn initial() -> Vec<f32> {
    (0..LEN).map(|i| i as f32 / 100.0).collect()
}

/// A sync round, with every optimizer (weight decay on) and either push
/// order: the parameters move exactly as the same optimizer moves them
/// alone (scaled by the samples, clipped by their own norm), the buffers
/// become rank 0's pushed values exactly, and no optimizer state grows
/// over them.
#[test]
fn a_sync_round_takes_rank_0s_buffers_as_they_are_and_optimizes_only_the_parameters() {
    use crate::replica::optim::{slice_norm, SliceOptimizer};
    let plane = DataPlane::bind("127.0.0.1:0").unwrap();
    for kind in ["sgd", "momentum", "adam", "adamw"] {
        let optimizer = json!({"kind": kind, "lr": 0.05, "grad_clip": 0.5, "weight_decay": 0.1});
        let a = assignment_with(&plane, RoleKind::Ps, json!("sync"), optimizer);
        let clip = a.spec.optimizer().grad_clip.unwrap();
        for order in [[0u32, 1], [1, 0]] {
            let mut shard = seeded(&a, &initial());
            assert_eq!(shard.head, HEAD);
            let mut reference = initial()[..HEAD].to_vec();
            let mut opt = SliceOptimizer::new(a.spec.optimizer(), HEAD);
            for step in 0..3u64 {
                let g: Vec<Vec<f32>> = (0..2)
                    .map(|r| pushed(step as u32 * 2 + r, r, step))
                    .collect();
                for (i, &r) in order.iter().enumerate() {
                    let t = shard.take(
                        &Rules::of(&a.spec),
                        r,
                        &header(step, 4, 0.05),
                        &g[r as usize],
                    );
                    assert!(t.accepted);
                    assert_eq!(t.produced, (i == 1).then_some(step + 1));
                }
                // The last push with the first one's sum, over 8 samples.
                let (first, last) = (&g[order[0] as usize][..HEAD], &g[order[1] as usize][..HEAD]);
                let mut scale = 1.0 / 8.0;
                let coef = clip / (slice_norm(last, Some(first), scale) + 1e-6);
                if coef < 1.0 {
                    scale *= coef;
                }
                opt.step(&mut reference, last, Some(first), scale as f32, 0.05);
                let w = shard.weights.as_ref().unwrap();
                assert_eq!(
                    bits(&w[..HEAD]),
                    bits(&reference),
                    "{kind} {order:?} step {step}"
                );
                assert_eq!(
                    bits(&w[HEAD..]),
                    bits(&tail_at(step)),
                    "{kind} {order:?} step {step}"
                );
            }
            for t in shard.opt.state() {
                assert!(t[HEAD..].iter().all(|x| x.to_bits() == 0), "{kind}");
            }
        }
    }
}

/// Async and bounded: a push of another rank than 0 leaves the buffers
/// as they are (whatever its tail holds), while it trains the parameters;
/// rank 0's push replaces them.
#[test]
fn in_async_modes_only_rank_0s_push_replaces_the_buffers() {
    use trainyard_common::spec::Consistency;
    let plane = DataPlane::bind("127.0.0.1:0").unwrap();
    for (mode, c) in [
        (json!("async"), Consistency::Async),
        (
            json!({"bounded": {"staleness": 4}}),
            Consistency::Bounded { staleness: 4 },
        ),
    ] {
        let a = assignment(&plane, RoleKind::Ps, mode);
        assert_eq!(a.spec.consistency_mode(), c);
        let init = initial();
        let mut shard = seeded(&a, &init);
        let take = |shard: &mut Shard, from: u32, g: &[f32]| {
            let version = shard.version;
            let rules = Rules {
                clip: Some(0.5),
                ..Rules::of(&a.spec)
            };
            let t = shard.take(&rules, from, &header(version, 4, 0.01), g);
            assert_eq!(t.produced, Some(version + 1), "{c:?}");
        };
        // Even a rank 1 that sent values there changes no buffer.
        let mut g = grad(1);
        g[HEAD..].fill(99.0);
        take(&mut shard, 1, &g);
        let w = shard.weights.clone().unwrap();
        assert_ne!(bits(&w[..HEAD]), bits(&init[..HEAD]), "{c:?}");
        assert_eq!(bits(&w[HEAD..]), bits(&init[HEAD..]), "{c:?}");
        take(&mut shard, 0, &pushed(2, 0, 7));
        assert_eq!(
            bits(&shard.weights.as_ref().unwrap()[HEAD..]),
            bits(&tail_at(7))
        );
        take(&mut shard, 1, &pushed(3, 1, 8));
        assert_eq!(
            bits(&shard.weights.as_ref().unwrap()[HEAD..]),
            bits(&tail_at(7))
        );
        assert_eq!(shard.version, 3);
    }
}

/// An async push of no samples (a worker whose share of an epoch's last
/// step was empty) moves no weight: an Adam step on zeros would, along its
/// momentum, where PyTorch takes no step at all.
#[test]
fn an_empty_async_push_takes_no_optimizer_step() {
    use trainyard_common::spec::Consistency;
    let plane = DataPlane::bind("127.0.0.1:0").unwrap();
    let a = assignment(&plane, RoleKind::Ps, json!("async"));
    let mut shard = seeded(&a, &initial());
    let rules = Rules::of(&a.spec);
    assert_eq!(rules.consistency, Consistency::Async);
    let t = shard.take(&rules, 1, &header(0, 4, 0.01), &grad(1));
    assert_eq!(t.produced, Some(1));
    let (w, steps) = (shard.weights.clone().unwrap(), shard.opt.t);
    let zeros = vec![0f32; w.len()];
    let t = shard.take(&rules, 1, &header(1, 0, 0.01), &zeros);
    assert_eq!(t.produced, Some(2), "the version still moves");
    assert_eq!(bits(&shard.weights.as_ref().unwrap()[..]), bits(&w[..]));
    assert_eq!(shard.opt.t, steps);
}

/// A checkpoint of a shard with buffers holds its weights with the
/// buffers and optimizer state that is zero over them; it restores the
/// very values into a shard of the same ranges, and into a shard of the
/// buffers alone.
#[test]
fn a_checkpoint_of_a_shards_buffers_restores_them_exactly() {
    use crate::storage::checkpoint::{load, Uploader};
    use trainyard_common::checkpoint::{manifest_key, CheckpointRef, Manifest};
    let dir = std::env::temp_dir().join(format!("ty-ps-buffers-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let cache = Arc::new(trainyard_store::cache::Cache::open(&dir.join("cache"), 1 << 20).unwrap());
    let st = Arc::new(
        crate::storage::Storage::open(
            &format!("file://{}", dir.join("store").display()),
            &[],
            cache,
            rt.handle().clone(),
        )
        .unwrap(),
    );
    let plane = DataPlane::bind("127.0.0.1:0").unwrap();
    let a = assignment(&plane, RoleKind::Ps, json!("sync"));
    let mut shard = seeded(&a, &initial());
    for step in 0..2u64 {
        for r in 0..2 {
            let g = pushed(step as u32 * 2 + r, r, step);
            shard.take(&Rules::of(&a.spec), r, &header(step, 4, 0.01), &g);
        }
    }
    let snap = shard.snapshot(2, 0, 1, LEN).expect("a snapshot of step 2");
    assert_eq!(snap.tensors.len(), 3, "weights and Adam's two moments");
    assert_eq!(bits(&snap.tensors[0][HEAD..]), bits(&tail_at(1)));
    for t in &snap.tensors[1..] {
        assert!(t[..HEAD].iter().any(|x| *x != 0.0));
        assert!(t[HEAD..].iter().all(|x| x.to_bits() == 0));
    }
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let job = a.key.job_id;
    let u = Uploader::start(st.clone(), job, tx, Context::for_tests().uploads, None);
    u.submit(snap);
    assert!(u.flush(Duration::from_secs(10)));
    let mut reports = Vec::new();
    while let Ok(item) = rx.try_recv() {
        if let Item::Checkpoint(c) = item {
            reports.push(c);
        }
    }
    assert_eq!(reports[0].ranges, ranges(), "the buffer marks are kept");
    let m = Manifest::from_reports(job, &reports).expect("a complete checkpoint");
    st.put(
        &manifest_key(job, 2),
        serde_json::to_vec(&m).unwrap().into(),
    )
    .unwrap();
    let at = CheckpointRef {
        job_id: job,
        step: 2,
        manifest: manifest_key(job, 2),
    };
    let loaded = load(&st, &at, &ranges(), LEN, 2).unwrap();
    let mut back = Shard::new(&a, ranges()).unwrap();
    back.restore(&loaded);
    assert_eq!(back.version, 2);
    assert_eq!(back.opt.t, shard.opt.t);
    assert_eq!(
        bits(back.weights.as_ref().unwrap()),
        bits(shard.weights.as_ref().unwrap())
    );
    for (x, y) in back.opt.state().iter().zip(shard.opt.state()) {
        assert_eq!(bits(x), bits(y));
    }
    // A shard of the buffers alone (another shard count) takes them.
    let tail = ranges()[1..].to_vec();
    let loaded = load(&st, &at, &tail, LEN, 2).unwrap();
    assert_eq!(bits(&loaded.tensors[0]), bits(&tail_at(1)));
    let mut only = Shard::new(&a, tail).unwrap();
    assert_eq!(only.head, 0);
    only.restore(&loaded);
    assert_eq!(bits(only.weights.as_ref().unwrap()), bits(&tail_at(1)));
    assert!(only.opt.state().iter().flatten().all(|x| x.to_bits() == 0));
    let _ = std::fs::remove_dir_all(&dir);
}

/// Ranges whose buffer range comes before a parameter range are refused
/// with the ranges named; a shard server given them fails its job rather
/// than serving values it would optimize wrongly.
#[test]
fn a_shard_refuses_a_buffer_range_before_a_parameter_range() {
    let plane = DataPlane::bind("127.0.0.1:0").unwrap();
    let mut a = assignment(&plane, RoleKind::Ps, json!("sync"));
    let mut bad = ranges();
    bad.rotate_left(1);
    assert_eq!(super::ranges::buffer_offset(&ranges()), Ok(HEAD));
    let e = Shard::new(&a, bad.clone())
        .err()
        .expect("refused")
        .to_string();
    assert!(
        e.contains("ranges[0] (bn.running_mean[0..5]) is a buffer range before the parameter range ranges[2] (w[0..40])"),
        "{e}"
    );
    for p in &mut a.parameter_servers {
        p.ranges = bad.clone();
    }
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let stop = Shutdown::triggered();
    let out = serve_shard(
        &a,
        &stop,
        &tx,
        &plane,
        None,
        crate::storage::no_storage(),
        &Context::for_tests(),
    );
    assert!(out.is_none());
    let mut failed = Vec::new();
    while let Ok(item) = rx.try_recv() {
        if let Item::Outcome(trainyard_common::cluster::RoleOutcome::Failed { reason }) = item {
            failed.push(reason);
        }
    }
    assert!(
        failed.len() == 1 && failed[0].contains("is a buffer range before"),
        "{failed:?}"
    );
}

/// Out of sync, a stale push is applied by the job's `stale_updates`:
/// `share`'s rate `lr / M` with the spec's momentum (the defaults), a
/// `momentum` optimizer's momentum less asynchrony's own (the mean
/// staleness so far), `scale`'s rate `lr / (1 + s)`, DC-ASGD's term
/// against the values the push was computed on; each exactly as the same
/// optimizer applies it alone.
#[test]
fn a_stale_async_push_is_applied_by_the_staleness_aware_rules() {
    use super::stale::{compensate, momentum, MeanStaleness};
    use crate::replica::optim::SliceOptimizer;
    use trainyard_common::spec::{AsyncMomentum, StaleLr};
    let plane = DataPlane::bind("127.0.0.1:0").unwrap();
    let optimizer = json!({"kind": "momentum", "lr": 0.05, "momentum": 0.9});
    let a = assignment_with(&plane, RoleKind::Ps, json!("async"), optimizer);
    let workers = a.workers.len() as u32;
    assert!(workers > 1, "a share is a part of a step");
    for (lr_rule, mu_rule, lambda) in [
        (StaleLr::Share, AsyncMomentum::AsGiven, 0.0),
        (StaleLr::Plain, AsyncMomentum::Compensate, 0.0),
        (StaleLr::Scale, AsyncMomentum::Compensate, 0.5),
    ] {
        let rules = Rules {
            stale: trainyard_common::spec::StaleUpdates {
                lr: lr_rule,
                momentum: mu_rule,
                delay_compensation: lambda,
                ..Default::default()
            },
            ..Rules::of(&a.spec)
        };
        assert_eq!(rules.momentum, Some(0.9));
        if (lr_rule, mu_rule) == (StaleLr::Share, AsyncMomentum::AsGiven) {
            assert_eq!(rules.stale, Rules::of(&a.spec).stale, "the defaults");
        }
        let mut shard = seeded(&a, &initial());
        let mut reference = initial()[..HEAD].to_vec();
        let mut opt = SliceOptimizer::new(a.spec.optimizer(), HEAD);
        let mut mean = MeanStaleness::default();
        let mut history: Vec<Vec<f32>> = vec![reference.clone()];
        // Pushes computed at versions 0, 0, 1, 1, 2: staleness 0, 1, 1, 2, 2.
        for (i, at) in [0u64, 0, 1, 1, 2].into_iter().enumerate() {
            let g = grad(i as u32 + 1);
            let t = shard.take(&rules, 1, &header(at, 4, 0.05), &g);
            assert_eq!(t.produced, Some(i as u64 + 1));
            let s = i as u64 - at;
            let m = mean.record(s);
            let mu = momentum(mu_rule, 0.9, m) as f32;
            let lr = match lr_rule {
                StaleLr::Share => 0.05 / f64::from(workers),
                StaleLr::Plain => 0.05,
                StaleLr::Scale => 0.05 / (1.0 + s as f64),
            };
            let mut gh = g[..HEAD].to_vec();
            if lambda > 0.0 {
                compensate(&mut gh, &reference, &history[at as usize], lambda, 4);
            }
            opt.set_momentum(f64::from(mu));
            opt.step(&mut reference, &gh, None, 0.25, lr);
            history.push(reference.clone());
            let w = shard.weights.as_ref().unwrap();
            assert_eq!(bits(&w[..HEAD]), bits(&reference), "{lr_rule:?} push {i}");
        }
        assert!(shard.mean_staleness.mean() > 1.0);
    }
}

/// Shard 0 counts the workers that walked their share (`until`): a
/// worker's `Done` is counted once however often it says it, the count
/// rides on every `Weights`, and a new generation counts afresh (ranks
/// are dealt again, so each worker says it anew).
#[test]
fn shard_0_counts_each_worker_done_once_per_generation() {
    let plane = DataPlane::bind("127.0.0.1:0").unwrap();
    let mut a = assignment(&plane, RoleKind::Ps, json!("async"));
    a.parameter_servers.retain(|p| !p.standby);
    let (tx, _rx) = tokio::sync::mpsc::unbounded_channel();
    let finished = |m: Message| match m {
        Message::Finished { workers } => workers,
        other => panic!("{other:?}"),
    };
    let on_weights = |m: Message| match m {
        Message::Weights { finished, .. } => finished,
        other => panic!("{other:?}"),
    };
    let stop = Shutdown::new();
    let parked = std::thread::scope(|scope| {
        let sh = scope.spawn(|| {
            let ctx = Context::for_tests();
            serve_shard(
                &a,
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
        let values = initial();
        let (m, values) = init(&values);
        call(&mut w[0], m, values, &mut buf);
        assert_eq!(on_weights(call(&mut w[1], pull(0), &[], &mut buf)), 0);
        assert_eq!(finished(call(&mut w[1], Message::Done, &[], &mut buf)), 1);
        assert_eq!(
            finished(call(&mut w[1], Message::Done, &[], &mut buf)),
            1,
            "once"
        );
        assert_eq!(on_weights(call(&mut w[0], pull(0), &[], &mut buf)), 1);
        assert_eq!(finished(call(&mut w[0], Message::Done, &[], &mut buf)), 2);
        stop.trigger();
        sh.join().unwrap()
    });
    let mut next = a.clone();
    next.key.generation = 4;
    let stop = Shutdown::new();
    std::thread::scope(|scope| {
        let sh = scope.spawn(|| {
            let ctx = Context::for_tests();
            serve_shard(
                &next,
                &stop,
                &tx,
                &plane,
                parked,
                crate::storage::no_storage(),
                &ctx,
            )
        });
        let mut w = dial_at(&plane, 1, 0, 4);
        let mut buf = Vec::new();
        let got = call_at(&mut w, 4, pull(0), &[], &mut buf);
        assert_eq!(on_weights(got), 0, "a new generation counts afresh");
        let got = call_at(&mut w, 4, Message::Done, &[], &mut buf);
        assert_eq!(finished(got), 1);
        stop.trigger();
        sh.join().unwrap();
    });
}

/// Out of sync, shard 0 keeps each rank's place in the data: a worker
/// that asks `Where` gets its rank's place (the cursor after its last
/// accepted push) over any place it kept, a replacement in the next
/// generation goes on from there, the shard's cursor (what its standby and
/// checkpoints carry) is the slowest rank's, and a generation of another
/// number of workers starts every rank at the slowest place.
#[test]
fn shard_0_keeps_each_ranks_place_for_the_next_generation() {
    let plane = DataPlane::bind("127.0.0.1:0").unwrap();
    let mut a = assignment(&plane, RoleKind::Ps, json!("async"));
    a.parameter_servers.retain(|p| !p.standby);
    let (tx, _rx) = tokio::sync::mpsc::unbounded_channel();
    let at = |offset| DataCursor { epoch: 1, offset };
    let place = |m: Message| match m {
        Message::Place { cursor } => cursor,
        other => panic!("{other:?}"),
    };
    let pulled_cursor = |m: Message| match m {
        Message::Weights { cursor, .. } => cursor,
        other => panic!("{other:?}"),
    };
    let push = |version, rank: u32, offset| {
        let m = Message::Push(PushHeader {
            computed_at: version,
            samples: 4,
            lr: 0.01,
            next_cursor: at(offset),
            checkpoint: None,
        });
        (m, pushed(rank + 1, rank, version))
    };
    let serve = |a: &Assignment, stop: &Shutdown, parked| {
        serve_shard(
            a,
            stop,
            &tx,
            &plane,
            parked,
            crate::storage::no_storage(),
            &Context::for_tests(),
        )
    };
    let stop = Shutdown::new();
    let parked = std::thread::scope(|scope| {
        let sh = scope.spawn(|| serve(&a, &stop, None));
        let mut w: Vec<TcpStream> = (0..2).map(|r| dial(&plane, r, 0)).collect();
        let mut buf = Vec::new();
        let values = initial();
        let (m, values) = init(&values);
        call(&mut w[0], m, values, &mut buf);
        let fresh = Message::Where { kept: None };
        assert_eq!(
            place(call(&mut w[0], fresh, &[], &mut buf)),
            DataCursor::default()
        );
        assert_eq!(
            place(call(&mut w[1], fresh, &[], &mut buf)),
            DataCursor::default()
        );
        let (m, g) = push(0, 0, 16);
        call(&mut w[0], m, &g, &mut buf);
        let (m, g) = push(1, 0, 32);
        call(&mut w[0], m, &g, &mut buf);
        let (m, g) = push(0, 1, 16);
        call(&mut w[1], m, &g, &mut buf);
        assert_eq!(
            pulled_cursor(call(&mut w[0], pull(0), &[], &mut buf)),
            at(16),
            "the shard's cursor is the slowest rank's"
        );
        stop.trigger();
        sh.join().unwrap()
    });
    // The same two ranks: rank 1's replacement goes on from rank 1's
    // place, and rank 0's place outranks whatever its worker kept.
    let mut next = a.clone();
    next.key.generation = 4;
    let stop = Shutdown::new();
    let parked = std::thread::scope(|scope| {
        let sh = scope.spawn(|| serve(&next, &stop, parked));
        let mut w: Vec<TcpStream> = (0..2).map(|r| dial_at(&plane, r, 0, 4)).collect();
        let mut buf = Vec::new();
        let replacement = Message::Where { kept: None };
        assert_eq!(
            place(call_at(&mut w[1], 4, replacement, &[], &mut buf)),
            at(16)
        );
        let moved = Message::Where {
            kept: Some(at(400)),
        };
        assert_eq!(place(call_at(&mut w[0], 4, moved, &[], &mut buf)), at(32));
        stop.trigger();
        sh.join().unwrap()
    });
    // A third worker joins: the data is sliced in threes, and every rank,
    // the ones that kept a place too, starts at the slowest.
    let mut grown = a.clone();
    grown.key.generation = 5;
    let mut third = grown.workers[1].clone();
    third.rank = 2;
    grown.workers.push(third);
    let stop = Shutdown::new();
    std::thread::scope(|scope| {
        let sh = scope.spawn(|| serve(&grown, &stop, parked));
        let mut w: Vec<TcpStream> = (0..3).map(|r| dial_at(&plane, r, 0, 5)).collect();
        let mut buf = Vec::new();
        for (r, kept) in [(0, Some(at(32))), (1, Some(at(16))), (2, None)] {
            let got = call_at(&mut w[r], 5, Message::Where { kept }, &[], &mut buf);
            assert_eq!(place(got), at(16), "rank {r}");
        }
        stop.trigger();
        sh.join().unwrap();
    });
}

/// Out of sync, a shard's checkpoint carries the slowest rank's place (its
/// cursor follows the places its pushes leave), and a shard restored from
/// it starts a fresh worker there, whatever its rank, and a worker that
/// kept its replica at its own place: a resumed job trains no sample of
/// any share less than the job it resumes.
#[test]
fn an_async_checkpoint_carries_the_slowest_place_and_a_restored_shard_resumes_there() {
    let plane = DataPlane::bind("127.0.0.1:0").unwrap();
    let a = assignment(&plane, RoleKind::Ps, json!("async"));
    let rules = Rules::of(&a.spec);
    let mut shard = seeded(&a, &initial());
    let at = |epoch, offset| crate::data::Cursor { epoch, offset };
    let wire = |c: crate::data::Cursor| DataCursor {
        epoch: c.epoch,
        offset: c.offset,
    };
    for r in 0..2 {
        assert_eq!(shard.place(r, None), at(0, 0));
    }
    // Rank 0 runs ahead of rank 1.
    for (version, r, next) in [(0, 0, at(0, 16)), (1, 0, at(1, 0)), (1, 1, at(0, 48))] {
        let mut h = header(version, 4, 0.01);
        h.next_cursor = wire(next);
        let taken = shard.take(&rules, r, &h, &pushed(r + 1, r, version));
        assert!(taken.accepted);
    }
    assert_eq!(shard.place(0, None), at(1, 0), "rank 0's own place");
    assert_eq!(shard.place(1, None), at(0, 48), "rank 1's own place");
    let snap = shard.snapshot(3, 0, 1, LEN).expect("a snapshot");
    assert_eq!(
        (snap.cursor.epoch, snap.cursor.offset),
        (0, 48),
        "the slowest place"
    );
    let loaded = crate::storage::checkpoint::Loaded {
        tensors: snap.tensors.clone(),
        step: snap.step,
        cursor: snap.cursor,
        optimizer_t: snap.optimizer_t,
    };
    let mut back = Shard::new(&a, ranges()).unwrap();
    back.restore(&loaded);
    assert_eq!(
        back.place(0, None),
        at(0, 48),
        "a fresh rank 0 at the slowest place"
    );
    assert_eq!(
        back.place(1, Some(at(0, 80))),
        at(0, 80),
        "a kept worker at its own"
    );
}
