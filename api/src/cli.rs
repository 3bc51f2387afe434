//! The command-line client inside the `trainyard` binary: `submit FILE`,
//! `jobs`, `job ID` (follows a job to its end with a progress bar and the
//! latest loss), `cancel ID`, `executors`, `logs ID`, `checkpoints ID` and
//! `model ID -o FILE`, over the same REST API as everyone else.
//!
//! The API address and token come from `--api`/`TRAINYARD_API` (default
//! `http://127.0.0.1:8080`, the server's default listen address) and
//! `--token`/`TRAINYARD_API_TOKEN`. Every failure is one line on stderr —
//! an unreachable API, a refused token, an unknown job — followed, for a
//! rejected spec, by each field the API named; exit codes are
//! [`EXIT_FAILED`], [`EXIT_CANCELLED`] and [`EXIT_ERROR`].

use clap::Args;
use reqwest::{Method, StatusCode};
use serde_json::Value;
use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// Exit code of `trainyard job` when the job failed.
pub const EXIT_FAILED: u8 = 1;
/// Exit code when the request could not be made or was refused
/// (unreachable API, rejected spec, unknown job, bad token).
pub const EXIT_ERROR: u8 = 2;
/// Exit code of `trainyard job` when the job was cancelled.
pub const EXIT_CANCELLED: u8 = 3;
/// How often `trainyard job` polls the API.
pub const POLL_INTERVAL: Duration = Duration::from_millis(500);
/// Longest wait for one answer of the API.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// How long `trainyard job` waits, after a job succeeded, for the metrics
/// of its last steps.
const SETTLE: Duration = Duration::from_secs(5);

/// How long `job ID` keeps following through an unreachable or failing API
/// (a restart, a loaded machine) before it gives up.
pub const FOLLOW_PATIENCE: Duration = Duration::from_secs(60);
/// Width of the progress bar in characters.
const BAR_WIDTH: usize = 30;
/// Without a terminal, a progress line at most this often.
const PLAIN_EVERY: Duration = Duration::from_secs(2);

/// Where the API is and how to authenticate.
#[derive(Debug, Clone, Args)]
pub struct Connection {
    /// Base URL of the Trainyard API.
    #[arg(long, env = "TRAINYARD_API", default_value = "http://127.0.0.1:8080")]
    pub api: String,
    /// Bearer token: a user's or an admin's (`trainyard token create`, or
    /// the server's `--admin-token`). Not needed by an open, loopback-only
    /// server.
    #[arg(long, env = "TRAINYARD_API_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
}

/// `trainyard submit`.
#[derive(Debug, Args)]
pub struct SubmitArgs {
    /// The job spec (JSON); `-` reads it from standard input.
    pub file: PathBuf,
    /// Makes a retried submit return the same job instead of a second one.
    #[arg(long)]
    pub idempotency_key: Option<String>,
    /// Follow the job until it ends, as `trainyard job` does.
    #[arg(long)]
    pub follow: bool,
    #[command(flatten)]
    pub conn: Connection,
}

/// `trainyard jobs`.
#[derive(Debug, Args)]
pub struct JobsArgs {
    /// Only jobs in these states (comma-separated, e.g. `queued,running`).
    #[arg(long)]
    pub state: Option<String>,
    /// How many (newest first).
    #[arg(long, default_value_t = 50)]
    pub limit: u32,
    #[command(flatten)]
    pub conn: Connection,
}

/// Commands that take a job id.
#[derive(Debug, Args)]
pub struct JobArgs {
    /// The job id.
    pub id: String,
    #[command(flatten)]
    pub conn: Connection,
}

/// `trainyard model`.
#[derive(Debug, Args)]
pub struct ModelArgs {
    /// The job id.
    pub id: String,
    /// Where to write the safetensors file.
    #[arg(short, long)]
    pub output: PathBuf,
    #[command(flatten)]
    pub conn: Connection,
}

/// `trainyard executors`.
#[derive(Debug, Args)]
pub struct ExecutorsArgs {
    /// Only executors in this state (`live`, `draining`, `lost`, `left`).
    #[arg(long)]
    pub state: Option<String>,
    #[command(flatten)]
    pub conn: Connection,
}

