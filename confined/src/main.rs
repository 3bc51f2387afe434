//! `trainyard-confined KIND`: the sandboxed child of an executor. It reads
//! its task on stdin, confines itself, works, answers and exits (see the
//! library); `KIND` is `inspection`, `model` or `script`. Nothing else of
//! this process runs: no runtime, no threads but the parent watch.

use trainyard_confined::protocol::Kind;
use trainyard_confined::{enter, inspect, serve};

fn main() {
    let arg = std::env::args().nth(1).unwrap_or_default();
    let code = match Kind::parse(&arg) {
        Some(Kind::Inspection) => enter::child(inspect::confined),
        Some(Kind::Model) => enter::session(serve::serve),
        Some(Kind::Script) => enter::exec_script(),
        None => {
            eprintln!(
                "trainyard-confined is started by an executor, as `trainyard-confined KIND` (KIND: inspection, model or script), not {arg:?}"
            );
            2
        }
    };
    std::process::exit(code);
}
