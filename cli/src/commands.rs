//! The client commands: `submit FILE`, `jobs`, `job ID`, `cancel ID`,
//! `executors`, `logs ID`, `checkpoints ID`, `model ID [--format F] [-o FILE]`,
//! `provisioner`, `token create|list|revoke` and `whoami` — each a request
//! or two of the typed client and a printout of the typed answer.

use crate::args::{
    ArtifactsArgs, ExecutorsArgs, JobArgs, JobsArgs, ModelArgs, ProvisionerArgs, QuotaArgs,
    QuotaCommand, SubmitArgs, TokenArgs, TokenCommand, UploadArgs, UsageArgs, WhoamiArgs,
};
use crate::error::{CliError, OrCli};
use crate::follow::follow;
use crate::table::{age, bytes, json_number, print_table, wire};
use std::io::Write;
use trainyard_client::{JobQuery, ModelFormat};
use trainyard_common::api::{NewToken, Role};
use trainyard_common::spec::Strategy;
use uuid::Uuid;

/// Log lines asked for per request of `logs`.
const LOG_PAGE: u32 = 1000;

/// The job id the user gave: checked before it goes into a path, and kept
/// as typed for the messages.
fn job_id(id: &str) -> Result<(Uuid, String), CliError> {
    let id = id.trim();
    let bad = || CliError::Other(format!("{id:?} is not a job id"));
    if id.is_empty() || !id.chars().all(|c| c.is_ascii_alphanumeric() || c == '-') {
        return Err(bad());
    }
    Ok((Uuid::parse_str(id).map_err(|_| bad())?, id.to_owned()))
}

/// `trainyard submit FILE`: prints the new job's id; with `--follow`, then
/// follows it.
pub async fn submit(args: SubmitArgs) -> Result<u8, CliError> {
    let bytes = if args.file.as_os_str() == "-" {
        let mut b = Vec::new();
        std::io::Read::read_to_end(&mut std::io::stdin(), &mut b)
            .map_err(|e| CliError::Other(format!("cannot read the spec from stdin: {e}")))?;
        b
    } else {
        std::fs::read(&args.file)
            .map_err(|e| CliError::Other(format!("cannot read {}: {e}", args.file.display())))?
    };
    let client = args.conn.client()?;
    let job = client
        .submit_job_json(bytes, args.idempotency_key.as_deref())
        .await
        .or_cli(&client)?;
    println!(
        "submitted job {} ({}, {}, {})",
        job.id,
        job.name,
        wire(&job.strategy),
        job.state.as_str()
    );
    if args.follow {
        return follow(&client, job.id, &job.id.to_string()).await;
    }
    Ok(0)
}

/// `trainyard jobs`: a table, newest first.
pub async fn jobs(args: JobsArgs) -> Result<u8, CliError> {
    let client = args.conn.client()?;
    let query = JobQuery {
        state: args.state,
        limit: Some(args.limit),
        ..JobQuery::default()
    };
    let page = client.jobs(&query).await.or_cli(&client)?;
    let mut rows = vec![[
        "ID", "NAME", "OWNER", "STATE", "STRATEGY", "WORKERS", "PS", "AGE", "REASON",
    ]
    .map(str::to_owned)];
    for j in page.jobs {
        let workers = j.spec.workers;
        let ps = if j.strategy == Strategy::Allreduce {
            "-".to_owned()
        } else {
            j.spec
                .parameter_servers
                .map_or_else(|| "null".to_owned(), |n| n.to_string())
        };
        rows.push([
            j.id.to_string(),
            j.name,
            j.owner,
            j.state.as_str().to_owned(),
            wire(&j.strategy),
            if workers.min == workers.max {
                workers.min.to_string()
            } else {
                format!("{}-{}", workers.min, workers.max)
            },
            ps,
            age(j.created_at),
            j.state_reason,
        ]);
    }
    print_table(&rows);
    if page.next_cursor.is_some() {
        println!("(more: raise --limit)");
    }
    Ok(0)
}

