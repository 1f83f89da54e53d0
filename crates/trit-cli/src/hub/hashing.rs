//! File digests the hub publishes: sha256 for LFS files, the git blob sha1 for the others.

use sha1::Sha1;
use sha2::{Digest, Sha256};
use std::io::Read;
use std::path::Path;

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn feed(path: &Path, mut update: impl FnMut(&[u8])) -> std::io::Result<()> {
    let mut f = std::fs::File::open(path)?;
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            return Ok(());
        }
        update(&buf[..n]);
    }
}

/// Lower-case hex sha256 of a file's bytes.
pub fn sha256_file(path: &Path) -> std::io::Result<String> {
    sha256_file_reporting(path, &mut |_| {})
}

/// `sha256_file`, calling `progress` with the bytes hashed so far (multi-GB shards take
/// seconds; the caller shows a bar).
pub fn sha256_file_reporting(
    path: &Path,
    progress: &mut dyn FnMut(u64),
) -> std::io::Result<String> {
    let mut h = Sha256::new();
    let mut done = 0u64;
    feed(path, |b| {
        h.update(b);
        done += b.len() as u64;
        progress(done);
    })?;
    Ok(hex(&h.finalize()))
}

/// Git's object id of a file (`sha1("blob <len>\0" + bytes)`), which the hub reports as
/// `blobId` and as the ETag of files not stored in LFS.
pub fn git_blob_sha1_file(path: &Path) -> std::io::Result<String> {
    let len = std::fs::metadata(path)?.len();
    let mut h = Sha1::new();
    h.update(format!("blob {len}\0").as_bytes());
    feed(path, |b| h.update(b))?;
    Ok(hex(&h.finalize()))
}

/// Whether `s` looks like a hex digest of `len` characters.
pub fn is_hex_digest(s: &str, len: usize) -> bool {
    s.len() == len && s.bytes().all(|b| b.is_ascii_hexdigit())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digests_match_known_values() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        std::fs::write(&p, b"hello\n").unwrap();
        // `sha256sum` and `git hash-object` of "hello\n".
        assert_eq!(
            sha256_file(&p).unwrap(),
            "5891b5b522d5df086d0ff0b110fbd9d21bb4fc7163af34d08286a2e846f6be03"
        );
        assert_eq!(
            git_blob_sha1_file(&p).unwrap(),
            "ce013625030ba8dba906f756967f9e9ca394464a"
        );
    }
}
