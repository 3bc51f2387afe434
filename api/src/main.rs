//! `trainyard`: the API server (with the scheduler in-process) and tools
//! around it. `trainyard serve` runs it; `trainyard openapi` prints the
//! OpenAPI document; `submit`, `jobs`, `job`, `cancel`, `executors`,
//! `logs`, `checkpoints`, `model`, `provisioner`, `token` and `whoami` are
//! the command-line
//! client of [`cli`]. The server's wiring lives in the library
//! (`Application`).

mod cli;

use clap::{Parser, Subcommand};
use std::process::ExitCode;
use tracing_subscriber::EnvFilter;
use trainyard_api::config::LogFormat;
use trainyard_api::embedded_pg::EmbeddedPostgres;
use trainyard_api::{openapi, shutdown_signal, Application, Config};

/// Trainyard: submit distributed training jobs and watch them train.
#[derive(Debug, Parser)]
#[command(name = "trainyard", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the API server.
    Serve(Box<Config>),
    /// Print the OpenAPI document (the content of openapi/openapi.json).
    Openapi,
    /// Submit a job spec (JSON file, or - for stdin) and print its id.
    Submit(cli::SubmitArgs),
    /// List jobs, newest first.
    Jobs(cli::JobsArgs),
    /// Follow a job until it ends: exit 0 when it succeeded, 1 when it
    /// failed, 3 when it was cancelled.
    Job(cli::JobArgs),
    /// Cancel a job.
    Cancel(cli::JobArgs),
    /// List executors: state, resources, roles, heartbeat freshness.
    Executors(cli::ExecutorsArgs),
    /// Print a job's log lines (every role's), oldest first.
    Logs(cli::JobArgs),
    /// List a job's committed checkpoints, newest first.
    Checkpoints(cli::JobArgs),
    /// Download a job's final weights (safetensors).
    Model(cli::ModelArgs),
    /// Show the provisioner: its limits, the executors it started, and its
    /// recent decisions with their reasons.
    Provisioner(cli::ProvisionerArgs),
    /// Make, list and revoke API tokens (admins).
    Token(cli::TokenArgs),
    /// Print the user and role the server takes your token for.
    Whoami(cli::WhoamiArgs),
}

#[tokio::main]
async fn main() -> ExitCode {
    let client = match Cli::parse().command {
        Command::Openapi => {
            print!("{}", openapi::document());
            return ExitCode::SUCCESS;
        }
        Command::Serve(config) => {
            return match serve(*config).await {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("Error: {e:?}");
                    ExitCode::FAILURE
                }
            }
        }
        Command::Submit(a) => cli::submit(a).await,
        Command::Jobs(a) => cli::jobs(a).await,
        Command::Job(a) => cli::job(a).await,
        Command::Cancel(a) => cli::cancel(a).await,
        Command::Executors(a) => cli::executors(a).await,
        Command::Logs(a) => cli::logs(a).await,
        Command::Checkpoints(a) => cli::checkpoints(a).await,
        Command::Model(a) => cli::model(a).await,
        Command::Provisioner(a) => cli::provisioner(a).await,
        Command::Token(a) => cli::token(a).await,
        Command::Whoami(a) => cli::whoami(a).await,
    };
    match client {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            e.report();
            ExitCode::from(cli::EXIT_ERROR)
        }
    }
}

async fn serve(config: Config) -> anyhow::Result<()> {
    let filter = EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| EnvFilter::new("info,sqlx=warn,tower_http=warn"));
    match config.log_format {
        LogFormat::Text => tracing_subscriber::fmt().with_env_filter(filter).init(),
        LogFormat::Json => tracing_subscriber::fmt()
            .json()
            .with_env_filter(filter)
            .init(),
    }

    let (url, embedded) = match &config.database_url {
        Some(url) => (url.clone(), None),
        None => {
            let pg = EmbeddedPostgres::start(&config.data_dir).await?;
            tracing::info!(dir = %pg.dir().display(), url = pg.url(), "private Postgres cluster running");
            (pg.url().to_owned(), Some(pg))
        }
    };

    let result = async {
        let app = Application::build(config.clone(), &url).await?;
        let addr = app.local_addr();
        tracing::info!(%addr, object_store = %config.object_store_url(), "Trainyard API listening");
        println!("Trainyard is up.\n  UI:       http://{addr}/\n  API docs: http://{addr}/docs\n  Try:      curl -s http://{addr}/v1/jobs");
        app.run_until(shutdown_signal()).await
    }
    .await;

    if let Some(pg) = embedded {
        if let Err(e) = pg.stop().await {
            tracing::warn!(error = %e, "stopping the private Postgres cluster");
        }
    }
    result
}
