//! The hub's HTTP API: one agent (rustls, redirects followed, token as Bearer), the file
//! listing `GET {endpoint}/api/models/{repo}/revision/{rev}?blobs=true` and the download URL
//! `{endpoint}/{repo}/resolve/{rev}/{file}`.

use super::hashing::is_hex_digest;
use super::RepoId;
use anyhow::{anyhow, bail, Context, Result};
use serde_json::Value;
use std::time::Duration;

/// One file of a repository as the listing reports it.
#[derive(Clone, Debug, PartialEq)]
pub struct RemoteFile {
    /// Path inside the repository (`rfilename`).
    pub path: String,
    /// Bytes, when the hub reports them (`lfs.size`, else `size`).
    pub size: Option<u64>,
    /// sha256 of the contents for LFS files (`lfs.sha256`, also their ETag).
    pub sha256: Option<String>,
    /// Git blob sha1 (`blobId`), the ETag of files not in LFS.
    pub git_sha1: Option<String>,
}

impl RemoteFile {
    /// The blob name in the cache, as Python names it: the ETag the hub serves.
    pub fn etag(&self) -> Option<&str> {
        self.sha256.as_deref().or(self.git_sha1.as_deref())
    }
}

/// A revision's listing: the commit it resolved to and its files.
#[derive(Clone, Debug)]
pub struct Listing {
    pub commit: String,
    pub files: Vec<RemoteFile>,
}

/// HTTP access to one hub.
#[derive(Clone)]
pub struct Hub {
    pub endpoint: String,
    token: Option<String>,
    agent: ureq::Agent,
}