/// `trainyard token`.
#[derive(Debug, Args)]
pub struct TokenArgs {
    #[command(subcommand)]
    pub command: TokenCommand,
}

/// What to do with tokens (admins only).
#[derive(Debug, clap::Subcommand)]
pub enum TokenCommand {
    /// Make a token and print it (shown only this once).
    Create {
        /// The user it acts as (its jobs belong to this name).
        #[arg(long)]
        owner: String,
        /// `user` (its own jobs only) or `admin`.
        #[arg(long, default_value = "user")]
        role: String,
        /// What it is for.
        #[arg(long, default_value = "")]
        label: String,
        /// Seconds until it stops working (default: until revoked).
        #[arg(long)]
        expires_in: Option<u64>,
        #[command(flatten)]
        conn: Connection,
    },
    /// List tokens (never the tokens themselves).
    List {
        #[command(flatten)]
        conn: Connection,
    },
    /// Revoke a token by its id.
    Revoke {
        /// The token's id (from `trainyard token list`).
        id: String,
        #[command(flatten)]
        conn: Connection,
    },
}

/// `trainyard whoami`.
#[derive(Debug, Args)]
pub struct WhoamiArgs {
    #[command(flatten)]
    pub conn: Connection,
}

/// Why a command did not do what was asked: printed as one line.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// No answer from the API.
    #[error("cannot reach the Trainyard API at {api}: {cause} (set --api or TRAINYARD_API)")]
    Unreachable {
        /// The base URL tried.
        api: String,
        /// What went wrong.
        cause: String,
    },
    /// The API answered with a problem document.
    #[error("{status} {title}: {detail}")]
    Problem {
        /// HTTP status.
        status: u16,
        /// The problem's title.
        title: String,
        /// The problem's detail.
        detail: String,
        /// `(field, message)` of every field named.
        fields: Vec<(String, String)>,
    },
    /// Anything else (a file that cannot be read, an unexpected answer).
    #[error("{0}")]
    Other(String),
}

impl CliError {
    /// Prints the error (and any field errors) to stderr.
    pub fn report(&self) {
        let mut err = std::io::stderr().lock();
        let _ = writeln!(err, "error: {self}");
        if let CliError::Problem { fields, status, .. } = self {
            for (field, message) in fields {
                let field = if field.is_empty() { "(body)" } else { field };
                let _ = writeln!(err, "  {field}: {message}");
            }
            if *status == 401 {
                let _ = writeln!(err, "  (pass --token or set TRAINYARD_API_TOKEN)");
            }
        }
    }
}

/// A small client of the REST API.
pub struct Client {
    http: reqwest::Client,
    conn: Connection,
}

impl Client {
    /// A client for `conn`.
    pub fn new(conn: Connection) -> Result<Client, CliError> {
        let http = reqwest::Client::builder()
            .timeout(REQUEST_TIMEOUT)
            .build()
            .map_err(|e| CliError::Other(format!("cannot build an HTTP client: {e}")))?;
        let mut conn = conn;
        conn.api = conn.api.trim_end_matches('/').to_owned();
        Ok(Client { http, conn })
    }

    /// Sends a request and decodes a JSON answer; a problem answer becomes
    /// [`CliError::Problem`].
    pub async fn call(
        &self,
        method: Method,
        path: &str,
        body: Option<(Vec<u8>, Option<&str>)>,
    ) -> Result<Value, CliError> {
        let url = format!("{}{path}", self.conn.api);
        let mut req = self.http.request(method, &url);
        if let Some(t) = &self.conn.token {
            req = req.bearer_auth(t);
        }
        if let Some((bytes, key)) = body {
            req = req
                .header(reqwest::header::CONTENT_TYPE, "application/json")
                .body(bytes);
            if let Some(k) = key {
                req = req.header("Idempotency-Key", k);
            }
        }
        let resp = req.send().await.map_err(|e| self.unreachable(&e))?;
        let status = resp.status();
        let text = resp.text().await.map_err(|e| self.unreachable(&e))?;
        let json: Option<Value> = serde_json::from_str(&text).ok();
        if status.is_success() {
            return json.ok_or_else(|| {
                CliError::Other(format!(
                    "{url} answered {status} with a body that is not JSON"
                ))
            });
        }
        Err(problem(status, json.as_ref(), &text))
    }

