//! A fresh Postgres database per test (crate `trainyard-testdb`).
//!
//! The API's integration tests, the typed client's tests and the
//! end-to-end harness each need a database of their own on the shared test
//! server. This crate is the one place that knows where that server is and
//! how a test's database is named, made and dropped:
//!
//! * the server comes from `TRAINYARD_TEST_DATABASE_URL` (an admin URL;
//!   `scripts/test` sets it), else `DATABASE_URL`, else the test suite's
//!   private cluster that `ensure_test_postgres` (`scripts/common.sh`)
//!   runs, found by its password file — never the machine's own server on
//!   127.0.0.1:5432, which often trusts every local connection and which
//!   users' scripts in the tests could reach;
//! * each database is named `<prefix>_<uuid>`; prefixes start with
//!   `ty_test` (`scripts/test` drops leftovers of those before a run).

use sqlx::{Connection, PgConnection};

/// The port of the test suite's private cluster (`TEST_PG_PORT` in
/// `scripts/common.sh`).
pub const PRIVATE_CLUSTER_PORT: u16 = 55432;

/// The admin URL of the test Postgres server; panics, saying how to start
/// one, when there is none.
pub fn admin_url() -> String {
    std::env::var("TRAINYARD_TEST_DATABASE_URL")
        .or_else(|_| std::env::var("DATABASE_URL"))
        .ok()
        .or_else(private_cluster_url)
        .unwrap_or_else(|| {
            panic!(
                "no test Postgres server: set TRAINYARD_TEST_DATABASE_URL, or start the test \
                 suite's private cluster (bash -c 'source scripts/common.sh; ensure_postgres_binaries; \
                 ensure_test_postgres')"
            )
        })
}

/// The admin URL of the private cluster of `scripts/common.sh`, from the
/// password file in its folder (as root: `/var/lib/trainyard/test-postgres`;
/// otherwise, under the cache: `$XDG_CACHE_HOME` or `~/.cache`, then
/// `trainyard/test-postgres`). The root folder is tried first: others cannot
/// read it.
fn private_cluster_url() -> Option<String> {
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .map(std::path::PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| std::path::Path::new(&h).join(".cache")));
    let folders = std::iter::once(std::path::PathBuf::from("/var/lib/trainyard/test-postgres"))
        .chain(cache.map(|c| c.join("trainyard/test-postgres")));
    folders
        .filter_map(|d| std::fs::read_to_string(d.join("password")).ok())
        .map(|p| p.trim().to_owned())
        .find(|p| !p.is_empty())
        .map(|p| format!("postgres://postgres:{p}@127.0.0.1:{PRIVATE_CLUSTER_PORT}/postgres"))
}

/// `url` without its password, for messages.
pub fn redacted(url: &str) -> String {
    let Some(scheme_end) = url.find("://").map(|i| i + 3) else {
        return url.to_owned();
    };
    let authority_end = url[scheme_end..]
        .find(['/', '?'])
        .map_or(url.len(), |i| scheme_end + i);
    let authority = &url[scheme_end..authority_end];
    match (authority.rfind('@'), authority.find(':')) {
        (Some(at), Some(colon)) if colon < at => format!(
            "{}{}:***{}",
            &url[..scheme_end],
            &authority[..colon],
            &url[scheme_end + at..]
        ),
        _ => url.to_owned(),
    }
}

/// `admin` with its database replaced by `db` (its query string kept).
pub fn url_with_database(admin: &str, db: &str) -> String {
    let (base, query) = match admin.split_once('?') {
        Some((b, q)) => (b, format!("?{q}")),
        None => (admin, String::new()),
    };
    // The last '/' after the authority, if the URL names a database.
    let authority = base.find("://").map_or(0, |i| i + 3);
    let cut = base[authority..]
        .rfind('/')
        .map_or(base.len(), |i| authority + i);
    format!("{}/{db}{query}", &base[..cut])
}

/// A database of one test's own on the test server.
#[derive(Debug, Clone)]
pub struct TestDatabase {
    /// Its name.
    pub name: String,
    /// Its URL.
    pub url: String,
}