/// `trainyard job ID`: follows the job to its end.
pub async fn job(args: JobArgs) -> Result<u8, CliError> {
    let (id, shown) = job_id(&args.id)?;
    let client = args.conn.client()?;
    follow(&client, id, &shown).await
}

/// `trainyard cancel ID`.
pub async fn cancel(args: JobArgs) -> Result<u8, CliError> {
    let (id, shown) = job_id(&args.id)?;
    let client = args.conn.client()?;
    let job = client.cancel_job(id).await.or_cli(&client)?;
    println!("job {shown} {} ({})", job.state.as_str(), job.state_reason);
    Ok(0)
}

/// `trainyard executors`: a table, newest first.
pub async fn executors(args: ExecutorsArgs) -> Result<u8, CliError> {
    let client = args.conn.client()?;
    let list = client
        .executors(args.state.as_deref())
        .await
        .or_cli(&client)?;
    let mut rows = vec![[
        "ID",
        "NAME",
        "STATE",
        "ADDRESS",
        "DEVICES",
        "RAM",
        "ROLES",
        "PYTHON ENVS",
        "HEARTBEAT",
    ]
    .map(str::to_owned)];
    for e in list.executors {
        let devices: Vec<String> = e
            .resources
            .devices
            .iter()
            .map(|d| {
                format!(
                    "{}:{} {}",
                    wire(&d.kind),
                    d.index,
                    bytes(d.memory_bytes as f64)
                )
            })
            .collect();
        let roles: Vec<String> = e
            .roles
            .iter()
            .map(|r| {
                let job = r.job_id.to_string();
                format!(
                    "{}{}{}@{}",
                    wire(&r.role),
                    if r.standby { "-standby" } else { "" },
                    r.index,
                    &job[job.len().saturating_sub(6)..]
                )
            })
            .collect();
        rows.push([
            e.id.to_string(),
            e.name,
            e.state.as_str().to_owned(),
            e.address,
            devices.join(", "),
            bytes(e.resources.ram_bytes as f64),
            if roles.is_empty() {
                "-".into()
            } else {
                roles.join(" ")
            },
            match e.environments {
                Some(c) => format!(
                    "{} ({} in use), {} of {}",
                    c.environments,
                    c.in_use,
                    bytes(c.bytes as f64),
                    bytes(c.budget_bytes as f64)
                ),
                None => "-".into(),
            },
            format!("{:.1} s ago", e.seconds_since_heartbeat),
        ]);
    }
    print_table(&rows);
    Ok(0)
}

/// `trainyard provisioner`: settings, the executors it started, and its
/// recent decisions, oldest first.
pub async fn provisioner(args: ProvisionerArgs) -> Result<u8, CliError> {
    let client = args.conn.client()?;
    let s = client.provisioner(Some(args.limit)).await.or_cli(&client)?;
    let t = &s.settings;
    println!(
        "provisioner: {} (max {} executor(s), {} per job; {} CPU(s) and {} RAM each; idle timeout {} s)",
        t.kind,
        t.max_executors,
        t.max_per_job,
        json_number(t.executor_cpus),
        bytes(t.executor_memory_mb as f64 * 1048576.0),
        t.idle_timeout_secs
    );
    let mut rows = vec![["NAME", "STATE", "PID", "STARTED", "REASON"].map(str::to_owned)];
    for e in &s.executors {
        rows.push([
            e.name.clone(),
            e.state.to_string(),
            e.pid.map_or("-".into(), |p| p.to_string()),
            wire(&e.started_at),
            e.reason.clone().unwrap_or_else(|| "-".into()),
        ]);
    }
    if rows.len() > 1 {
        println!();
        print_table(&rows);
    }
    if !s.events.is_empty() {
        println!();
    }
    for e in s.events.iter().rev() {
        println!("{}  {:<8} {}", wire(&e.at), e.kind, e.reason);
    }
    Ok(0)
}

