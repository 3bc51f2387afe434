//! In-process rings: exact sums for awkward lengths on both paths, bf16
//! agreement, and a dead neighbour breaking the collective promptly.

use super::*;
use proptest::prelude::*;

fn rings(n: usize, segment: usize) -> (Vec<DataPlane>, Vec<Ring>) {
    let planes: Vec<DataPlane> = (0..n)
        .map(|_| DataPlane::bind("127.0.0.1:0").unwrap())
        .collect();
    let peers: Vec<String> = planes.iter().map(|p| p.local_addr().to_string()).collect();
    let job = Uuid::new_v4();
    let handles: Vec<_> = (0..n)
        .map(|r| {
            let cfg = RingConfig {
                job,
                generation: 1,
                rank: r as u32,
                peers: peers.clone(),
                secret: b"secret".to_vec(),
                connect_timeout: Duration::from_secs(10),
                collective_timeout: Duration::from_secs(10),
            };
            (r, cfg)
        })
        .collect();
    let rings = std::thread::scope(|s| {
        let joins: Vec<_> = handles
            .into_iter()
            .map(|(r, cfg)| {
                let plane = &planes[r];
                s.spawn(move || {
                    let mut ring = Ring::connect(plane, &cfg, &Shutdown::new()).unwrap();
                    ring.set_segment(segment);
                    ring
                })
            })
            .collect();
        joins.into_iter().map(|j| j.join().unwrap()).collect()
    });
    (planes, rings)
}

#[test]
fn in_process_rings_sum_exactly_for_awkward_lengths() {
    for (n, inline) in (1..=4).flat_map(|n| [(n, 0), (n, INLINE_BYTES)]) {
        let (_planes, mut rings) = rings(n, 3);
        for r in &mut rings {
            r.set_inline_bytes(inline);
        }
        for len in [0usize, 1, 2, 5, 7, 64, 1001] {
            let inputs: Vec<Vec<f32>> = (0..n)
                .map(|r| (0..len).map(|i| (r * 1000 + i) as f32).collect())
                .collect();
            let want: Vec<f32> = (0..len)
                .map(|i| (0..n).map(|r| (r * 1000 + i) as f32).sum())
                .collect();
            let outs: Vec<Vec<f32>> = std::thread::scope(|s| {
                let joins: Vec<_> = rings
                    .iter_mut()
                    .zip(inputs)
                    .map(|(ring, mut v)| {
                        s.spawn(move || {
                            ring.allreduce(&mut v, &Shutdown::new()).unwrap();
                            v
                        })
                    })
                    .collect();
                joins.into_iter().map(|j| j.join().unwrap()).collect()
            });
            for o in outs {
                assert_eq!(o, want, "n={n} len={len}");
            }
        }
    }
}

proptest! {
    #[test]
    fn bf16_rounding_is_nearest(v in -1e30f32..1e30) {
        let r = bf16_to_f32(f32_to_bf16(v));
        prop_assert!((r - v).abs() <= v.abs() / 256.0, "{} -> {}", v, r);
    }
}

#[test]
fn bf16_rings_sum_closely_and_agree_bit_for_bit() {
    for (n, inline) in [2usize, 3, 5]
        .into_iter()
        .flat_map(|n| [(n, 0), (n, INLINE_BYTES)])
    {
        let (_planes, mut rings) = rings(n, 7);
        for r in &mut rings {
            r.set_inline_bytes(inline);
        }
        let len = 1000;
        let inputs: Vec<Vec<f32>> = (0..n)
            .map(|r| {
                (0..len)
                    .map(|i| ((r * 31 + i * 17) % 101) as f32 / 101.0 - 0.5)
                    .collect()
            })
            .collect();
        let want: Vec<f32> = (0..len)
            .map(|i| inputs.iter().map(|v| v[i]).sum())
            .collect();
        let outs: Vec<Vec<f32>> = std::thread::scope(|s| {
            let joins: Vec<_> = rings
                .iter_mut()
                .zip(inputs)
                .map(|(ring, mut v)| {
                    s.spawn(move || {
                        ring.allreduce_wire(&mut v, Wire::Bf16, &Shutdown::new())
                            .unwrap();
                        v
                    })
                })
                .collect();
            joins.into_iter().map(|j| j.join().unwrap()).collect()
        });
        for o in &outs {
            assert_eq!(o, &outs[0], "n={n}: ranks agree");
            for (g, w) in o.iter().zip(&want) {
                assert!((g - w).abs() <= 0.02 * n as f32, "n={n}: {g} vs {w}");
            }
        }
    }
}

#[test]
fn a_dead_neighbour_breaks_the_collective_promptly() {
    let (_planes, mut rings) = rings(3, 1024);
    let dead = rings.pop().unwrap();
    drop(dead);
    let started = Instant::now();
    let mut v = vec![1.0f32; 10_000];
    let err = rings[0].allreduce(&mut v, &Shutdown::new()).unwrap_err();
    assert!(matches!(err, RingError::Broken(_)), "{err}");
    assert!(started.elapsed() < Duration::from_secs(5));
    assert!(rings[0].allreduce(&mut v, &Shutdown::new()).is_err());
}
