//! `api-bench`: throughput and latency of `POST /v1/jobs` and
//! `GET /v1/jobs/{id}` under a load generator, beside the raw rate of the
//! same SQL through Postgres, in one invocation.
//!
//! It makes a fresh database on the test Postgres server
//! (`TRAINYARD_TEST_DATABASE_URL`, else `DATABASE_URL`, else the test
//! suite's private cluster), starts the release `trainyard serve` on it (no
//! provisioner, no executors: submitted jobs stay queued while the
//! scheduler runs its rounds as in production), and drives it with `wrk`
//! (Debian's package) over loopback: submits of the digits example spec,
//! then reads of random ids among those submitted. The baseline is
//! `pgbench` running the handler's own SQL in the same database: the submit
//! transaction (job insert with `RETURNING` the job's columns, the
//! `submitted` event, `pg_notify`) and the read (`SELECT` of the job's
//! columns by id), with as many clients as wrk has connections (the API
//! itself reaches Postgres through its pool of 8). Figures:
//! requests/s against that raw rate and against the targets (1,000 submits/s,
//! 5,000 reads/s), and p50/p99 latency against pgbench's.
//!
//! `api-bench [--short] [--connections N]`.

use anyhow::{bail, Context};
use std::path::Path;
use std::process::Command;
use trainyard_api::routes::jobs::{insert_job_sql, INSERT_SUBMITTED_EVENT, JOB_COLUMNS};
use trainyard_bench::figure::{record_data, Better, Figure, Target};
use trainyard_bench::server::Server;
use trainyard_e2e::repo_root;
use trainyard_scheduler::lifecycle::JOB_CHANNEL;

/// Postgres connections of the API's pool (its default).
const POOL: u32 = 8;

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let short = args.iter().any(|a| a == "--short");
    let connections: u32 = match args.iter().position(|a| a == "--connections") {
        Some(i) => args
            .get(i + 1)
            .context("--connections needs a number")?
            .parse()
            .context("--connections")?,
        None => 32,
    };
    let seconds = if short { 5 } else { 15 };
    for tool in ["wrk", "pgbench", "psql"] {
        if Command::new(tool).arg("--version").output().is_err() {
            bail!(
                "{tool} is missing (bench/run installs wrk; pgbench and psql come with PostgreSQL)"
            );
        }
    }
    // Default logging (info): the API as it runs in production.
    let mut server = Server::start("api-bench", "api-bench-join", &[])?;
    let (base, db, work) = (server.url.clone(), server.db.clone(), server.work.clone());

    let digits = repo_root().join("data/digits.npz");
    let spec = std::fs::read_to_string(repo_root().join("examples/digits-ring.json"))?
        .replace("@DIGITS@", &format!("file://{}", digits.display()));
    let spec: serde_json::Value = serde_json::from_str(&spec)?;
    let spec = spec.to_string();
    println!(
        "# API load: wrk, {connections} connections, 2 threads, {seconds} s per run; pgbench, {connections} clients, {seconds} s; the API's Postgres pool: {POOL} connections; one machine shared by all"
    );

    // Submits.
    let post_lua = work.join("post.lua");
    std::fs::write(
        &post_lua,
        format!(
            "wrk.method = \"POST\"\nwrk.headers[\"Content-Type\"] = \"application/json\"\nwrk.body = {}\n{DONE}",
            lua_string(&spec)
        ),
    )?;
    let submit = wrk(&base, "/v1/jobs", &post_lua, connections, seconds)?;
    let submitted = psql_count(&db, "SELECT count(*) FROM jobs")?;

    // Reads of random ids among those submitted.
    let ids = psql_lines(&db, "SELECT id FROM jobs ORDER BY random() LIMIT 2000")?;
    anyhow::ensure!(
        !ids.is_empty(),
        "no job was submitted: {}",
        server.proc.output()
    );
    let get_lua = work.join("get.lua");
    let table = ids
        .iter()
        .map(|id| format!("\"{id}\""))
        .collect::<Vec<_>>()
        .join(",");
    std::fs::write(
        &get_lua,
        format!(
            "local ids = {{{table}}}\nrequest = function()\n  return wrk.format(\"GET\", \"/v1/jobs/\" .. ids[math.random(#ids)])\nend\n{DONE}"
        ),
    )?;
    let read = wrk(&base, "/v1/jobs/{id}", &get_lua, connections, seconds)?;
    server.halt();

    // The same SQL through pgbench, with the API stopped.
    let (pg_insert, pg_select) = pgbench_baselines(&db, &work, &spec, seconds, connections)?;

    println!(
        "# submits: {} in {:.1} s ({} non-2xx, {} socket errors), {submitted} jobs stored; reads: {} ({} non-2xx, {} socket errors)",
        submit.requests, submit.seconds, submit.status_errors, submit.socket_errors,
        read.requests, read.status_errors, read.socket_errors
    );
    emit_figures(&submit, &read, &pg_insert, &pg_select);
    record_data(
        "api",
        &serde_json::json!({
            "connections": connections, "seconds": seconds, "pool": POOL,
            "submit": submit.json(), "read": read.json(),
            "pgbench_insert": pg_insert.json(), "pgbench_select": pg_select.json(),
            "jobs_stored": submitted,
        }),
    );
    server.stop();
    if submit.ok() == 0 || read.ok() == 0 {
        bail!("the API answered no request successfully");
    }
    Ok(())
}