/// `trainyard token …`: make, list and revoke tokens (admins).
pub async fn token(args: TokenArgs) -> Result<u8, CliError> {
    match args.command {
        TokenCommand::Create {
            owner,
            role,
            label,
            expires_in,
            conn,
        } => {
            let role = Role::parse(&role).ok_or_else(|| {
                CliError::Other(format!("{role:?} is not a role (user or admin)"))
            })?;
            let client = conn.client()?;
            let new = NewToken {
                owner,
                role,
                label,
                expires_in_secs: expires_in,
            };
            let t = client.create_token(&new).await.or_cli(&client)?;
            eprintln!(
                "made a {} token for {} (id {}); it is shown only now:",
                t.info.role.as_str(),
                t.info.owner,
                t.info.id
            );
            println!("{}", t.token);
        }
        TokenCommand::List { conn } => {
            let client = conn.client()?;
            let list = client.tokens().await.or_cli(&client)?;
            let mut rows = vec![[
                "ID", "OWNER", "ROLE", "LABEL", "CREATED", "EXPIRES", "REVOKED",
            ]
            .map(str::to_owned)];
            let or_dash =
                |t: Option<chrono::DateTime<chrono::Utc>>| t.map_or("-".into(), |t| wire(&t));
            for t in list.tokens {
                rows.push([
                    t.id.to_string(),
                    t.owner,
                    t.role.as_str().to_owned(),
                    t.label,
                    wire(&t.created_at),
                    or_dash(t.expires_at),
                    or_dash(t.revoked_at),
                ]);
            }
            print_table(&rows);
        }
        TokenCommand::Revoke { id, conn } => {
            let id = Uuid::parse_str(id.trim())
                .map_err(|_| CliError::Other(format!("{id:?} is not a token id")))?;
            let client = conn.client()?;
            let t = client.revoke_token(id).await.or_cli(&client)?;
            println!(
                "token {id} of {} revoked at {}",
                t.owner,
                t.revoked_at.map_or("?".into(), |at| wire(&at))
            );
        }
    }
    Ok(0)
}

/// `trainyard whoami`: the user and role the server takes the token for.
pub async fn whoami(args: WhoamiArgs) -> Result<u8, CliError> {
    let client = args.conn.client()?;
    let me = client.whoami().await.or_cli(&client)?;
    println!(
        "{} ({}){}",
        me.user,
        me.role.as_str(),
        if me.open {
            ", on an open server: no token needed"
        } else {
            ""
        }
    );
    Ok(0)
}

/// `trainyard logs ID`: every role's lines, oldest first.
pub async fn logs(args: JobArgs) -> Result<u8, CliError> {
    let (id, _) = job_id(&args.id)?;
    let client = args.conn.client()?;
    let mut after = 0i64;
    let mut out = std::io::stdout().lock();
    loop {
        let page = client
            .job_logs(id, Some(after), Some(LOG_PAGE))
            .await
            .or_cli(&client)?;
        for l in &page.lines {
            let _ = writeln!(
                out,
                "{} {:<5} {}{} g{}: {}",
                wire(&l.at),
                l.level,
                l.role,
                l.index,
                l.generation,
                l.message
            );
        }
        match page.next_after {
            Some(n) => after = n,
            None => break,
        }
    }
    Ok(0)
}

/// `trainyard checkpoints ID`: the committed checkpoints, newest first.
pub async fn checkpoints(args: JobArgs) -> Result<u8, CliError> {
    let (id, shown) = job_id(&args.id)?;
    let client = args.conn.client()?;
    let list = client.job_checkpoints(id).await.or_cli(&client)?;
    let mut rows = vec![[
        "STEP".to_owned(),
        "SHARDS".into(),
        "SIZE".into(),
        "EPOCH".into(),
        "AGE".into(),
        "MANIFEST".into(),
    ]];
    for c in list.checkpoints {
        rows.push([
            c.step.to_string(),
            c.shards.to_string(),
            format!("{:.1} MiB", c.bytes as f64 / (1u64 << 20) as f64),
            c.cursor.epoch.to_string(),
            age(c.committed_at),
            c.manifest_url,
        ]);
    }
    if rows.len() == 1 {
        println!(
            "job {shown} has no committed checkpoint (it keeps {})",
            list.keep
        );
        return Ok(0);
    }
    print_table(&rows);
    Ok(0)
}

