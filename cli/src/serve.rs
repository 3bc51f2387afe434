//! `trainyard serve`: the API server of `trainyard-api` as a process — its
//! logging set up, a private Postgres cluster when no `DATABASE_URL` is
//! given, and a graceful stop on SIGINT or SIGTERM. Everything else (the
//! routes, the scheduler loop, migrations) is the library's
//! [`Application`].

use tracing_subscriber::EnvFilter;
use trainyard_api::config::LogFormat;
use trainyard_api::embedded_pg::EmbeddedPostgres;
use trainyard_api::{shutdown_signal, Application, Config};

/// Runs the server until a shutdown signal.
pub async fn serve(config: Config) -> anyhow::Result<()> {
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
            // The URL carries the cluster's password: log where it is instead.
            tracing::info!(dir = %pg.dir().display(), socket = %pg.socket().display(), "private Postgres cluster running");
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
