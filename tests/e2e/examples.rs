//! The documentation's examples run against a real platform, so that they
//! cannot rot: every fenced `sh`, `bash`, `shell`, `console` and `python`
//! block of `README.md` and `docs/**/*.md` is run, or carries, right before
//! its fence, a `<!-- example: not run (why) -->` mark that says why it
//! cannot run here (a Kubernetes cluster, Docker, Slurm, a desktop).
//!
//! One open API with two executors and one API with an admin token (for the
//! blocks that present `$admin` or `$tok`) serve every block. A block runs
//! as a reader runs it: shell blocks with `bash` under `set -euo pipefail`,
//! Python blocks with `$TRAINYARD_PYTHON` (else the `python3` on `PATH`, the
//! venv's) and `sdk/python` on `PYTHONPATH`, in a scratch folder that holds
//! the repository's `data/` and `examples/` and whose `.trainyard/` is the
//! API's data folder (the default `--data-dir`), with `api`, `TRAINYARD_API`
//! and `TRAINYARD_API_TOKEN` set as the docs tell readers to, the built
//! `trainyard` first on `PATH`, and `http://127.0.0.1:8080` (the address the
//! docs assume) replaced by the platform's. The variables a shell block
//! assigns carry to the later blocks of its page, as in a reader's
//! terminal; a Python block runs after its page's earlier Python blocks; a
//! page's unfinished jobs are cancelled before the next page. A block passes
//! when it exits 0 within its time limit: the blocks that fetch a result use
//! `curl -f` or wait with `trainyard job`, while those that show an API's
//! error answer (a 422, a 404) pass by answering it.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};
use trainyard_e2e::{binary, eventually, repo_root, tail, Platform};

/// The info strings of the blocks that are examples to run.
const LANGUAGES: &[&str] = &["sh", "bash", "shell", "console", "python"];

/// The admin token of the secured API.
const ADMIN: &str = "examples-admin-token";

/// How long one block may run (a block that trains waits for its job).
const BLOCK_LIMIT: Duration = Duration::from_secs(300);

/// Definitions a block relies on that its page leaves to the reader, keyed
/// by the page and a line of the block; they run before the block.
const PRELUDES: &[(&str, &str, &str)] = &[
    (
        "docs/users/web-ui.md",
        "$api/v1/jobs/$id/assignments",
        // A job whose roles to read: the demo job.
        "id=$(sed \"s#@DIGITS@#file://$PWD/data/digits.npz#\" examples/digits-mlp.json |\n\
         curl -sf -X POST $api/v1/jobs -H 'Content-Type: application/json' --data @- | jq -r .id)\n",
    ),
    (
        "docs/users/sdk.md",
        "client.fit(DigitsCnn()",
        // The block names its model's source: tests/pytest/test_fit.py.
        "import sys; sys.path.insert(0, 'tests/pytest')\nfrom test_fit import DigitsCnn\n",
    ),
    (
        "docs/users/datasets.md",
        "for i, (x, y) in enumerate(chunks):",
        // The digits in three chunks, each row with an id.
        "import os, numpy as np\nos.makedirs('shards', exist_ok=True)\n\
         _d = np.load('data/digits.npz')\n\
         chunks = list(zip(np.array_split(_d['x'].astype(np.float32), 3), \
         np.array_split(_d['y'].astype(np.int64), 3)))\n\
         ids = [np.arange(len(c[1]), dtype=np.int64) + 10000 * i for i, c in enumerate(chunks)]\n",
    ),
];

/// One fenced example of a page.
struct Block {
    /// The page, relative to the repository root.
    file: String,
    /// The 1-based line of the opening fence.
    line: usize,
    lang: String,
    code: String,
    /// The reason of its `not run` mark, if it has one.
    excuse: Option<String>,
}

impl Block {
    fn name(&self) -> String {
        format!("{}:{} ({})", self.file, self.line, self.lang)
    }

    fn uses_tokens(&self) -> bool {
        self.code.contains("$admin") || self.code.contains("$tok")
    }
}