/// `trainyard model ID [--format F] [-o FILE]`: downloads the final model
/// (safetensors by default, or the trained TorchScript module).
pub async fn model(args: ModelArgs) -> Result<u8, CliError> {
    let (id, _) = job_id(&args.id)?;
    let client = args.conn.client()?;
    let bytes = client.job_model_as(id, args.format).await.or_cli(&client)?;
    let output = args
        .output
        .unwrap_or_else(|| format!("{id}.{}", args.format.extension()).into());
    std::fs::write(&output, &bytes)
        .map_err(|e| CliError::Other(format!("cannot write {}: {e}", output.display())))?;
    let what = match args.format {
        ModelFormat::Safetensors => "safetensors",
        ModelFormat::Torchscript => "TorchScript module",
    };
    println!(
        "wrote {} ({} bytes of {what})",
        output.display(),
        bytes.len()
    );
    Ok(0)
}

/// `trainyard upload FILE [--name N]`: streams the file up as an artifact
/// and prints it, with the URL to write in a spec.
pub async fn upload(args: UploadArgs) -> Result<u8, CliError> {
    let name = match &args.name {
        Some(n) => n.clone(),
        None => args
            .file
            .file_name()
            .and_then(|n| n.to_str())
            .map(str::to_owned)
            .ok_or_else(|| {
                CliError::Other(format!(
                    "{} has no file name to use; give one with --name",
                    args.file.display()
                ))
            })?,
    };
    if let Some(why) = trainyard_common::artifact::artifact_name_problem(&name) {
        return Err(CliError::Other(format!("--name {name:?}: {why}")));
    }
    if !args.file.is_file() {
        return Err(CliError::Other(format!(
            "{}: no such file",
            args.file.display()
        )));
    }
    let client = args.conn.client()?;
    let a = client
        .upload_artifact(&name, &args.file)
        .await
        .or_cli(&client)?;
    println!(
        "uploaded {} as {} ({} bytes, sha256 {})",
        args.file.display(),
        a.url,
        a.size,
        a.sha256
    );
    Ok(0)
}

/// `trainyard artifacts [--owner U]`: name, size, SHA-256 and age of each.
pub async fn artifacts(args: ArtifactsArgs) -> Result<u8, CliError> {
    let client = args.conn.client()?;
    let page = client
        .artifacts(args.owner.as_deref())
        .await
        .or_cli(&client)?;
    let mut rows = vec![["URL", "OWNER", "SIZE", "SHA256", "UPLOADED"].map(str::to_owned)];
    for a in page.artifacts {
        rows.push([
            a.url,
            a.owner,
            bytes(a.size as f64),
            a.sha256.chars().take(12).collect(),
            a.created_at.format("%Y-%m-%d %H:%M:%S UTC").to_string(),
        ]);
    }
    print_table(&rows);
    Ok(0)
}

fn checked_user(owner: &str) -> Result<&str, CliError> {
    let ok = owner.len() <= 64
        && owner
            .bytes()
            .next()
            .is_some_and(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
        && owner
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"._-".contains(&b));
    if ok {
        Ok(owner)
    } else {
        Err(CliError::Other(format!(
            "{owner:?} is not a user name (1–64 of a-z 0-9 . _ -, starting with a letter or digit)"
        )))
    }
}

fn limit(v: Option<impl std::fmt::Display>) -> String {
    v.map_or("unlimited".into(), |v| v.to_string())
}

fn print_quota(q: &trainyard_common::api::QuotaInfo) {
    println!(
        "{}: cuda devices {} (in use {}), cpu workers {} (in use {}), PS RAM {} (in use {} MiB)",
        q.owner,
        limit(q.cuda_devices),
        q.in_use.cuda_devices,
        limit(q.cpu_workers),
        q.in_use.cpu_workers,
        q.ps_ram_bytes
            .map_or("unlimited".into(), |b| format!("{} MiB", b >> 20)),
        q.in_use.ps_ram_bytes >> 20
    );
}