/// The API's own SQL through pgbench, with the API stopped: its submit's
/// insert and its read's select.
fn pgbench_baselines(
    db: &str,
    work: &Path,
    spec: &str,
    seconds: u32,
    connections: u32,
) -> anyhow::Result<(PgRun, PgRun)> {
    let insert_sql = work.join("insert.sql");
    // The handler's own statements, with pgbench variables for its binds
    // (the open server's user is `admin`, without an idempotency key).
    let bind = |sql: &str, values: &[&str]| {
        values
            .iter()
            .enumerate()
            .rev()
            .fold(sql.to_owned(), |q, (i, v)| {
                q.replace(&format!("${}", i + 1), v)
            })
            .replace('\n', " ")
    };
    let insert = bind(
        &insert_job_sql(),
        &[
            "gen_random_uuid()",
            "'digits-ring'",
            "'admin'",
            ":spec",
            "NULL",
            "NULL",
            "0",
            "'{\"unrestricted\": true}'",
        ],
    );
    let event = bind(
        INSERT_SUBMITTED_EVENT,
        &[
            ":id",
            "'{\"strategy\": \"allreduce\", \"idempotency_key\": null, \"owner\": \"admin\"}'",
        ],
    );
    std::fs::write(
        &insert_sql,
        format!(
            "BEGIN;\n{insert} \\gset\n{event};\nSELECT pg_notify('{JOB_CHANNEL}', :id);\nEND;\n"
        ),
    )?;
    let pg_insert = pgbench(
        db,
        &insert_sql,
        work,
        "insert",
        seconds,
        connections,
        &["-D", &format!("spec={spec}")],
    )?;
    psql(
        db,
        "CREATE TABLE bench_ids AS SELECT row_number() OVER () AS n, id FROM jobs",
    )?;
    psql(db, "ALTER TABLE bench_ids ADD PRIMARY KEY (n)")?;
    let count = psql_count(db, "SELECT count(*) FROM bench_ids")?;
    let select_sql = work.join("select.sql");
    std::fs::write(
        &select_sql,
        format!(
            "\\set n random(1, {count})\n\
             SELECT id FROM bench_ids WHERE n = :n \\gset\n\
             SELECT {JOB_COLUMNS} FROM jobs WHERE id = :id;\n"
        ),
    )?;
    let pg_select = pgbench(db, &select_sql, work, "select", seconds, connections, &[])?;

    Ok((pg_insert, pg_select))
}

/// Each route's throughput and latency against pgbench's, and its
/// throughput against the target.
fn emit_figures(submit: &WrkRun, read: &WrkRun, pg_insert: &PgRun, pg_select: &PgRun) {
    for (what, run, pg, target) in [
        ("submit (POST /v1/jobs)", submit, pg_insert, 1000.0),
        ("read (GET /v1/jobs/{id})", read, pg_select, 5000.0),
    ] {
        // Only answers that succeeded count as throughput.
        let ok_rate = run.ok() as f64 / run.seconds;
        Figure::new(
            "api",
            format!("api {what} throughput"),
            ok_rate,
            "req/s",
            "pgbench, same SQL",
            pg.tps,
            Better::Higher,
        )
        .baseline_unit("tx/s")
        .emit();
        Figure::new(
            "api",
            format!("api {what} throughput"),
            ok_rate,
            "req/s",
            "target",
            target,
            Better::Higher,
        )
        .target(Target::AtLeast(1.0))
        .emit();
        Figure::new(
            "api",
            format!("api {what} p50 latency"),
            run.p50_ms,
            "ms",
            "pgbench p50",
            pg.p50_ms,
            Better::Lower,
        )
        .emit();
        Figure::new(
            "api",
            format!("api {what} p99 latency"),
            run.p99_ms,
            "ms",
            "pgbench p99",
            pg.p99_ms,
            Better::Lower,
        )
        .emit();
    }
}

/// Lua `done` hook: wrk's summary as one JSON line.
const DONE: &str = r#"
done = function(summary, latency, requests)
  io.write(string.format('{"requests":%d,"duration_us":%d,"connect":%d,"read":%d,"write":%d,"status":%d,"timeout":%d,"p50_us":%d,"p99_us":%d,"mean_us":%f}\n',
    summary.requests, summary.duration, summary.errors.connect, summary.errors.read, summary.errors.write,
    summary.errors.status, summary.errors.timeout, latency:percentile(50), latency:percentile(99), latency.mean))
end
"#;

/// A Lua long string holding `s`.
fn lua_string(s: &str) -> String {
    let mut eq = String::new();
    while s.contains(&format!("]{eq}]")) {
        eq.push('=');
    }
    format!("[{eq}[{s}]{eq}]")
}