/// The pages: README.md and every Markdown file under docs/, in order.
fn pages(root: &Path) -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
            .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
            .map(|e| e.expect("a directory entry").path())
            .collect();
        entries.sort();
        for path in entries {
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|x| x == "md") {
                out.push(path);
            }
        }
    }
    let mut out = vec![root.join("README.md")];
    walk(&root.join("docs"), &mut out);
    out
}

/// The reason of a `<!-- example: not run (reason) -->` line, if it is
/// one (empty for a mark without a reason, which the test refuses).
fn excuse(line: &str) -> Option<String> {
    let inner = line
        .trim()
        .strip_prefix("<!--")?
        .strip_suffix("-->")?
        .trim()
        .strip_prefix("example: not run")?
        .trim();
    let reason = inner
        .strip_prefix('(')
        .and_then(|r| r.strip_suffix(')'))
        .unwrap_or("");
    Some(reason.trim().to_owned())
}

/// The example blocks of the page at `path` (`file` is its name).
fn blocks_of(file: &str, text: &str) -> Vec<Block> {
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let Some(info) = lines[i].trim_start().strip_prefix("```") else {
            i += 1;
            continue;
        };
        let start = i;
        let mut end = i + 1;
        while end < lines.len() && lines[end].trim() != "```" {
            end += 1;
        }
        let lang = info.trim().to_owned();
        if LANGUAGES.contains(&lang.as_str()) {
            let before = lines[..start].iter().rev().find(|l| !l.trim().is_empty());
            out.push(Block {
                file: file.to_owned(),
                line: start + 1,
                lang,
                code: lines[start + 1..end.min(lines.len())].join("\n"),
                excuse: before.copied().and_then(excuse),
            });
        }
        i = end + 1;
    }
    out
}

/// The variables a shell block assigns at the start of a line
/// (`name=…`, `export name=…`), and whether it exports them: they carry to
/// the page's later shell blocks, the exported ones to its Python blocks
/// too.
fn assigned(code: &str) -> Vec<(String, bool)> {
    let mut names: Vec<(String, bool)> = Vec::new();
    for line in code.lines() {
        let line = line.trim_start();
        let exported = line.starts_with("export ");
        let line = line.strip_prefix("export ").unwrap_or(line).trim_start();
        let name: String = line
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        let starts_ok = name.chars().next().is_some_and(|c| !c.is_ascii_digit());
        if starts_ok && line[name.len()..].starts_with('=') {
            match names.iter_mut().find(|(n, _)| *n == name) {
                Some(seen) => seen.1 |= exported,
                None => names.push((name, exported)),
            }
        }
    }
    names
}

/// Where the blocks run and what they get.
struct Runner {
    scratch: PathBuf,
    open_url: String,
    secured_url: String,
    user_token: String,
    /// `$TRAINYARD_PYTHON`, else the `python3` on `PATH` (the venv's).
    python: String,
    path: String,
}