/// `trainyard quota set|get|list` (admins).
pub async fn quota(args: QuotaArgs) -> Result<u8, CliError> {
    match args.command {
        QuotaCommand::Set {
            owner,
            cuda_devices,
            cpu_workers,
            ps_ram_mb,
            conn,
        } => {
            let client = conn.client()?;
            let limits = trainyard_common::api::QuotaLimits {
                cuda_devices,
                cpu_workers,
                ps_ram_bytes: ps_ram_mb.map(|m| m.saturating_mul(1 << 20)),
            };
            let q = client
                .set_quota(checked_user(&owner)?, &limits)
                .await
                .or_cli(&client)?;
            print_quota(&q);
        }
        QuotaCommand::Get { owner, conn } => {
            let client = conn.client()?;
            let q = client.quota(checked_user(&owner)?).await.or_cli(&client)?;
            print_quota(&q);
        }
        QuotaCommand::List { conn } => {
            let client = conn.client()?;
            let list = client.quotas().await.or_cli(&client)?;
            let mut rows = vec![[
                "OWNER",
                "CUDA",
                "IN USE",
                "CPU WORKERS",
                "IN USE",
                "PS RAM MiB",
                "IN USE",
                "BY",
            ]
            .map(str::to_owned)];
            for q in list.quotas {
                rows.push([
                    q.owner,
                    limit(q.cuda_devices),
                    q.in_use.cuda_devices.to_string(),
                    limit(q.cpu_workers),
                    q.in_use.cpu_workers.to_string(),
                    limit(q.ps_ram_bytes.map(|b| b >> 20)),
                    (q.in_use.ps_ram_bytes >> 20).to_string(),
                    q.updated_by.unwrap_or_default(),
                ]);
            }
            print_table(&rows);
        }
    }
    Ok(0)
}

/// `trainyard usage`: per user, then per job, over the window.
pub async fn usage(args: UsageArgs) -> Result<u8, CliError> {
    if let Some(o) = &args.owner {
        checked_user(o)?;
    }
    let client = args.conn.client()?;
    let q = trainyard_client::UsageQuery {
        from: args.from,
        to: args.to,
        owner: args.owner,
    };
    let r = client.usage(&q).await.or_cli(&client)?;
    println!("usage from {} to {}", wire(&r.from), wire(&r.to));
    let mut rows = vec![[
        "OWNER",
        "JOBS",
        "DEVICE-SECONDS",
        "CPU-WORKER-SECONDS",
        "PS RAM GiB-HOURS",
    ]
    .map(str::to_owned)];
    for o in &r.owners {
        rows.push([
            o.owner.clone(),
            o.jobs.to_string(),
            format!("{:.1}", o.usage.device_seconds),
            format!("{:.1}", o.usage.cpu_worker_seconds),
            format!("{:.4}", o.usage.ps_ram_gib_hours),
        ]);
    }
    print_table(&rows);
    let mut rows = vec![[
        "JOB",
        "NAME",
        "OWNER",
        "STATE",
        "DEVICE-SECONDS",
        "CPU-WORKER-SECONDS",
        "PS RAM GiB-HOURS",
    ]
    .map(str::to_owned)];
    for j in &r.jobs {
        rows.push([
            j.job_id.to_string(),
            j.name.clone(),
            j.owner.clone(),
            j.state.as_str().to_owned(),
            format!("{:.1}", j.usage.device_seconds),
            format!("{:.1}", j.usage.cpu_worker_seconds),
            format!("{:.4}", j.usage.ps_ram_gib_hours),
        ]);
    }
    println!();
    print_table(&rows);
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_checked_before_they_go_into_a_path() {
        let (id, shown) = job_id(" 01a22984-5763-70cb-9821-1dbc90a56f20 ").unwrap();
        assert_eq!(id.to_string(), shown);
        assert!(job_id("../executors").is_err());
        assert!(job_id("").is_err());
        assert!(job_id("abc").is_err());
    }
}