    async fn get(&self, path: &str) -> Result<Value, CliError> {
        self.call(Method::GET, path, None).await
    }

    fn unreachable(&self, e: &reqwest::Error) -> CliError {
        // The innermost cause says it best ("Connection refused (os error 111)").
        let mut cause: &dyn std::error::Error = e;
        while let Some(inner) = cause.source() {
            cause = inner;
        }
        let cause = if e.is_timeout() {
            format!("no answer within {} s", REQUEST_TIMEOUT.as_secs())
        } else {
            cause.to_string()
        };
        CliError::Unreachable {
            api: self.conn.api.clone(),
            cause,
        }
    }
}

fn problem(status: StatusCode, json: Option<&Value>, text: &str) -> CliError {
    let s = |v: Option<&Value>| v.and_then(Value::as_str).map(str::to_owned);
    let Some(p) = json else {
        let snippet: String = text.chars().take(200).collect();
        return CliError::Problem {
            status: status.as_u16(),
            title: status.canonical_reason().unwrap_or("error").to_owned(),
            detail: snippet.trim().to_owned(),
            fields: Vec::new(),
        };
    };
    let fields = p["errors"]
        .as_array()
        .map(|errs| {
            errs.iter()
                .map(|e| {
                    (
                        s(e.get("field")).unwrap_or_default(),
                        s(e.get("message")).unwrap_or_default(),
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    CliError::Problem {
        status: status.as_u16(),
        title: s(p.get("title")).unwrap_or_else(|| status.to_string()),
        detail: s(p.get("detail")).unwrap_or_default(),
        fields,
    }
}

fn id_path(id: &str) -> Result<String, CliError> {
    let id = id.trim();
    if id.is_empty() || !id.chars().all(|c| c.is_ascii_alphanumeric() || c == '-') {
        return Err(CliError::Other(format!("{id:?} is not a job id")));
    }
    Ok(id.to_owned())
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
    let client = Client::new(args.conn)?;
    let job = client
        .call(
            Method::POST,
            "/v1/jobs",
            Some((bytes, args.idempotency_key.as_deref())),
        )
        .await?;
    let id = job["id"].as_str().unwrap_or_default().to_owned();
    println!(
        "submitted job {id} ({}, {}, {})",
        job["name"].as_str().unwrap_or("?"),
        job["strategy"].as_str().unwrap_or("?"),
        job["state"].as_str().unwrap_or("?")
    );
    if args.follow {
        return follow(&client, &id).await;
    }
    Ok(0)
}

/// `trainyard jobs`: a table, newest first.
pub async fn jobs(args: JobsArgs) -> Result<u8, CliError> {
    let client = Client::new(args.conn)?;
    let mut q = vec![("limit", args.limit.to_string())];
    if let Some(s) = args.state {
        q.push(("state", s));
    }
    let query = serde_urlencoded::to_string(&q).map_err(|e| CliError::Other(e.to_string()))?;
    let page = client.get(&format!("/v1/jobs?{query}")).await?;
    let mut rows = vec![[
        "ID", "NAME", "OWNER", "STATE", "STRATEGY", "WORKERS", "PS", "AGE", "REASON",
    ]
    .map(str::to_owned)];
    for j in page["jobs"].as_array().into_iter().flatten() {
        let spec = &j["spec"];
        let ps = if j["strategy"] == "allreduce" {
            "-".to_owned()
        } else {
            spec["parameter_servers"].to_string()
        };
        rows.push([
            j["id"].as_str().unwrap_or("").to_owned(),
            j["name"].as_str().unwrap_or("").to_owned(),
            j["owner"].as_str().unwrap_or("").to_owned(),
            j["state"].as_str().unwrap_or("").to_owned(),
            j["strategy"].as_str().unwrap_or("").to_owned(),
            if spec["workers"]["min"] == spec["workers"]["max"] {
                spec["workers"]["min"].to_string()
            } else {
                format!("{}-{}", spec["workers"]["min"], spec["workers"]["max"])
            },
            ps,
            age(j["created_at"].as_str()),
            j["state_reason"].as_str().unwrap_or("").to_owned(),
        ]);
    }
    print_table(&rows);
    if page["next_cursor"].is_string() {
        println!("(more: raise --limit)");
    }
    Ok(0)
}

/// `trainyard job ID`: follows the job to its end.
pub async fn job(args: JobArgs) -> Result<u8, CliError> {
    let id = id_path(&args.id)?;
    let client = Client::new(args.conn)?;
    follow(&client, &id).await
}

/// `trainyard cancel ID`.
pub async fn cancel(args: JobArgs) -> Result<u8, CliError> {
    let id = id_path(&args.id)?;
    let client = Client::new(args.conn)?;
    let job = client
        .call(Method::POST, &format!("/v1/jobs/{id}/cancel"), None)
        .await?;
    println!(
        "job {id} {} ({})",
        job["state"].as_str().unwrap_or("?"),
        job["state_reason"].as_str().unwrap_or("")
    );
    Ok(0)
}

/// `trainyard executors`: a table, newest first.
pub async fn executors(args: ExecutorsArgs) -> Result<u8, CliError> {
    let client = Client::new(args.conn)?;
    let path = match &args.state {
        Some(s) => format!(
            "/v1/executors?{}",
            serde_urlencoded::to_string([("state", s)])
                .map_err(|e| CliError::Other(e.to_string()))?
        ),
        None => "/v1/executors".to_owned(),
    };
    let list = client.get(&path).await?;
    let mut rows = vec![[
        "ID",
        "NAME",
        "STATE",
        "ADDRESS",
        "DEVICES",
        "RAM",
        "ROLES",
        "HEARTBEAT",
    ]
    .map(str::to_owned)];
    for e in list["executors"].as_array().into_iter().flatten() {
        let devices: Vec<String> = e["resources"]["devices"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|d| {
                format!(
                    "{}:{} {}",
                    d["kind"].as_str().unwrap_or("?"),
                    d["index"],
                    bytes(d["memory_bytes"].as_f64())
                )
            })
            .collect();
        let roles: Vec<String> = e["roles"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|r| {
                let job = r["job_id"].as_str().unwrap_or("");
                format!(
                    "{}{}{}@{}",
                    r["role"].as_str().unwrap_or("?"),
                    if r["standby"] == true { "-standby" } else { "" },
                    r["index"],
                    &job[job.len().saturating_sub(6)..]
                )
            })
            .collect();
        rows.push([
            e["id"].as_str().unwrap_or("").to_owned(),
            e["name"].as_str().unwrap_or("").to_owned(),
            e["state"].as_str().unwrap_or("").to_owned(),
            e["address"].as_str().unwrap_or("").to_owned(),
            devices.join(", "),
            bytes(e["resources"]["ram_bytes"].as_f64()),
            if roles.is_empty() {
                "-".into()
            } else {
                roles.join(" ")
            },
            format!(
                "{:.1} s ago",
                e["seconds_since_heartbeat"].as_f64().unwrap_or(f64::NAN)
            ),
        ]);
    }
    print_table(&rows);
    Ok(0)
}

/// Flags of `trainyard provisioner`.
#[derive(Debug, clap::Args)]
pub struct ProvisionerArgs {
    /// How many recent decisions to print.
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub limit: u32,
    #[command(flatten)]
    pub conn: Connection,
}

/// `trainyard provisioner`: settings, the executors it started, and its
/// recent decisions, oldest first.
pub async fn provisioner(args: ProvisionerArgs) -> Result<u8, CliError> {
    let client = Client::new(args.conn)?;
    let s = client
        .get(&format!("/v1/provisioner?limit={}", args.limit))
        .await?;
    let t = &s["settings"];
    println!(
        "provisioner: {} (max {} executor(s), {} per job; {} CPU(s) and {} RAM each; idle timeout {} s)",
        t["kind"].as_str().unwrap_or("?"),
        t["max_executors"],
        t["max_per_job"],
        t["executor_cpus"],
        bytes(t["executor_memory_mb"].as_f64().map(|m| m * 1048576.0)),
        t["idle_timeout_secs"]
    );
    let mut rows = vec![["NAME", "STATE", "PID", "STARTED", "REASON"].map(str::to_owned)];
    for e in s["executors"].as_array().into_iter().flatten() {
        rows.push([
            e["name"].as_str().unwrap_or("").to_owned(),
            e["state"].as_str().unwrap_or("").to_owned(),
            e["pid"].as_i64().map_or("-".into(), |p| p.to_string()),
            e["started_at"].as_str().unwrap_or("").to_owned(),
            e["reason"].as_str().unwrap_or("-").to_owned(),
        ]);
    }
    if rows.len() > 1 {
        println!();
        print_table(&rows);
    }
    let events: Vec<&serde_json::Value> = s["events"].as_array().into_iter().flatten().collect();
    if !events.is_empty() {
        println!();
    }
    for e in events.iter().rev() {
        println!(
            "{}  {:<8} {}",
            e["at"].as_str().unwrap_or(""),
            e["kind"].as_str().unwrap_or(""),
            e["reason"].as_str().unwrap_or("")
        );
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
            let client = Client::new(conn)?;
            let body = serde_json::json!({
                "owner": owner, "role": role, "label": label, "expires_in_secs": expires_in,
            });
            let t = client
                .call(
                    Method::POST,
                    "/v1/tokens",
                    Some((body.to_string().into_bytes(), None)),
                )
                .await?;
            eprintln!(
                "made a {} token for {} (id {}); it is shown only now:",
                t["role"].as_str().unwrap_or("?"),
                t["owner"].as_str().unwrap_or("?"),
                t["id"].as_str().unwrap_or("?")
            );
            println!("{}", t["token"].as_str().unwrap_or(""));
        }
        TokenCommand::List { conn } => {
            let client = Client::new(conn)?;
            let list = client.get("/v1/tokens").await?;
            let mut rows = vec![[
                "ID", "OWNER", "ROLE", "LABEL", "CREATED", "EXPIRES", "REVOKED",
            ]
            .map(str::to_owned)];
            for t in list["tokens"].as_array().into_iter().flatten() {
                let text = |k: &str| t[k].as_str().unwrap_or("-").to_owned();
                rows.push([
                    text("id"),
                    text("owner"),
                    text("role"),
                    text("label"),
                    text("created_at"),
                    text("expires_at"),
                    text("revoked_at"),
                ]);
            }
            print_table(&rows);
        }
        TokenCommand::Revoke { id, conn } => {
            let id = uuid::Uuid::parse_str(id.trim())
                .map_err(|_| CliError::Other(format!("{id:?} is not a token id")))?;
            let client = Client::new(conn)?;
            let t = client
                .call(Method::DELETE, &format!("/v1/tokens/{id}"), None)
                .await?;
            println!(
                "token {id} of {} revoked at {}",
                t["owner"].as_str().unwrap_or("?"),
                t["revoked_at"].as_str().unwrap_or("?")
            );
        }
    }
    Ok(0)
}

/// `trainyard whoami`: the user and role the server takes the token for.
pub async fn whoami(args: WhoamiArgs) -> Result<u8, CliError> {
    let client = Client::new(args.conn)?;
    let me = client.get("/v1/whoami").await?;
    println!(
        "{} ({}){}",
        me["user"].as_str().unwrap_or("?"),
        me["role"].as_str().unwrap_or("?"),
        if me["open"] == true {
            ", on an open server: no token needed"
        } else {
            ""
        }
    );
    Ok(0)
}

/// `trainyard logs ID`: every role's lines, oldest first.
pub async fn logs(args: JobArgs) -> Result<u8, CliError> {
    let id = id_path(&args.id)?;
    let client = Client::new(args.conn)?;
    let mut after = 0i64;
    let mut out = std::io::stdout().lock();
    loop {
        let page = client
            .get(&format!("/v1/jobs/{id}/logs?after={after}&limit=1000"))
            .await?;
        for l in page["lines"].as_array().into_iter().flatten() {
            let _ = writeln!(
                out,
                "{} {:<5} {}{} g{}: {}",
                l["at"].as_str().unwrap_or(""),
                l["level"].as_str().unwrap_or(""),
                l["role"].as_str().unwrap_or(""),
                l["index"],
                l["generation"],
                l["message"].as_str().unwrap_or("")
            );
        }
        match page["next_after"].as_i64() {
            Some(n) => after = n,
            None => break,
        }
    }
    Ok(0)
}

/// `trainyard checkpoints ID`: the committed checkpoints, newest first.
pub async fn checkpoints(args: JobArgs) -> Result<u8, CliError> {
    let id = id_path(&args.id)?;
    let client = Client::new(args.conn)?;
    let list = client.get(&format!("/v1/jobs/{id}/checkpoints")).await?;
    let mut rows = vec![[
        "STEP".to_owned(),
        "SHARDS".into(),
        "SIZE".into(),
        "EPOCH".into(),
        "AGE".into(),
        "MANIFEST".into(),
    ]];
    for c in list["checkpoints"].as_array().into_iter().flatten() {
        rows.push([
            c["step"].to_string(),
            c["shards"].to_string(),
            format!(
                "{:.1} MiB",
                c["bytes"].as_f64().unwrap_or(0.0) / (1u64 << 20) as f64
            ),
            c["cursor"]["epoch"].to_string(),
            age(c["committed_at"].as_str()),
            c["manifest_url"].as_str().unwrap_or("").to_owned(),
        ]);
    }
    if rows.len() == 1 {
        println!(
            "job {id} has no committed checkpoint (it keeps {})",
            list["keep"]
        );
        return Ok(0);
    }
    print_table(&rows);
    Ok(0)
}

/// `trainyard model ID -o FILE`: downloads the final weights (safetensors).
pub async fn model(args: ModelArgs) -> Result<u8, CliError> {
    let id = id_path(&args.id)?;
    let client = Client::new(args.conn)?;
    let url = format!("{}/v1/jobs/{id}/model", client.conn.api);
    let mut req = client.http.get(&url);
    if let Some(t) = &client.conn.token {
        req = req.bearer_auth(t);
    }
    let resp = req.send().await.map_err(|e| client.unreachable(&e))?;
    let status = resp.status();
    if !status.is_success() {
        let text = resp.text().await.unwrap_or_default();
        let json: Option<Value> = serde_json::from_str(&text).ok();
        return Err(problem(status, json.as_ref(), &text));
    }
    let bytes = resp.bytes().await.map_err(|e| client.unreachable(&e))?;
    std::fs::write(&args.output, &bytes)
        .map_err(|e| CliError::Other(format!("cannot write {}: {e}", args.output.display())))?;
    println!(
        "wrote {} ({} bytes of safetensors)",
        args.output.display(),
        bytes.len()
    );
    Ok(0)
}

/// Steps a job will run, when the spec says: `steps`, or `epochs` over a
/// generated dataset (whose size the spec gives). `None` for epochs over a
/// file, whose length only the executor knows.
pub fn expected_steps(spec: &Value) -> Option<u64> {
    if let Some(s) = spec["steps"].as_u64() {
        return Some(s);
    }
    let epochs = spec["epochs"].as_u64()?;
    let samples = spec["dataset"]["samples"].as_u64()?;
    let eval = spec["eval_fraction"].as_f64().unwrap_or(0.1);
    let batch = spec["batch_size"].as_u64()?.max(1);
    let workers = spec["workers"]["max"].as_u64().unwrap_or(1).max(1);
    let train = samples - (samples as f64 * eval).round() as u64;
    Some(epochs * train.div_ceil(workers).div_ceil(batch).max(1))
}

/// A text progress bar: `[#####-----]  50%`.
pub fn bar(done: u64, total: u64) -> String {
    let frac = if total == 0 {
        0.0
    } else {
        (done as f64 / total as f64).clamp(0.0, 1.0)
    };
    let full = (frac * BAR_WIDTH as f64).round() as usize;
    format!(
        "[{}{}] {:>3.0}%",
        "#".repeat(full),
        "-".repeat(BAR_WIDTH - full),
        frac * 100.0
    )
}

async fn follow(client: &Client, id: &str) -> Result<u8, CliError> {
    let tty = std::io::stderr().is_terminal();
    let mut last_state = String::new();
    let mut last_line = String::new();
    let mut last_print = Instant::now() - PLAIN_EVERY;
    let mut settle_until: Option<Instant> = None;
    loop {
        // Once the API answered, a later outage is waited out (an API that
        // was never reachable is an error at once).
        let patience = if last_state.is_empty() {
            Duration::ZERO
        } else {
            FOLLOW_PATIENCE
        };
        let job = patiently(client, &format!("/v1/jobs/{id}"), patience).await?;
        let state = job["state"].as_str().unwrap_or("?").to_owned();
        let terminal = matches!(state.as_str(), "succeeded" | "failed" | "cancelled");
        let metrics = patiently(
            client,
            &format!("/v1/jobs/{id}/metrics?max_points=200"),
            patience,
        )
        .await?;
        let step = metrics["steps_recorded"].as_u64().unwrap_or(0);
        let latest = metrics["points"].as_array().and_then(|p| p.last());
        let total = expected_steps(&job["spec"]);
        // The last steps' metrics may land just after the outcome: give
        // them a moment so that the final line shows the whole run.
        let short = state == "succeeded" && total.is_some_and(|t| step < t);
        let settling = terminal
            && short
            && *settle_until.get_or_insert_with(|| Instant::now() + SETTLE) > Instant::now();
        let done = terminal && !settling;
        let mut line = format!("{:<11} step {step}", state);
        if let Some(total) = total {
            line = format!("{:<11} {} {step}/{total}", state, bar(step, total));
        }
        if let Some(p) = latest {
            if let Some(loss) = p["loss"].as_f64() {
                line.push_str(&format!("  loss {loss:.4}"));
            }
            if let Some(acc) = p["eval_accuracy"].as_f64() {
                line.push_str(&format!("  held-out acc {:.1}%", acc * 100.0));
            }
        }
        let mut err = std::io::stderr().lock();
        if state != last_state {
            if tty && !last_line.is_empty() {
                let _ = writeln!(err);
            }
            let _ = writeln!(
                err,
                "job {id}: {state} ({})",
                job["state_reason"].as_str().unwrap_or("")
            );
            last_state = state.clone();
        }
        if tty {
            let _ = write!(err, "\r{line:<100}");
            let _ = err.flush();
        } else if line != last_line && (last_print.elapsed() >= PLAIN_EVERY || done) {
            let _ = writeln!(err, "{line}");
            last_print = Instant::now();
        }
        last_line = line;
        if done {
            if tty {
                let _ = writeln!(err);
            }
            drop(err);
            return Ok(finish(client, id, &state).await);
        }
        drop(err);
        tokio::time::sleep(POLL_INTERVAL).await;
    }
}

/// A GET that rides out an unreachable API or a 5xx answer for up to
/// `patience`; anything else (a 404, a bad token) fails at once.
async fn patiently(client: &Client, path: &str, patience: Duration) -> Result<Value, CliError> {
    let give_up = Instant::now() + patience;
    loop {
        match client.get(path).await {
            Err(CliError::Unreachable { .. }) | Err(CliError::Problem { status: 500.., .. })
                if Instant::now() < give_up =>
            {
                tokio::time::sleep(POLL_INTERVAL * 2).await
            }
            other => return other,
        }
    }
}

/// Prints how the job ended (and where its weights are); the exit code.
async fn finish(client: &Client, id: &str, state: &str) -> u8 {
    if let Ok(events) = client
        .get(&format!("/v1/jobs/{id}/events?limit=1000"))
        .await
    {
        let list = events["events"].as_array().cloned().unwrap_or_default();
        if let Some(r) = list.iter().rev().find(|e| e["kind"] == "result") {
            if let Some(url) = r["data"]["weights_url"].as_str() {
                println!("weights: {url}");
            }
        }
        if let Some(e) = list.iter().rev().find(|e| e["to_state"] == state) {
            println!(
                "job {id} {state}: {}",
                e["reason"].as_str().unwrap_or_default()
            );
        }
    }
    match state {
        "succeeded" => 0,
        "cancelled" => EXIT_CANCELLED,
        _ => EXIT_FAILED,
    }
}

fn age(created: Option<&str>) -> String {
    let Some(t) = created.and_then(|c| chrono::DateTime::parse_from_rfc3339(c).ok()) else {
        return "?".into();
    };
    let s = (chrono::Utc::now() - t.with_timezone(&chrono::Utc))
        .num_seconds()
        .max(0);
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m", s / 60),
        3600..86400 => format!("{}h", s / 3600),
        _ => format!("{}d", s / 86400),
    }
}

fn bytes(b: Option<f64>) -> String {
    match b {
        Some(b) if b >= (1u64 << 30) as f64 => format!("{:.1} GiB", b / (1u64 << 30) as f64),
        Some(b) => format!("{:.0} MiB", b / (1u64 << 20) as f64),
        None => "?".into(),
    }
}

fn print_table<const N: usize>(rows: &[[String; N]]) {
    let mut widths = [0usize; N];
    for r in rows {
        for (w, c) in widths.iter_mut().zip(r) {
            *w = (*w).max(c.chars().count());
        }
    }
    let mut out = std::io::stdout().lock();
    for r in rows {
        let line: Vec<String> = r
            .iter()
            .zip(widths)
            .enumerate()
            .map(|(i, (c, w))| {
                if i + 1 == N {
                    c.clone()
                } else {
                    format!("{c:<w$}")
                }
            })
            .collect();
        let _ = writeln!(out, "{}", line.join("  ").trim_end());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_bar_fills_with_progress() {
        assert_eq!(bar(0, 10), format!("[{}]   0%", "-".repeat(BAR_WIDTH)));
        assert_eq!(bar(10, 10), format!("[{}] 100%", "#".repeat(BAR_WIDTH)));
        assert!(bar(5, 10).contains(&"#".repeat(BAR_WIDTH / 2)));
        assert!(bar(50, 10).ends_with("100%"), "clamped");
        assert!(bar(3, 0).ends_with("  0%"), "no total");
    }

    #[test]
    fn expected_steps_from_steps_or_a_generated_dataset() {
        assert_eq!(expected_steps(&json!({"steps": 1200})), Some(1200));
        let spec = json!({"epochs": 2, "batch_size": 32, "eval_fraction": 0.2,
            "dataset": {"kind": "classification", "samples": 1000}, "workers": {"min": 1, "max": 1}});
        // 800 training samples → 25 batches of 32 per epoch.
        assert_eq!(expected_steps(&spec), Some(50));
        let file = json!({"epochs": 2, "batch_size": 32, "dataset": {"kind": "file", "url": "file:///x.npz"}});
        assert_eq!(expected_steps(&file), None);
    }

    #[test]
    fn problems_keep_their_field_errors() {
        let p = json!({"title": "Invalid request", "detail": "1 invalid field(s)",
            "errors": [{"field": "batch_size", "message": "must be between 1 and 65536, got 0"}]});
        let e = problem(StatusCode::UNPROCESSABLE_ENTITY, Some(&p), "");
        assert_eq!(e.to_string(), "422 Invalid request: 1 invalid field(s)");
        match e {
            CliError::Problem { fields, .. } => assert_eq!(
                fields,
                vec![(
                    "batch_size".to_owned(),
                    "must be between 1 and 65536, got 0".to_owned()
                )]
            ),
            other => panic!("{other:?}"),
        }
        let plain = problem(StatusCode::BAD_GATEWAY, None, "upstream down");
        assert_eq!(plain.to_string(), "502 Bad Gateway: upstream down");
    }

    #[test]
    fn ids_are_checked_before_they_go_into_a_path() {
        assert!(id_path("01a22984-5763-70cb-9821-1dbc90a56f20").is_ok());
        assert!(id_path("../executors").is_err());
        assert!(id_path("").is_err());
    }
}