impl Runner {
    /// Runs `block` with the page's `vars` (their values, and whether the
    /// page exported them); its failure message, if it failed.
    fn run(
        &self,
        block: &Block,
        earlier_python: &str,
        vars: &mut BTreeMap<String, (String, bool)>,
    ) -> Option<String> {
        let url = if block.uses_tokens() {
            &self.secured_url
        } else {
            &self.open_url
        };
        let code = block.code.replace("http://127.0.0.1:8080", url);
        let state = self.scratch.join(".example-state");
        let _ = std::fs::remove_file(&state);
        let prelude = PRELUDES
            .iter()
            .filter(|(f, marker, _)| *f == block.file && code.contains(marker))
            .map(|(_, _, p)| *p)
            .collect::<String>();
        let (program, script) = if block.lang == "python" {
            (
                self.python.as_str(),
                format!("{earlier_python}\n{prelude}\n{code}\n"),
            )
        } else {
            let mut s = String::from("set -euo pipefail\n");
            s.push_str(&prelude);
            s.push_str(&code);
            s.push('\n');
            for (name, exported) in assigned(&code) {
                let mark = if exported { "export" } else { "shell" };
                s.push_str(&format!(
                    "printf '%s %s=%s\\0' {mark} {name} \"${{{name}-}}\" >> '{}'\n",
                    state.display()
                ));
            }
            ("bash", s)
        };
        let script_path = self.scratch.join(format!(".example.{}", block.lang));
        std::fs::write(&script_path, &script).expect("writing the block's script");
        let started = Instant::now();
        let mut cmd = Command::new("timeout");
        // The CLI and the SDK present alice's token where the block does.
        if block.uses_tokens() {
            cmd.env("TRAINYARD_API_TOKEN", &self.user_token);
        } else {
            cmd.env_remove("TRAINYARD_API_TOKEN");
        }
        let out = cmd
            .args(["-k", "5", &BLOCK_LIMIT.as_secs().to_string(), program])
            .arg(&script_path)
            .current_dir(&self.scratch)
            .envs(
                vars.iter()
                    .filter(|(_, (_, exported))| *exported || block.lang != "python")
                    .map(|(k, (v, _))| (k, v)),
            )
            .env("api", url)
            .env("TRAINYARD_API", url)
            .env("admin", ADMIN)
            .env("tok", &self.user_token)
            .env("PATH", &self.path)
            .env("PYTHONPATH", repo_root().join("sdk/python"))
            .env("PYTHONDONTWRITEBYTECODE", "1")
            .env("NO_COLOR", "1")
            .output()
            .unwrap_or_else(|e| panic!("running {}: {e}", block.name()));
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        // Seen with --nocapture: what each block printed last.
        eprintln!(
            "examples: {} exited {:?} in {:.1}s\n{}\n{}",
            block.name(),
            out.status.code(),
            started.elapsed().as_secs_f64(),
            tail(&stdout, 3),
            tail(&stderr, 3)
        );
        if let Ok(bytes) = std::fs::read(&state) {
            for pair in String::from_utf8_lossy(&bytes).split('\0') {
                let Some((how, rest)) = pair.split_once(' ') else {
                    continue;
                };
                if let Some((k, v)) = rest.split_once('=') {
                    let was = vars.get(k).is_some_and(|(_, e)| *e);
                    vars.insert(k.to_owned(), (v.to_owned(), was || how == "export"));
                }
            }
        }
        (!out.status.success()).then(|| {
            // `timeout` exits 124 (137 after its kill) when the limit passed.
            let how = match out.status.code() {
                Some(124 | 137) => format!("ran over {}s", BLOCK_LIMIT.as_secs()),
                Some(code) => format!("exited {code}"),
                None => "was killed by a signal".to_owned(),
            };
            format!(
                "{} {how}\n--- stdout\n{}\n--- stderr\n{}",
                block.name(),
                tail(&stdout, 15),
                tail(&stderr, 15)
            )
        })
    }
}

/// Cancels the unfinished jobs of `p`, so that a page's jobs leave the
/// executors to the next page's.
fn cancel_unfinished(p: &Platform) {
    let jobs = p.get("/v1/jobs?state=queued,inspecting,scheduling,running,recovering&limit=200");
    for job in jobs["jobs"].as_array().into_iter().flatten() {
        if let Some(id) = job["id"].as_str() {
            let _ = p.post(&format!("/v1/jobs/{id}/cancel"), &serde_json::json!({}));
        }
    }
}