impl TestDatabase {
    /// Creates an empty database named `<prefix>_<uuid>`; panics, naming
    /// the server, if the server cannot be reached.
    pub async fn fresh(prefix: &str) -> TestDatabase {
        let name = format!("{prefix}_{}", uuid::Uuid::new_v4().simple());
        let admin = admin_url();
        let mut conn = PgConnection::connect(&admin).await.unwrap_or_else(|e| {
            panic!(
                "connect to the test Postgres server {} (set TRAINYARD_TEST_DATABASE_URL): {e}",
                redacted(&admin)
            )
        });
        sqlx::query(&format!("CREATE DATABASE {name}"))
            .execute(&mut conn)
            .await
            .unwrap_or_else(|e| panic!("creating database {name}: {e}"));
        let _ = conn.close().await;
        TestDatabase {
            url: url_with_database(&admin, &name),
            name,
        }
    }

    /// [`TestDatabase::fresh`] for code without a runtime of its own.
    pub fn fresh_blocking(prefix: &str) -> TestDatabase {
        let prefix = prefix.to_owned();
        block_on(async move { TestDatabase::fresh(&prefix).await })
    }

    /// Drops the database, its sessions and all; errors are ignored (a
    /// leftover is dropped by `scripts/test`).
    pub async fn drop_now(&self) {
        drop_database(&self.name).await;
    }
}

/// Drops database `name` on the test server, sessions and all; errors are
/// ignored.
pub async fn drop_database(name: &str) {
    if let Ok(mut conn) = PgConnection::connect(&admin_url()).await {
        let _ = sqlx::query(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
            .execute(&mut conn)
            .await;
        let _ = conn.close().await;
    }
}

/// [`drop_database`] for code without a runtime of its own.
pub fn drop_database_blocking(name: &str) {
    let name = name.to_owned();
    block_on(async move { drop_database(&name).await })
}

/// Runs `f` on a runtime of its own, on a thread of its own (so that it
/// also works where the caller is inside another runtime).
fn block_on<T: Send + 'static>(f: impl std::future::Future<Output = T> + Send + 'static) -> T {
    std::thread::spawn(move || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime for the database helper")
            .block_on(f)
    })
    .join()
    .expect("the database helper's thread")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_keep_their_authority_and_query() {
        assert_eq!(
            url_with_database("postgres://postgres@127.0.0.1:5432/postgres", "t1"),
            "postgres://postgres@127.0.0.1:5432/t1"
        );
        assert_eq!(
            url_with_database("postgres://u@h:1/db?sslmode=disable", "t2"),
            "postgres://u@h:1/t2?sslmode=disable"
        );
        assert_eq!(
            url_with_database("postgres://u@h:1", "t3"),
            "postgres://u@h:1/t3"
        );
        assert_eq!(
            url_with_database("postgres://u@h:1?host=/run/pg", "t4"),
            "postgres://u@h:1/t4?host=/run/pg"
        );
    }

    #[test]
    fn messages_name_no_password() {
        assert_eq!(
            redacted("postgres://postgres:s3cret@127.0.0.1:55432/postgres"),
            "postgres://postgres:***@127.0.0.1:55432/postgres"
        );
        assert_eq!(
            redacted("postgres://u:p@h/db?host=/run/a:b@c"),
            "postgres://u:***@h/db?host=/run/a:b@c"
        );
        assert_eq!(redacted("postgres://u@h:1/db"), "postgres://u@h:1/db");
        assert_eq!(redacted("not a url"), "not a url");
    }

    #[tokio::test]
    async fn a_fresh_database_is_empty_and_is_dropped() {
        let db = TestDatabase::fresh("ty_test_testdb").await;
        let mut conn = PgConnection::connect(&db.url).await.unwrap();
        let tables: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM information_schema.tables WHERE table_schema = 'public'",
        )
        .fetch_one(&mut conn)
        .await
        .unwrap();
        assert_eq!(tables, 0);
        conn.close().await.unwrap();
        db.drop_now().await;
        let mut admin = PgConnection::connect(&admin_url()).await.unwrap();
        let left: bool =
            sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)")
                .bind(&db.name)
                .fetch_one(&mut admin)
                .await
                .unwrap();
        assert!(!left);
    }

    #[test]
    fn the_blocking_forms_work_inside_a_runtime_too() {
        let rt = tokio::runtime::Runtime::new().unwrap();
        let db = rt.block_on(async { TestDatabase::fresh_blocking("ty_test_testdb") });
        drop_database_blocking(&db.name);
    }
}
