//! A spare script interpreter: started confined as the next rank will be,
//! it runs [`LAUNCHER`] (imports PyTorch, says [`READY`], waits), and
//! becomes the rank when the executor writes its [`go_line`].

/// What a spare runs: imports the heavy modules, says it is ready, and
/// becomes the rank once it reads its environment.
pub const LAUNCHER: &str = r#"import sys, os
try:
    import torch, torch.distributed, torch.nn
    import torch.nn.parallel
    # What DistributedDataParallel's constructor imports (TorchDynamo,
    # SymPy): most of a DDP script's start after `import torch`.
    import torch._dynamo
    import numpy
except Exception:
    pass
sys.stdout.write("trainyard-warm-ready\n")
sys.stdout.flush()
import json, runpy
_go = sys.stdin.readline()
if not _go:
    raise SystemExit(0)
_go = json.loads(_go)
os.environ.clear()
os.environ.update(_go["env"])
os.chdir(_go["cwd"])
sys.argv = list(_go["argv"])
_entry = os.path.abspath(sys.argv[0])
sys.path[0] = os.path.dirname(_entry)
del _go, json
runpy.run_path(_entry, run_name="__main__")
"#;

/// The line a ready spare writes.
pub const READY: &[u8] = b"trainyard-warm-ready\n";

/// The go line: the rank's environment, argument vector and folder.
pub fn go_line(env: &[(String, String)], argv: &[String], cwd: &std::path::Path) -> String {
    let env: serde_json::Map<String, serde_json::Value> = env
        .iter()
        .map(|(k, v)| (k.clone(), serde_json::Value::String(v.clone())))
        .collect();
    // Compact JSON has no raw newline: one line.
    serde_json::json!({"env": env, "argv": argv, "cwd": cwd}).to_string() + "\n"
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_go_line_is_one_line_of_json() {
        let env = [("A", "x\ny"), ("B", "\"q\"")].map(|(k, v)| (k.to_owned(), v.to_owned()));
        let line = super::go_line(
            &env,
            &["train.py".into(), "--n\n2".into()],
            std::path::Path::new("/code"),
        );
        assert_eq!(line.matches('\n').count(), 1);
        let v: serde_json::Value = serde_json::from_str(line.trim_end()).unwrap();
        assert_eq!(v["env"]["A"], "x\ny");
        assert_eq!(v["argv"][1], "--n\n2");
        assert_eq!(v["cwd"], "/code");
    }
}
