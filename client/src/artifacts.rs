//! Users' files: upload (streamed from disk, never read whole), list,
//! metadata, download and delete of artifacts, named in specs as
//! `artifact:{name}`.
//!
//! An upload is never retried (its body is a stream that cannot be sent
//! twice) and is not bound by the client's timeout, which is sized for
//! ordinary requests: a large file takes as long as the link needs.

use crate::{Call, Client, ClientError, Problem};
use reqwest::header::{CONTENT_LENGTH, CONTENT_TYPE};
use reqwest::Method;
use std::path::Path;
use std::time::Duration;
use trainyard_common::artifact::{Artifact, ArtifactPage};

/// How long one upload may take in all.
const UPLOAD_TIMEOUT: Duration = Duration::from_secs(24 * 3600);

impl Client {
    /// `PUT /v1/artifacts/{name}` with the file at `path` as the body:
    /// the artifact, new or replacing the name's previous version.
    pub async fn upload_artifact(&self, name: &str, path: &Path) -> Result<Artifact, ClientError> {
        let url = format!("{}/v1/artifacts/{}", self.shared.base, encode(name));
        let file = tokio::fs::File::open(path)
            .await
            .map_err(|e| ClientError::Setup(format!("{}: {e}", path.display())))?;
        let len = file
            .metadata()
            .await
            .map_err(|e| ClientError::Setup(format!("{}: {e}", path.display())))?
            .len();
        let mut req = self
            .shared
            .http
            .request(Method::PUT, &url)
            .timeout(UPLOAD_TIMEOUT)
            .header(CONTENT_TYPE, "application/octet-stream")
            .header(CONTENT_LENGTH, len)
            .body(reqwest::Body::from(file));
        if let Some(t) = self.token() {
            req = req.bearer_auth(t);
        }
        let resp = req
            .send()
            .await
            .map_err(|e| ClientError::transport(&url, &e, UPLOAD_TIMEOUT))?;
        let status = resp.status();
        let body = resp
            .bytes()
            .await
            .map_err(|e| ClientError::transport(&url, &e, UPLOAD_TIMEOUT))?;
        if !status.is_success() {
            return Err(ClientError::Status(Box::new(Problem::from_body(
                status.as_u16(),
                &String::from_utf8_lossy(&body),
            ))));
        }
        serde_json::from_slice(&body).map_err(|e| ClientError::Decode {
            url,
            status: status.as_u16(),
            reason: format!("does not decode: {e}"),
        })
    }

    /// `GET /v1/artifacts`: this caller's artifacts (an admin's: everybody's,
    /// or `owner`'s).
    pub async fn artifacts(&self, owner: Option<&str>) -> Result<ArtifactPage, ClientError> {
        self.call(Call::get("/v1/artifacts".into()).query("owner", owner))
            .await
    }

    /// `GET /v1/artifacts/{name}`: one artifact's metadata.
    pub async fn artifact(&self, name: &str) -> Result<Artifact, ClientError> {
        self.call(Call::get(format!("/v1/artifacts/{}", encode(name))))
            .await
    }

    /// `GET /v1/artifacts/{name}/content`: its bytes.
    pub async fn artifact_content(&self, name: &str) -> Result<Vec<u8>, ClientError> {
        let call = Call::get(format!("/v1/artifacts/{}/content", encode(name)));
        Ok(self.send(call).await?.body)
    }

    /// `DELETE /v1/artifacts/{name}` (a 409 while an unfinished job reads it).
    pub async fn delete_artifact(&self, name: &str) -> Result<(), ClientError> {
        self.send(Call::new(
            Method::DELETE,
            format!("/v1/artifacts/{}", encode(name)),
        ))
        .await
        .map(drop)
    }
}

/// `name` as one path segment: what is not a valid name's character is
/// percent-encoded, so the API sees (and names) it rather than a
/// different path.
pub(crate) fn encode(name: &str) -> String {
    name.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'.' | b'_' | b'-' => (b as char).to_string(),
            b => format!("%{b:02X}"),
        })
        .collect()
}
