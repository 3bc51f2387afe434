//! `trainyard-executor`: the agent that runs training roles on one machine.
//!
//! Today it proves the libtorch link: `trainyard-executor --probe` prints, as
//! JSON, the version and path of the libtorch it loaded, whether CUDA is
//! usable, and every device it sees, after running a small matrix product on
//! each. Registration, heartbeats and the training roles build on this binary.

mod probe;

use clap::Parser;

/// Command-line flags of the executor.
#[derive(Debug, Parser)]
#[command(
    name = "trainyard-executor",
    version,
    about = "Trainyard executor agent (libtorch via tch)"
)]
struct Cli {
    /// Print libtorch's version and the devices it sees as JSON, then exit.
    #[arg(long)]
    probe: bool,
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    if cli.probe {
        let report = probe::run()?;
        println!("{}", serde_json::to_string_pretty(&report)?);
        return Ok(());
    }
    anyhow::bail!(
        "nothing to do: the executor's agent mode (registration and training roles) is not built yet; \
         run with --probe to check the libtorch link"
    )
}
