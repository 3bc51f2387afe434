//! The ring all-reduce across real processes: every rank of N = 1…6 ends
//! with the exact sum of all ranks' seeded random inputs (within float
//! tolerance) and with the same bits as every other rank, for lengths that
//! are empty, shorter than N, not divisible by N, and longer than a segment,
//! through both the inline path (small buffers) and the pipelined one.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Command, Stdio};

struct Rank {
    child: Child,
    out: BufReader<std::process::ChildStdout>,
}

fn line(r: &mut Rank) -> serde_json::Value {
    let mut l = String::new();
    r.out.read_line(&mut l).expect("read a line from the rank");
    serde_json::from_str(&l).unwrap_or_else(|e| panic!("rank printed {l:?}: {e}"))
}

/// Runs `world` processes with `args` after the rank and returns each one's
/// closing JSON line.
fn run(world: u32, args: &[&str]) -> Vec<serde_json::Value> {
    let mut ranks: Vec<Rank> = (0..world)
        .map(|rank| {
            let mut child = Command::new(env!("CARGO_BIN_EXE_trainyard-ring"))
                .args(["--rank", &rank.to_string()])
                .args(args)
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .spawn()
                .expect("start trainyard-ring");
            let out = BufReader::new(child.stdout.take().unwrap());
            Rank { child, out }
        })
        .collect();
    let addrs: Vec<String> = ranks
        .iter_mut()
        .map(|r| line(r)["addr"].as_str().unwrap().to_owned())
        .collect();
    let peers = serde_json::to_string(&addrs).unwrap();
    for r in &mut ranks {
        let mut stdin = r.child.stdin.take().unwrap();
        writeln!(stdin, "{peers}").unwrap();
    }
    ranks
        .iter_mut()
        .map(|r| {
            let v = line(r);
            assert!(r.child.wait().unwrap().success());
            v
        })
        .collect()
}

#[test]
fn every_rank_gets_the_exact_sum_for_1_to_6_processes_and_awkward_lengths() {
    for world in 1..=6u32 {
        for (len, segment) in [
            (0usize, None),
            (1, None),
            (5, Some(2)),
            (4097, Some(100)),
            (300_007, None),
        ] {
            let mut args = vec![
                "check".to_owned(),
                "--len".into(),
                len.to_string(),
                "--seed".into(),
                (world as u64 * 7919 + len as u64).to_string(),
            ];
            if let Some(s) = segment {
                // Tiny segments through the pipelined path (not the inline
                // one small buffers take otherwise).
                args.extend([
                    "--segment".into(),
                    s.to_string(),
                    "--inline-bytes".into(),
                    "0".into(),
                ]);
            }
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            let out = run(world, &args);
            let tol = 1e-6 * f64::from(world) * 4.0;
            for o in &out {
                let err = o["max_abs_err"].as_f64().unwrap();
                assert!(
                    err <= tol,
                    "world {world} len {len}: error {err} > {tol} on {o}"
                );
            }
            let first = &out[0]["hash"];
            assert!(
                out.iter().all(|o| &o["hash"] == first),
                "world {world} len {len}: ranks differ: {out:?}"
            );
        }
    }
}