/// Percent-encodes one path segment of a URL (revisions may contain `/`).
fn encode_segment(s: &str) -> String {
    let mut out = String::new();
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Seconds one read may wait: `HF_HUB_DOWNLOAD_TIMEOUT` as in Python, default 10.
fn read_timeout() -> Duration {
    let secs = std::env::var("HF_HUB_DOWNLOAD_TIMEOUT")
        .ok()
        .and_then(|v| v.trim().parse::<f64>().ok())
        .filter(|s| s.is_finite() && *s > 0.0)
        .unwrap_or(10.0);
    Duration::from_secs_f64(secs)
}

/// Trusted roots: Mozilla's (webpki-roots), or the PEM bundle named by `SSL_CERT_FILE` or
/// `REQUESTS_CA_BUNDLE` (what Python's clients honour) for proxies with their own CA.
fn tls_config() -> Result<ureq::tls::TlsConfig> {
    let bundle = ["SSL_CERT_FILE", "REQUESTS_CA_BUNDLE"]
        .iter()
        .find_map(|k| std::env::var(k).ok().filter(|v| !v.trim().is_empty()));
    let roots = match bundle {
        None => ureq::tls::RootCerts::WebPki,
        Some(path) => {
            let pem = std::fs::read(&path)
                .with_context(|| format!("reading the CA bundle {path} (SSL_CERT_FILE)"))?;
            let certs: Vec<ureq::tls::Certificate<'static>> = ureq::tls::parse_pem(&pem)
                .filter_map(|item| match item {
                    Ok(ureq::tls::PemItem::Certificate(c)) => Some(c),
                    _ => None,
                })
                .collect();
            if certs.is_empty() {
                bail!("the CA bundle {path} holds no PEM certificate");
            }
            ureq::tls::RootCerts::new_with_certs(&certs)
        }
    };
    Ok(ureq::tls::TlsConfig::builder().root_certs(roots).build())
}

impl Hub {
    pub fn new(endpoint: String, token: Option<String>) -> Result<Hub> {
        let config = ureq::Agent::config_builder()
            .tls_config(tls_config()?)
            // Status codes are turned into messages that name the repository.
            .http_status_as_error(false)
            .timeout_connect(Some(Duration::from_secs(30)))
            // No total body timeout: a multi-GB shard on a slow link may take hours. A read
            // that waits longer than this is a stalled connection: the transfer stops and
            // resumes with a Range request.
            .timeout_per_read(Some(read_timeout()))
            .timeout_recv_response(Some(Duration::from_secs(120)))
            .user_agent(concat!("trit/", env!("CARGO_PKG_VERSION")))
            // The hub sends LFS downloads to a CDN host with a signed URL: the token stays
            // with the hub (as in Python), relative redirects on the hub keep it.
            .redirect_auth_headers(ureq::config::RedirectAuthHeaders::SameHost)
            .build();
        Ok(Hub {
            endpoint,
            token,
            agent: config.into(),
        })
    }

    pub fn get(&self, url: &str) -> ureq::RequestBuilder<ureq::typestate::WithoutBody> {
        let mut req = self.agent.get(url);
        if let Some(t) = &self.token {
            req = req.header("Authorization", format!("Bearer {t}"));
        }
        req
    }

    /// `{endpoint}/{repo}/resolve/{rev}/{file}`; the file's `/` separators stay.
    pub fn resolve_url(&self, repo: &RepoId, revision: &str, file: &str) -> String {
        let file: Vec<String> = file.split('/').map(encode_segment).collect();
        format!(
            "{}/{}/resolve/{}/{}",
            self.endpoint,
            repo,
            encode_segment(revision),
            file.join("/")
        )
    }

    /// Lists a revision's files with their sizes and hashes.
    pub fn list(&self, repo: &RepoId, revision: &str) -> Result<Listing> {
        let url = format!(
            "{}/api/models/{}/revision/{}?blobs=true",
            self.endpoint,
            repo,
            encode_segment(revision)
        );
        let mut resp = self
            .get(&url)
            .call()
            .with_context(|| format!("contacting the hub at {url}"))?;
        let status = resp.status().as_u16();
        if status != 200 {
            bail!("{}", status_message(status, repo, revision, &url));
        }
        let text = resp
            .body_mut()
            .read_to_string()
            .with_context(|| format!("reading the listing from {url}"))?;
        parse_listing(&text).with_context(|| format!("unexpected listing from {url}"))
    }
}

/// A sentence for a failed hub request.
pub fn status_message(status: u16, repo: &RepoId, revision: &str, url: &str) -> String {
    match status {
        401 | 403 => format!(
            "{url}: HTTP {status}: access to {repo} denied; the repository may be gated or \
             private: accept its terms on the hub and set HF_TOKEN"
        ),
        404 => format!("{url}: HTTP 404: repository {repo} or revision '{revision}' not found"),
        _ => format!("{url}: HTTP {status} from the hub"),
    }
}

/// Parses the model-info JSON: `sha` and `siblings[{rfilename, size, blobId, lfs}]`.
pub fn parse_listing(text: &str) -> Result<Listing> {
    let json: Value = serde_json::from_str(text).context("not JSON")?;
    let commit = json
        .get("sha")
        .and_then(Value::as_str)
        .filter(|s| is_hex_digest(s, 40))
        .ok_or_else(|| anyhow!("no 40-hex \"sha\" commit field"))?
        .to_ascii_lowercase();
    let siblings = json
        .get("siblings")
        .and_then(Value::as_array)
        .ok_or_else(|| anyhow!("no \"siblings\" list"))?;
    let mut files = Vec::new();
    for s in siblings {
        let path = s
            .get("rfilename")
            .and_then(Value::as_str)
            .ok_or_else(|| anyhow!("a sibling without \"rfilename\""))?
            .to_string();
        let lfs = s.get("lfs").filter(|v| v.is_object());
        let sha256 = lfs
            .and_then(|l| l.get("sha256"))
            .and_then(Value::as_str)
            .map(str::to_ascii_lowercase);
        if let Some(h) = &sha256 {
            if !is_hex_digest(h, 64) {
                bail!("{path}: lfs.sha256 '{h}' is not a sha256");
            }
        }
        let size = lfs
            .and_then(|l| l.get("size"))
            .or_else(|| s.get("size"))
            .and_then(Value::as_u64);
        let git_sha1 = s
            .get("blobId")
            .and_then(Value::as_str)
            .filter(|h| is_hex_digest(h, 40))
            .map(str::to_ascii_lowercase);
        files.push(RemoteFile {
            path,
            size,
            sha256,
            git_sha1,
        });
    }
    Ok(Listing { commit, files })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listing_reads_lfs_and_plain_files() {
        let sha = "a".repeat(40);
        let text = format!(
            r#"{{"id":"o/n","sha":"{sha}","siblings":[
            {{"rfilename":"config.json","size":12,"blobId":"{b}"}},
            {{"rfilename":"model.safetensors","size":99,"blobId":"{b}",
              "lfs":{{"sha256":"{h}","size":99,"pointerSize":134}}}},
            {{"rfilename":"README.md"}}]}}"#,
            b = "b".repeat(40),
            h = "C".repeat(64)
        );
        let l = parse_listing(&text).unwrap();
        assert_eq!(l.commit, sha);
        assert_eq!(l.files[0].etag(), Some("b".repeat(40).as_str()));
        assert_eq!(l.files[1].etag(), Some("c".repeat(64).as_str()));
        assert_eq!(l.files[1].size, Some(99));
        assert_eq!(l.files[2].etag(), None);
        assert!(parse_listing(r#"{"siblings":[]}"#).is_err());
    }

    #[test]
    fn urls_keep_file_separators_and_encode_revisions() {
        let hub = Hub::new("http://h".into(), None).unwrap();
        let r = RepoId::parse("o/n").unwrap();
        assert_eq!(
            hub.resolve_url(&r, "refs/pr/1", "sub/a b.json"),
            "http://h/o/n/resolve/refs%2Fpr%2F1/sub/a%20b.json"
        );
    }
}