/// One wrk run.
#[derive(Debug)]
struct WrkRun {
    requests: u64,
    seconds: f64,
    status_errors: u64,
    socket_errors: u64,
    p50_ms: f64,
    p99_ms: f64,
    mean_ms: f64,
}

impl WrkRun {
    fn ok(&self) -> u64 {
        self.requests.saturating_sub(self.status_errors)
    }

    fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "requests": self.requests, "seconds": self.seconds, "non_2xx": self.status_errors,
            "socket_errors": self.socket_errors, "ok_per_sec": self.ok() as f64 / self.seconds,
            "p50_ms": self.p50_ms, "p99_ms": self.p99_ms, "mean_ms": self.mean_ms,
        })
    }
}

fn wrk(
    base: &str,
    what: &str,
    script: &Path,
    connections: u32,
    seconds: u32,
) -> anyhow::Result<WrkRun> {
    let url = if what.starts_with("/v1/jobs/") {
        format!("{base}/")
    } else {
        format!("{base}{what}")
    };
    let out = Command::new("wrk")
        .args([
            "-t2",
            &format!("-c{connections}"),
            &format!("-d{seconds}s"),
            "--timeout",
            "10s",
            "-s",
        ])
        .arg(script)
        .arg(&url)
        .output()
        .context("running wrk")?;
    let text = String::from_utf8_lossy(&out.stdout);
    anyhow::ensure!(
        out.status.success(),
        "wrk failed: {text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let line = text
        .lines()
        .find(|l| l.starts_with('{'))
        .with_context(|| format!("no summary from wrk: {text}"))?;
    let v: serde_json::Value = serde_json::from_str(line)?;
    let n = |k: &str| v[k].as_f64().unwrap_or(0.0);
    Ok(WrkRun {
        requests: n("requests") as u64,
        seconds: n("duration_us") / 1e6,
        status_errors: n("status") as u64,
        socket_errors: (n("connect") + n("read") + n("write") + n("timeout")) as u64,
        p50_ms: n("p50_us") / 1e3,
        p99_ms: n("p99_us") / 1e3,
        mean_ms: n("mean_us") / 1e3,
    })
}

/// One pgbench run.
#[derive(Debug)]
struct PgRun {
    transactions: usize,
    tps: f64,
    p50_ms: f64,
    p99_ms: f64,
}

impl PgRun {
    fn json(&self) -> serde_json::Value {
        serde_json::json!({"transactions": self.transactions, "tps": self.tps, "p50_ms": self.p50_ms, "p99_ms": self.p99_ms})
    }
}

#[allow(clippy::too_many_arguments)]
fn pgbench(
    db: &str,
    script: &Path,
    work: &Path,
    tag: &str,
    seconds: u32,
    clients: u32,
    extra: &[&str],
) -> anyhow::Result<PgRun> {
    let logs = work.join(format!("pgbench-{tag}"));
    std::fs::create_dir_all(&logs)?;
    let out = Command::new("pgbench")
        .args([
            "-n",
            "-M",
            "prepared",
            "-c",
            &clients.to_string(),
            "-j",
            "2",
            "-T",
            &seconds.to_string(),
            "-l",
        ])
        .arg(format!("--log-prefix={}", logs.join("log").display()))
        .args(extra)
        .arg("-f")
        .arg(script)
        .arg(db)
        .output()
        .context("running pgbench")?;
    let text = String::from_utf8_lossy(&out.stdout);
    anyhow::ensure!(
        out.status.success(),
        "pgbench failed: {text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let tps = text
        .lines()
        .find(|l| l.starts_with("tps = "))
        .and_then(|l| l["tps = ".len()..].split_whitespace().next())
        .and_then(|x| x.parse::<f64>().ok())
        .with_context(|| format!("no tps in pgbench's output: {text}"))?;
    // Per-transaction logs: "client tx latency_us script epoch us".
    let mut lat = Vec::new();
    for entry in std::fs::read_dir(&logs)? {
        let body = std::fs::read_to_string(entry?.path())?;
        lat.extend(
            body.lines()
                .filter_map(|l| l.split_whitespace().nth(2)?.parse::<f64>().ok()),
        );
    }
    lat.sort_by(f64::total_cmp);
    let pct = |p: f64| {
        if lat.is_empty() {
            f64::NAN
        } else {
            lat[((lat.len() - 1) as f64 * p).round() as usize] / 1e3
        }
    };
    Ok(PgRun {
        transactions: lat.len(),
        tps,
        p50_ms: pct(0.5),
        p99_ms: pct(0.99),
    })
}

fn psql(db: &str, sql: &str) -> anyhow::Result<String> {
    let out = Command::new("psql")
        .args([db, "-Atqc", sql])
        .output()
        .context("running psql")?;
    anyhow::ensure!(
        out.status.success(),
        "psql {sql}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn psql_lines(db: &str, sql: &str) -> anyhow::Result<Vec<String>> {
    Ok(psql(db, sql)?
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(str::to_owned)
        .collect())
}

fn psql_count(db: &str, sql: &str) -> anyhow::Result<u64> {
    Ok(psql(db, sql)?.trim().parse()?)
}