#[test]
fn every_doc_example_runs_or_is_marked_with_a_reason() {
    let root = repo_root();
    let mut blocks = Vec::new();
    for page in pages(&root) {
        let text = std::fs::read_to_string(&page)
            .unwrap_or_else(|e| panic!("reading {}: {e}", page.display()));
        let file = page
            .strip_prefix(&root)
            .expect("a page under the root")
            .display()
            .to_string();
        blocks.extend(blocks_of(&file, &text));
    }
    assert!(
        blocks.len() >= 30,
        "only {} example blocks found: is the scan broken?",
        blocks.len()
    );
    let unexplained: Vec<String> = blocks
        .iter()
        .filter(|b| b.excuse.as_deref() == Some(""))
        .map(Block::name)
        .collect();
    assert!(
        unexplained.is_empty(),
        "`not run` marks without a reason: {unexplained:?}"
    );

    let open = Platform::builder("examples").no_provisioner().start();
    let secured = Platform::builder("examples-secured")
        .admin_token(ADMIN)
        .no_provisioner()
        .start();
    let _executors = [open.executor("examples-0"), open.executor("examples-1")];
    eventually(Duration::from_secs(60), || {
        (open.live_executors().len() == 2).then_some(())
    })
    .expect("two live executors within 60 s");
    // `./scripts/run` keeps the join token here, as `trainyard serve` does
    // when it makes one; the docs read it from there.
    std::fs::write(open.file("join-token"), open.join_token()).expect("writing join-token");
    let (status, made) = secured.with_token(ADMIN).post(
        "/v1/tokens",
        &serde_json::json!({"owner": "alice", "role": "user", "label": "examples"}),
    );
    assert_eq!(status, 201, "creating alice's token: {made}");
    let user_token = made["token"].as_str().expect("a token").to_owned();

    let scratch = std::env::temp_dir().join(format!("trainyard-examples-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&scratch);
    std::fs::create_dir_all(&scratch).expect("making the scratch folder");
    for dir in ["data", "examples", "sdk", "tests"] {
        std::os::unix::fs::symlink(root.join(dir), scratch.join(dir)).expect("linking");
    }
    std::os::unix::fs::symlink(&open.data, scratch.join(".trainyard")).expect("linking");
    let bin = binary("trainyard").expect("the trainyard binary");
    let python = std::env::var("TRAINYARD_PYTHON").unwrap_or_else(|_| "python3".into());
    // The shell blocks' `python3` is that Python too, and `trainyard` the
    // built CLI.
    let mut dirs = vec![bin.parent().expect("a bin folder").to_path_buf()];
    if let Some(dir) = Path::new(&python).parent().filter(|d| d.is_absolute()) {
        dirs.push(dir.to_path_buf());
    }
    let path = std::env::join_paths(dirs.into_iter().chain(std::env::split_paths(
        &std::env::var_os("PATH").unwrap_or_default(),
    )))
    .expect("a PATH")
    .to_string_lossy()
    .into_owned();
    let runner = Runner {
        scratch: scratch.clone(),
        open_url: open.client.base.clone(),
        secured_url: secured.client.base.clone(),
        user_token,
        python,
        path,
    };

    let started = Instant::now();
    let mut failures = Vec::new();
    let (mut ran, mut marked) = (0, 0);
    let mut page = String::new();
    let mut vars = BTreeMap::new();
    let mut earlier_python = String::new();
    for block in &blocks {
        if block.file != page {
            cancel_unfinished(&open);
            page.clone_from(&block.file);
            vars.clear();
            earlier_python.clear();
        }
        if let Some(reason) = &block.excuse {
            eprintln!("examples: {} not run: {reason}", block.name());
            marked += 1;
            continue;
        }
        ran += 1;
        if let Some(failure) = runner.run(block, &earlier_python, &mut vars) {
            failures.push(failure);
        }
        if block.lang == "python" {
            earlier_python.push_str(&block.code);
            earlier_python.push('\n');
        }
    }
    cancel_unfinished(&open);
    let _ = std::fs::remove_dir_all(&scratch);
    eprintln!(
        "examples: {ran} run, {marked} marked not run, in {:.0}s",
        started.elapsed().as_secs_f64()
    );
    assert!(
        failures.is_empty(),
        "{} of {ran} examples failed (mark one that cannot run here with \
         `<!-- example: not run (why) -->` before its fence):\n\n{}",
        failures.len(),
        failures.join("\n\n")
    );
}
