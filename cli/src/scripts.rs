//! `trainyard run-script SCRIPT` and `trainyard outputs ID [PATH]`: a
//! user's own training script as a job. The script is uploaded (with
//! `--files`, packed beside them as a `.tar.gz`), each local `--input` is
//! uploaded under its own name, and the spec is submitted; `outputs` lists
//! or downloads what the job's rank 0 left in `TRAINYARD_OUTPUT_DIR`.

use crate::args::{OutputsArgs, RunScriptArgs};
use crate::error::{CliError, OrCli};
use crate::follow::follow;
use crate::table::print_table;
use serde_json::{json, Map, Value};
use std::path::Path;

fn other(e: impl std::fmt::Display) -> CliError {
    CliError::Other(e.to_string())
}

/// `--workers N` or `MIN:MAX`.
fn workers(s: &str) -> Result<Value, CliError> {
    let bad = || other(format!("--workers {s:?}: give N or MIN:MAX"));
    let (min, max) = match s.split_once(':') {
        Some((a, b)) => (a.parse().map_err(|_| bad())?, b.parse().map_err(|_| bad())?),
        None => {
            let n: u32 = s.parse().map_err(|_| bad())?;
            (n, n)
        }
    };
    Ok(json!({"min": min, "max": max}))
}

/// A `.tar.gz` of `script` and `files` (each at the top level under its
/// own name, folders with their contents; links refused) at `to`.
fn pack(script: &Path, files: &[std::path::PathBuf], to: &Path) -> Result<(), CliError> {
    let out = std::fs::File::create(to).map_err(other)?;
    let gz = flate2::write::GzEncoder::new(out, flate2::Compression::default());
    let mut tar = tar::Builder::new(gz);
    tar.follow_symlinks(false);
    for path in std::iter::once(script).chain(files.iter().map(|p| p.as_path())) {
        let name = path
            .file_name()
            .ok_or_else(|| other(format!("{} has no name", path.display())))?;
        let meta = std::fs::symlink_metadata(path)
            .map_err(|e| other(format!("{}: {e}", path.display())))?;
        if meta.is_dir() {
            tar.append_dir_all(name, path)
        } else if meta.is_file() {
            tar.append_path_with_name(path, name)
        } else {
            return Err(other(format!(
                "{} is not a file or a folder",
                path.display()
            )));
        }
        .map_err(|e| other(format!("packing {}: {e}", path.display())))?;
    }
    tar.into_inner()
        .and_then(|gz| gz.finish())
        .map_err(|e| other(format!("packing the code: {e}")))?;
    Ok(())
}

/// `trainyard run-script SCRIPT …`.
pub async fn run_script(args: RunScriptArgs) -> Result<u8, CliError> {
    let base = args
        .script
        .file_name()
        .and_then(|n| n.to_str())
        .filter(|n| n.ends_with(".py"))
        .ok_or_else(|| other(format!("{}: a script is a .py file", args.script.display())))?
        .to_owned();
    let stem = base.trim_end_matches(".py").to_owned();
    let client = args.conn.client()?;
    let mut script = Map::new();
    if args.files.is_empty() {
        let a = client
            .upload_artifact(&base, &args.script)
            .await
            .or_cli(&client)?;
        script.insert("code".into(), json!(a.url));
    } else {
        let packed =
            std::env::temp_dir().join(format!("trainyard-{stem}-{}.tar.gz", std::process::id()));
        pack(&args.script, &args.files, &packed)?;
        let uploaded = client
            .upload_artifact(&format!("{stem}-code.tar.gz"), &packed)
            .await;
        let _ = std::fs::remove_file(&packed);
        script.insert("code".into(), json!(uploaded.or_cli(&client)?.url));
        script.insert("entrypoint".into(), json!(base));
    }
    let all_args: Vec<&String> = args.arg.iter().chain(args.rest.iter()).collect();
    if !all_args.is_empty() {
        script.insert("args".into(), json!(all_args));
    }
    if !args.env.is_empty() {
        let mut env = Map::new();
        for kv in &args.env {
            let (k, v) = kv
                .split_once('=')
                .ok_or_else(|| other(format!("--env {kv:?}: give KEY=VALUE")))?;
            env.insert(k.into(), json!(v));
        }
        script.insert("env".into(), Value::Object(env));
    }
    if let Some(p) = &args.python {
        script.insert("python".into(), json!(p));
    }
    if let Some(n) = args.max_restarts {
        script.insert("max_restarts".into(), json!(n));
    }
    if let Some(n) = args.max_seconds {
        script.insert("max_seconds".into(), json!(n));
    }
    let mut inputs = Vec::new();
    for i in &args.inputs {
        if i.starts_with("artifact:") || i.contains("://") {
            inputs.push(i.clone());
            continue;
        }
        let path = Path::new(i);
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .ok_or_else(|| other(format!("--input {i:?} has no file name")))?;
        let a = client.upload_artifact(name, path).await.or_cli(&client)?;
        inputs.push(a.url);
    }
    let mut spec = json!({
        "name": args.name.clone().unwrap_or(stem),
        "script": script,
        "workers": workers(&args.workers)?,
    });
    if !inputs.is_empty() {
        spec["inputs"] = json!(inputs);
    }
    if let Some(mb) = args.memory_mb {
        spec["resources"] = json!({"memory_mb": mb});
    }
    let job = client.submit_job(&spec, None).await.or_cli(&client)?;
    println!("submitted script job {} ({})", job.id, job.name);
    if args.follow {
        return follow(&client, job.id, &job.id.to_string()).await;
    }
    Ok(0)
}

/// `trainyard outputs ID [PATH] [-o FILE]`.
pub async fn outputs(args: OutputsArgs) -> Result<u8, CliError> {
    let id = uuid::Uuid::parse_str(args.id.trim())
        .map_err(|_| other(format!("{:?} is not a job id", args.id)))?;
    let client = args.conn.client()?;
    let Some(path) = &args.path else {
        let list = client.job_outputs(id).await.or_cli(&client)?;
        let rows: Vec<[String; 2]> = std::iter::once(["PATH".into(), "BYTES".into()])
            .chain(
                list.outputs
                    .iter()
                    .map(|o| [o.path.clone(), o.size.to_string()]),
            )
            .collect();
        print_table(&rows);
        return Ok(0);
    };
    let bytes = client.job_output(id, path).await.or_cli(&client)?;
    let to = args.output.clone().unwrap_or_else(|| {
        Path::new(path)
            .file_name()
            .map_or_else(|| "output".into(), |n| n.into())
    });
    std::fs::write(&to, &bytes)
        .map_err(|e| other(format!("cannot write {}: {e}", to.display())))?;
    println!("wrote {} ({} bytes)", to.display(), bytes.len());
    Ok(0)
}
