//! How a client command fails: one line on stderr — an unreachable API, a
//! refused token, an unknown job — followed, for a rejected spec, by each
//! field the API named; and the exit codes ([`EXIT_FAILED`],
//! [`EXIT_ERROR`], [`EXIT_CANCELLED`]).

use std::io::Write;
use trainyard_client::{Client, ClientError};

/// Exit code of `trainyard job` when the job failed.
pub const EXIT_FAILED: u8 = 1;
/// Exit code when the request could not be made or was refused
/// (unreachable API, rejected spec, unknown job, bad token).
pub const EXIT_ERROR: u8 = 2;
/// Exit code of `trainyard job` when the job was cancelled.
pub const EXIT_CANCELLED: u8 = 3;

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
    /// What a failed request of the API at `api` means to the user.
    pub fn from_client(e: ClientError, api: &str) -> CliError {
        match e {
            ClientError::Unreachable { cause, .. } => CliError::Unreachable {
                api: api.to_owned(),
                cause,
            },
            ClientError::Timeout { after, .. } => CliError::Unreachable {
                api: api.to_owned(),
                cause: format!("no answer within {} s", after.as_secs()),
            },
            ClientError::Status(p) => CliError::Problem {
                status: p.status,
                title: p.title,
                detail: p.detail,
                fields: p.errors.into_iter().map(|v| (v.field, v.message)).collect(),
            },
            other @ (ClientError::Decode { .. } | ClientError::Setup(_)) => {
                CliError::Other(other.to_string())
            }
        }
    }

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

/// A request's result as a command's: its error in the user's terms.
pub trait OrCli<T> {
    /// The error of a request to `client`'s API as a [`CliError`].
    fn or_cli(self, client: &Client) -> Result<T, CliError>;
}

impl<T> OrCli<T> for Result<T, ClientError> {
    fn or_cli(self, client: &Client) -> Result<T, CliError> {
        self.map_err(|e| CliError::from_client(e, client.base_url()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use trainyard_client::Problem;

    #[test]
    fn client_errors_read_as_before() {
        let api = "http://127.0.0.1:9";
        let down = ClientError::Unreachable {
            url: format!("{api}/v1/jobs"),
            cause: "Connection refused (os error 111)".into(),
        };
        assert_eq!(
            CliError::from_client(down, api).to_string(),
            "cannot reach the Trainyard API at http://127.0.0.1:9: Connection refused (os error 111) (set --api or TRAINYARD_API)"
        );
        let slow = ClientError::Timeout {
            url: format!("{api}/v1/jobs"),
            after: std::time::Duration::from_secs(30),
        };
        assert!(CliError::from_client(slow, api)
            .to_string()
            .contains(": no answer within 30 s (set --api"));
        let body = r#"{"title": "Invalid request", "detail": "1 invalid field(s)",
            "errors": [{"field": "batch_size", "message": "must be between 1 and 65536, got 0"}]}"#;
        let bad = ClientError::Status(Box::new(Problem::from_body(422, body)));
        match CliError::from_client(bad, api) {
            e @ CliError::Problem { .. } => {
                assert_eq!(e.to_string(), "422 Invalid request: 1 invalid field(s)");
                let CliError::Problem { fields, .. } = e else {
                    unreachable!()
                };
                assert_eq!(
                    fields,
                    vec![(
                        "batch_size".to_owned(),
                        "must be between 1 and 65536, got 0".to_owned()
                    )]
                );
            }
            other => panic!("{other:?}"),
        }
        let garbled = ClientError::Decode {
            url: format!("{api}/v1/jobs"),
            status: 200,
            reason: "is not JSON".into(),
        };
        assert_eq!(
            CliError::from_client(garbled, api).to_string(),
            "http://127.0.0.1:9/v1/jobs answered 200 OK with a body that is not JSON"
        );
    }
}
