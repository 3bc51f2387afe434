//! Failing fast on a deterministic failure: a script that fails the same
//! way (the same ending and the same last lines) on two tries in a row,
//! without a single `trainyard.report()` in either, will fail again, so
//! its job fails then, naming the cause, instead of spending every
//! restart `max_restarts` allows (an import error, a syntax error, a
//! missing package, a bad argument). Numbers in the lines (pids, ports,
//! addresses, timings) do not make two failures different, and neither do
//! the launcher's own traceback frames (`<frozen runpy>`, `<string>`): a
//! restart runs in a warm interpreter whose traceback has them where the
//! first, cold try's has none.
//!
//! Kept per job and slot on this executor: the tries of one rank.

use std::collections::BTreeMap;
use std::sync::Mutex;
use trainyard_sandbox::Ending;
use uuid::Uuid;

/// Lines of a failure compared.
const COMPARED: usize = 8;
/// Slots remembered at once (the oldest job's are forgotten first).
const REMEMBERED: usize = 4096;

/// What two failures must share to be the same.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Signature {
    ending: String,
    lines: Vec<String>,
}

impl Signature {
    /// A try's signature: how it ended and its last lines, numbers blanked.
    pub fn of(ending: &Ending, last: &[String]) -> Signature {
        let kept: Vec<&String> = last.iter().filter(|l| !launcher_frame(l)).collect();
        let start = kept.len().saturating_sub(COMPARED);
        Signature {
            ending: ending.to_string(),
            lines: kept[start..]
                .iter()
                .map(|l| {
                    // A run of digits is one `#`: 7 and 1234 are alike.
                    let mut out = String::with_capacity(l.len());
                    for c in l.chars() {
                        if !c.is_ascii_digit() {
                            out.push(c);
                        } else if !out.ends_with('#') {
                            out.push('#');
                        }
                    }
                    out
                })
                .collect(),
        }
    }
}

/// A traceback frame in code that is not a file: Python's frozen modules
/// and the warm interpreter's `-c` launcher. They print no source line.
fn launcher_frame(line: &str) -> bool {
    let l = line.trim_start();
    // The rank's lines may carry a `[rank N] ` prefix.
    let l = match l.strip_prefix("[rank ") {
        Some(rest) => rest.split_once("] ").map_or(l, |(_, t)| t.trim_start()),
        None => l,
    };
    l.starts_with("File \"<") && l.contains(">\", line ")
}

/// The previous unreported failure of each slot.
#[derive(Debug, Default)]
pub struct Tries {
    last: BTreeMap<(Uuid, u32), Signature>,
}

impl Tries {
    /// Records a failed try of `slot`; why the job should fail now, when it
    /// failed as the try before it did and neither reported.
    pub fn failed(&mut self, slot: (Uuid, u32), reported: bool, now: Signature) -> Option<String> {
        if reported {
            self.last.remove(&slot);
            return None;
        }
        match self.last.remove(&slot) {
            Some(before) if before == now => Some(format!(
                "the script failed the same way on two tries in a row before its first report (it {}), so it would again: the job fails now instead of restarting",
                now.ending
            )),
            _ => {
                if self.last.len() >= REMEMBERED {
                    self.last.pop_first();
                }
                self.last.insert(slot, now);
                None
            }
        }
    }
}

/// [`Tries::failed`] on this executor's record.
pub fn same_again(
    slot: (Uuid, u32),
    reported: bool,
    ending: &Ending,
    last: &[String],
) -> Option<String> {
    static TRIES: Mutex<Option<Tries>> = Mutex::new(None);
    let mut tries = TRIES.lock().ok()?;
    tries
        .get_or_insert_with(Tries::default)
        .failed(slot, reported, Signature::of(ending, last))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn lines(s: &[&str]) -> Vec<String> {
        s.iter().map(|l| l.to_string()).collect()
    }

    #[test]
    fn the_second_identical_unreported_failure_fails_the_job() {
        let mut t = Tries::default();
        let slot = (Uuid::from_u128(1), 0);
        let a = Signature::of(
            &Ending::Exited(1),
            &lines(&["ModuleNotFoundError: No module named 'tqdm'"]),
        );
        assert_eq!(t.failed(slot, false, a.clone()), None);
        let why = t.failed(slot, false, a.clone()).expect("the same again");
        assert!(why.contains("exited with code 1"), "{why}");
        // Counting starts over after the verdict.
        assert_eq!(t.failed(slot, false, a), None);
    }

    #[test]
    fn a_report_a_different_failure_or_another_slot_is_not_a_repeat() {
        let mut t = Tries::default();
        let slot = (Uuid::from_u128(1), 0);
        let one = Signature::of(&Ending::Exited(1), &lines(&["KeyError: 'x'"]));
        let other = Signature::of(&Ending::Exited(1), &lines(&["ValueError"]));
        assert_eq!(t.failed(slot, false, one.clone()), None);
        assert_eq!(t.failed((Uuid::from_u128(2), 0), false, one.clone()), None);
        assert_eq!(
            t.failed(slot, false, other.clone()),
            None,
            "different lines"
        );
        assert_eq!(t.failed(slot, true, other.clone()), None, "it reported");
        assert_eq!(
            t.failed(slot, false, other.clone()),
            None,
            "first after a report"
        );
        let signal = Signature::of(&Ending::Signal("SIGSEGV".into()), &lines(&["ValueError"]));
        assert_eq!(t.failed(slot, false, signal), None, "a different ending");
    }

    #[test]
    fn a_warm_restarts_launcher_frames_do_not_make_it_differ() {
        let cold = lines(&[
            "Traceback (most recent call last):",
            "  File \"/w/code/broken.py\", line 1, in <module>",
            "    import no_module_of_this_name",
            "ModuleNotFoundError: No module named 'no_module_of_this_name'",
        ]);
        let warm = lines(&[
            "Traceback (most recent call last):",
            "  File \"<string>\", line 25, in <module>",
            "  File \"<frozen runpy>\", line 291, in run_path",
            "  File \"<frozen runpy>\", line 98, in _run_module_code",
            "  File \"<frozen runpy>\", line 88, in _run_code",
            "  File \"/w/code/broken.py\", line 1, in <module>",
            "    import no_module_of_this_name",
            "ModuleNotFoundError: No module named 'no_module_of_this_name'",
        ]);
        assert_eq!(
            Signature::of(&Ending::Exited(1), &cold),
            Signature::of(&Ending::Exited(1), &warm)
        );
        let other = lines(&[
            "  File \"/w/code/other.py\", line 1, in <module>",
            "ModuleNotFoundError: No module named 'no_module_of_this_name'",
        ]);
        assert_ne!(
            Signature::of(&Ending::Exited(1), &cold),
            Signature::of(&Ending::Exited(1), &other)
        );
    }

    proptest! {
        #[test]
        fn numbers_in_the_lines_do_not_make_failures_differ(a: u32, b: u32, code in 1i32..255) {
            let line = |n: u32| vec![format!("Connection refused by 10.0.0.{n}:{n} (pid {n})")];
            prop_assert_eq!(
                Signature::of(&Ending::Exited(code), &line(a)),
                Signature::of(&Ending::Exited(code), &line(b))
            );
            prop_assert_ne!(
                Signature::of(&Ending::Exited(code), &line(a)),
                Signature::of(&Ending::Exited(code.wrapping_add(1)), &line(a))
            );
        }
    }
}
