//! `trainyard`: the one binary of Trainyard's control plane and its
//! command-line client.
//!
//! * `trainyard serve` runs the API server with the scheduler in-process
//!   ([`serve`], over `trainyard-api`'s `Application`); `trainyard openapi`
//!   prints the OpenAPI document.
//! * `submit`, `jobs`, `job`, `cancel`, `executors`, `logs`,
//!   `checkpoints`, `model`, `provisioner`, `token` and `whoami` are the
//!   command-line client ([`scripts`]: `run-script` and `outputs`, a
//!   user's own training script as a job; [`sweeps`]: `sweep create|list|
//!   show|cancel`, hyperparameter sweeps): [`args`] (their flags, and where the API is),
//!   [`commands`] (one request and a printout each), [`follow`] (`job ID`
//!   and `submit --follow`: a progress line until the job ends), [`table`]
//!   (how values print) and [`error`] (the one-line errors and the exit
//!   codes). Every request goes through `trainyard-client` and its typed
//!   answers.

mod args;
mod commands;
mod error;
mod follow;
mod scripts;
mod serve;
mod sweeps;
mod table;

use clap::{Parser, Subcommand};
use std::process::ExitCode;
use trainyard_api::{openapi, Config};

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
    Submit(args::SubmitArgs),
    /// List jobs, newest first.
    Jobs(args::JobsArgs),
    /// Follow a job until it ends: exit 0 when it succeeded, 1 when it
    /// failed, 3 when it was cancelled.
    Job(args::JobArgs),
    /// Cancel a job.
    Cancel(args::JobArgs),
    /// List executors: state, resources, roles, heartbeat freshness.
    Executors(args::ExecutorsArgs),
    /// Print a job's log lines (every role's), oldest first.
    Logs(args::JobArgs),
    /// List a job's committed checkpoints, newest first.
    Checkpoints(args::JobArgs),
    /// Download a job's final model: safetensors, or (`--format
    /// torchscript`) the trained TorchScript module.
    Model(args::ModelArgs),
    /// Show the provisioner: its limits, the executors it started, and its
    /// recent decisions with their reasons.
    Provisioner(args::ProvisionerArgs),
    /// Upload a file (model or dataset) as an artifact; a spec names it
    /// `artifact:NAME`.
    Upload(args::UploadArgs),
    /// List your artifacts (an admin's: everybody's).
    Artifacts(args::ArtifactsArgs),
    /// Run your own training script (torchrun's contract) as a job: uploads
    /// it (packed with `--files`) and its inputs, submits, prints the id.
    RunScript(args::RunScriptArgs),
    /// List a script job's outputs, or download one.
    Outputs(args::OutputsArgs),
    /// Make, list and revoke API tokens (admins).
    Token(args::TokenArgs),
    /// Print the user and role the server takes your token for.
    Whoami(args::WhoamiArgs),
    /// Users' quotas: set, read, list (admins).
    Quota(args::QuotaArgs),
    /// Usage per user and per job over a window (yours; admins: everyone's).
    Usage(args::UsageArgs),
    /// Hyperparameter sweeps: create (and follow), list, show, cancel.
    Sweep(args::SweepArgs),
}

#[tokio::main]
async fn main() -> ExitCode {
    let client = match Cli::parse().command {
        Command::Openapi => {
            print!("{}", openapi::document());
            return ExitCode::SUCCESS;
        }
        Command::Serve(config) => {
            return match serve::serve(*config).await {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("Error: {e:?}");
                    ExitCode::FAILURE
                }
            }
        }
        Command::Submit(a) => commands::submit(a).await,
        Command::Jobs(a) => commands::jobs(a).await,
        Command::Job(a) => commands::job(a).await,
        Command::Cancel(a) => commands::cancel(a).await,
        Command::Executors(a) => commands::executors(a).await,
        Command::Logs(a) => commands::logs(a).await,
        Command::Checkpoints(a) => commands::checkpoints(a).await,
        Command::Model(a) => commands::model(a).await,
        Command::Provisioner(a) => commands::provisioner(a).await,
        Command::Upload(a) => commands::upload(a).await,
        Command::Artifacts(a) => commands::artifacts(a).await,
        Command::RunScript(a) => scripts::run_script(a).await,
        Command::Outputs(a) => scripts::outputs(a).await,
        Command::Token(a) => commands::token(a).await,
        Command::Whoami(a) => commands::whoami(a).await,
        Command::Quota(a) => commands::quota(a).await,
        Command::Usage(a) => commands::usage(a).await,
        Command::Sweep(a) => sweeps::sweep(a).await,
    };
    match client {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            e.report();
            ExitCode::from(error::EXIT_ERROR)
        }
    }
}
