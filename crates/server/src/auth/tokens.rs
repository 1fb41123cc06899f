//! The token file: `$FORKD_HOME/tokens.json`, names and SHA-256 digests of bearer secrets.
//!
//! **Format** (version 1, written by forkd; editing it by hand is possible but not needed):
//!
//! ```json
//! {"version": 1, "tokens": [{"name": "ci", "sha256": "<64 hex digits>", "created_at": "2026-11-02T10:00:00Z"}]}
//! ```
//!
//! **Secrets** are `fkd_` followed by 64 hex digits: 256 bits from the operating system's random
//! source. With that much entropy a plain SHA-256 is the right digest (a slow password hash
//! protects guessable secrets; these are not), and a lookup compares the presented secret's
//! digest with every stored one in constant time.
//!
//! **Writes** (`create`, `revoke`) hold an exclusive lock on `tokens.lock` beside the file for
//! their read-modify-write, write a temporary file with mode 0600, sync it and rename it over
//! `tokens.json`: a reader sees the old file or the new one, never half of one.
//!
//! **Reloads**: a running daemon picks up tokens created or revoked by `forkd token` without a
//! restart. Each lookup `stat`s the file (one system call) and re-reads it only when its
//! identity, size, or modification or change time differ from the copy it holds, so revocation
//! takes effect on the next call. File times advance in coarse ticks, so two writes in one tick
//! can leave equal stamps: as git does with its index, a copy read less than a second after the
//! file last changed is not trusted, and the file is read again until it has aged. A file that cannot be read or parsed fails every lookup that
//! needs it (closed, with the reason in the log) until it is fixed: the last good copy is not
//! kept, since it may hold a token someone meant to revoke.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write as _};
use std::os::unix::fs::{MetadataExt as _, OpenOptionsExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::SystemTime;

use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};
use subtle::ConstantTimeEq as _;

use forkd_core::tenant::TenantNameError;

use super::Tenant;

/// The token file's name in `FORKD_HOME`.
pub const TOKENS_FILE: &str = "tokens.json";
/// The lock file that serializes `create` and `revoke`.
const LOCK_FILE: &str = "tokens.lock";
/// Every secret starts with this, so a leaked one is recognizable (and scannable) as forkd's.
const SECRET_PREFIX: &str = "fkd_";
/// Random bytes in a secret.
const SECRET_BYTES: usize = 32;
/// The file format this build reads and writes.
const FORMAT_VERSION: u32 = 1;

/// Something went wrong with a token or the token file.
#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    #[error(
        "invalid token name `{0}`: use 1 to 64 ASCII letters, digits, `-`, `_` or `.`, \
         starting with a letter or a digit"
    )]
    InvalidName(String),
    #[error("`local` is the tenant of Unix-socket clients without a token and cannot name a token")]
    ReservedName,
    #[error("a token named `{0}` already exists; revoke it first to replace it")]
    Exists(String),
    #[error("no token named `{0}`")]
    NotFound(String),
    #[error("cannot read the token file {}: {source}", path.display())]
    Read { path: PathBuf, source: io::Error },
    #[error("the token file {} is not valid: {why}", path.display())]
    Invalid { path: PathBuf, why: String },
    #[error("cannot write the token file {}: {source}", path.display())]
    Write { path: PathBuf, source: io::Error },
    #[error("the operating system gave no random bytes for a secret: {0}")]
    Random(getrandom::Error),
}

/// A newly created bearer secret. It exists only in memory and on the creator's screen; its
/// `Debug` form is redacted so it cannot leak into logs by accident.
pub struct Secret(String);

impl Secret {
    /// The secret, as clients send it after `Bearer `.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}

/// What `forkd token list` shows of a token: never its secret or digest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenInfo {
    /// The token's name, which is its tenant's.
    pub name: String,
    /// When it was created, RFC 3339 in UTC.
    pub created_at: String,
}

/// The file as stored.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct TokenFile {
    version: u32,
    tokens: Vec<StoredToken>,
}

impl Default for TokenFile {
    fn default() -> Self {
        Self {
            version: FORMAT_VERSION,
            tokens: Vec::new(),
        }
    }
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct StoredToken {
    name: String,
    /// Lowercase hex of SHA-256 over the secret's UTF-8 bytes.
    sha256: String,
    created_at: String,
}

/// A token as held in memory for lookups.
#[derive(Debug)]
struct Entry {
    tenant: Tenant,
    digest: [u8; 32],
    created_at: String,
}

/// What identifies one version of the file without reading it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stamp {
    Absent,
    Present {
        dev: u64,
        ino: u64,
        len: u64,
        mtime: (i64, i64),
        ctime: (i64, i64),
    },
}

impl Stamp {
    fn of(meta: &fs::Metadata) -> Self {
        Self::Present {
            dev: meta.dev(),
            ino: meta.ino(),
            len: meta.len(),
            mtime: (meta.mtime(), meta.mtime_nsec()),
            ctime: (meta.ctime(), meta.ctime_nsec()),
        }
    }
}

impl Stamp {
    /// True when the file last changed (`ctime`, which nobody can set back) well before `now`:
    /// a later write then necessarily changes the stamp.
    fn settled(&self, now: SystemTime) -> bool {
        const SETTLE_NANOS: i128 = 1_000_000_000;
        match self {
            Self::Absent => true,
            Self::Present { ctime, .. } => {
                let changed = i128::from(ctime.0) * 1_000_000_000 + i128::from(ctime.1);
                let now = now
                    .duration_since(SystemTime::UNIX_EPOCH)
                    .map_or(0, |d| i128::try_from(d.as_nanos()).unwrap_or(i128::MAX));
                now - changed > SETTLE_NANOS
            }
        }
    }
}

#[derive(Debug, Default)]
struct Cache {
    /// `None` until the first load.
    stamp: Option<Stamp>,
    /// The stamp was settled when the copy was read (see [`Stamp::settled`]).
    trusted: bool,
    entries: Arc<[Entry]>,
}

/// The tokens of one `FORKD_HOME`. Clones share one cached copy of the file.
#[derive(Debug, Clone)]
pub struct TokenStore {
    path: PathBuf,
    cache: Arc<Mutex<Cache>>,
}

impl TokenStore {
    /// The store at `home/tokens.json`. Nothing is read until it is used.
    pub fn in_home(home: &Path) -> Self {
        Self::at(home.join(TOKENS_FILE))
    }

    /// The store at `path` (its lock file goes beside it).
    pub fn at(path: PathBuf) -> Self {
        Self {
            path,
            cache: Arc::default(),
        }
    }

    /// The token file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// True when at least one token exists. Reads (and so validates) the file if it changed.
    pub fn has_tokens(&self) -> Result<bool, TokenError> {
        Ok(!self.current()?.is_empty())
    }

    /// The tenant whose token this is, or `None` for a secret no token has.
    pub fn authenticate(&self, secret: &str) -> Result<Option<Tenant>, TokenError> {
        let digest = digest(secret);
        let entries = self.current()?;
        let mut found = None;
        // Every entry is compared, in constant time, whether or not an earlier one matched.
        for entry in entries.iter() {
            if bool::from(entry.digest[..].ct_eq(&digest[..])) {
                found = Some(entry.tenant.clone());
            }
        }
        Ok(found)
    }

    /// The tokens, in the order they were created.
    pub fn list(&self) -> Result<Vec<TokenInfo>, TokenError> {
        Ok(self
            .current()?
            .iter()
            .map(|e| TokenInfo {
                name: e.tenant.name().to_owned(),
                created_at: e.created_at.clone(),
            })
            .collect())
    }

    /// Creates a token for tenant `name` and returns its secret, which is not stored anywhere.
    /// The folder holding the file must exist.
    pub fn create(&self, name: &str) -> Result<Secret, TokenError> {
        validate_name(name)?;
        let _lock = self.lock()?;
        let (mut file, _) = self.read()?;
        if file.tokens.iter().any(|t| t.name == name) {
            return Err(TokenError::Exists(name.to_owned()));
        }
        let mut random = [0u8; SECRET_BYTES];
        getrandom::fill(&mut random).map_err(TokenError::Random)?;
        let secret = Secret(format!("{SECRET_PREFIX}{}", hex::encode(random)));
        file.tokens.push(StoredToken {
            name: name.to_owned(),
            sha256: hex::encode(digest(secret.expose())),
            created_at: humantime::format_rfc3339_seconds(SystemTime::now()).to_string(),
        });
        self.write(&file)?;
        Ok(secret)
    }

    /// Deletes the token named `name`; calls presenting its secret fail from then on.
    pub fn revoke(&self, name: &str) -> Result<(), TokenError> {
        let _lock = self.lock()?;
        let (mut file, _) = self.read()?;
        let before = file.tokens.len();
        file.tokens.retain(|t| t.name != name);
        if file.tokens.len() == before {
            return Err(TokenError::NotFound(name.to_owned()));
        }
        self.write(&file)
    }

    /// The tokens as the file holds them now, re-read only if it changed since the last call.
    fn current(&self) -> Result<Arc<[Entry]>, TokenError> {
        let now = SystemTime::now();
        let stamp = match fs::metadata(&self.path) {
            Ok(meta) => Stamp::of(&meta),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Stamp::Absent,
            Err(source) => {
                return Err(TokenError::Read {
                    path: self.path.clone(),
                    source,
                });
            }
        };
        let mut cache = self.cache.lock().unwrap_or_else(PoisonError::into_inner);
        if cache.trusted && cache.stamp == Some(stamp) {
            return Ok(Arc::clone(&cache.entries));
        }
        // Read after the stat: the content is at least as new as the stamp, so a change in
        // between is only read once more at the next call, never missed.
        let (_, entries) = self.read()?;
        let entries: Arc<[Entry]> = entries.into();
        cache.stamp = Some(stamp);
        cache.trusted = stamp.settled(now);
        cache.entries = Arc::clone(&entries);
        Ok(entries)
    }

    /// Reads and validates the file; an absent file holds no tokens.
    fn read(&self) -> Result<(TokenFile, Vec<Entry>), TokenError> {
        let bytes = match fs::read(&self.path) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return Ok((TokenFile::default(), Vec::new()));
            }
            Err(source) => {
                return Err(TokenError::Read {
                    path: self.path.clone(),
                    source,
                });
            }
        };
        let invalid = |why: String| TokenError::Invalid {
            path: self.path.clone(),
            why,
        };
        let file: TokenFile = serde_json::from_slice(&bytes).map_err(|e| invalid(e.to_string()))?;
        if file.version != FORMAT_VERSION {
            return Err(invalid(format!(
                "version {} is not one this forkd reads (it reads {FORMAT_VERSION})",
                file.version
            )));
        }
        let mut entries: Vec<Entry> = Vec::with_capacity(file.tokens.len());
        for token in &file.tokens {
            validate_name(&token.name).map_err(|e| invalid(e.to_string()))?;
            let tenant = Tenant::new(&token.name).map_err(|e| invalid(e.to_string()))?;
            if entries.iter().any(|e| e.tenant.name() == token.name) {
                return Err(invalid(format!("the name `{}` appears twice", token.name)));
            }
            let digest = hex::decode(&token.sha256)
                .ok()
                .and_then(|d| <[u8; 32]>::try_from(d).ok())
                .ok_or_else(|| {
                    invalid(format!(
                        "the sha256 of `{}` is not 64 hex digits",
                        token.name
                    ))
                })?;
            entries.push(Entry {
                tenant,
                digest,
                created_at: token.created_at.clone(),
            });
        }
        Ok((file, entries))
    }

    /// Replaces the file atomically with a mode-0600 copy of `file`.
    fn write(&self, file: &TokenFile) -> Result<(), TokenError> {
        let failed = |source: io::Error| TokenError::Write {
            path: self.path.clone(),
            source,
        };
        let dir = self.dir();
        let mut bytes = serde_json::to_vec_pretty(file).map_err(|e| failed(e.into()))?;
        bytes.push(b'\n');
        let mut tmp = tempfile::Builder::new()
            .prefix(".tokens.json.")
            .permissions(fs::Permissions::from_mode(0o600))
            .tempfile_in(dir)
            .map_err(failed)?;
        tmp.write_all(&bytes).map_err(failed)?;
        tmp.as_file().sync_all().map_err(failed)?;
        tmp.persist(&self.path).map_err(|e| failed(e.error))?;
        // The rename is durable once the directory is synced.
        File::open(dir).and_then(|d| d.sync_all()).map_err(failed)?;
        Ok(())
    }

    /// Holds the exclusive lock on the lock file until the returned file is dropped.
    fn lock(&self) -> Result<File, TokenError> {
        let path = self.dir().join(LOCK_FILE);
        let lock = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .mode(0o600)
            .open(&path)
            .and_then(|f| f.lock().map(|()| f))
            .map_err(|source| TokenError::Write { path, source })?;
        Ok(lock)
    }

    fn dir(&self) -> &Path {
        match self.path.parent() {
            Some(dir) if !dir.as_os_str().is_empty() => dir,
            _ => Path::new("."),
        }
    }
}

/// SHA-256 of a secret's bytes.
fn digest(secret: &str) -> [u8; 32] {
    Sha256::digest(secret.as_bytes()).into()
}

/// Checks a token (tenant) name: the tenant naming rules, and not `local`.
pub(super) fn validate_name(name: &str) -> Result<(), TokenError> {
    Tenant::check_name(name).map_err(|e| match e {
        TenantNameError::Reserved => TokenError::ReservedName,
        TenantNameError::Invalid(name) => TokenError::InvalidName(name),
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    fn store() -> (tempfile::TempDir, TokenStore) {
        let dir = tempfile::tempdir().unwrap();
        let store = TokenStore::in_home(dir.path());
        (dir, store)
    }

    #[test]
    fn a_created_secret_authenticates_as_its_tenant_and_only_its_digest_is_stored() {
        let (_dir, store) = store();
        assert!(!store.has_tokens().unwrap());
        let secret = store.create("ci").unwrap();
        let secret = secret.expose();
        assert!(secret.starts_with("fkd_"), "{secret}");
        assert_eq!(secret.len(), 4 + 64);
        assert!(store.has_tokens().unwrap());
        assert_eq!(
            store.authenticate(secret).unwrap(),
            Some(Tenant::new("ci").unwrap())
        );
        assert_eq!(store.authenticate("fkd_wrong").unwrap(), None);
        assert_eq!(store.authenticate("").unwrap(), None);

        let text = fs::read_to_string(store.path()).unwrap();
        assert!(
            !text.contains(&secret[4..]),
            "the secret was stored: {text}"
        );
        assert!(text.contains(&hex::encode(digest(secret))), "{text}");
        let mode = fs::metadata(store.path()).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
    }

    #[test]
    fn two_tokens_are_two_tenants_and_secrets_differ() {
        let (_dir, store) = store();
        let a = store.create("team-a").unwrap();
        let b = store.create("team-b").unwrap();
        assert_ne!(a.expose(), b.expose());
        assert_eq!(
            store
                .authenticate(b.expose())
                .unwrap()
                .map(|t| t.to_string()),
            Some("team-b".to_owned())
        );
        let names: Vec<String> = store.list().unwrap().into_iter().map(|t| t.name).collect();
        assert_eq!(names, ["team-a", "team-b"]);
    }

    #[test]
    fn names_are_checked_and_unique() {
        let (_dir, store) = store();
        assert!(matches!(
            store.create("local"),
            Err(TokenError::ReservedName)
        ));
        assert!(matches!(
            store.create("no spaces"),
            Err(TokenError::InvalidName(_))
        ));
        store.create("ci").unwrap();
        let err = store.create("ci").unwrap_err();
        assert_eq!(
            err.to_string(),
            "a token named `ci` already exists; revoke it first to replace it"
        );
    }

    #[test]
    fn revoking_takes_effect_for_a_store_that_already_read_the_file() {
        let (dir, store) = store();
        let secret = store.create("ci").unwrap();
        // A second handle, as the daemon holds: it has read the file once.
        let daemon = TokenStore::in_home(dir.path());
        assert!(daemon.authenticate(secret.expose()).unwrap().is_some());
        store.revoke("ci").unwrap();
        assert_eq!(daemon.authenticate(secret.expose()).unwrap(), None);
        assert!(!daemon.has_tokens().unwrap());
        assert!(matches!(store.revoke("ci"), Err(TokenError::NotFound(_))));
        // And a token created later is seen without a restart.
        let again = store.create("ci").unwrap();
        assert!(daemon.authenticate(again.expose()).unwrap().is_some());
    }

    #[test]
    fn a_rewrite_of_the_same_size_in_the_same_instant_is_seen() {
        let (dir, store) = store();
        let a = store.create("a").unwrap();
        let daemon = TokenStore::in_home(dir.path());
        assert!(daemon.authenticate(a.expose()).unwrap().is_some());
        // Same length, written at once: the stamps may be equal but the copy is not trusted.
        store.revoke("a").unwrap();
        let b = store.create("b").unwrap();
        assert_eq!(daemon.authenticate(a.expose()).unwrap(), None);
        assert!(daemon.authenticate(b.expose()).unwrap().is_some());
    }

    #[test]
    fn a_stamp_settles_a_second_after_the_last_change() {
        let now = SystemTime::now();
        let secs = |t: SystemTime| {
            let d = t.duration_since(SystemTime::UNIX_EPOCH).unwrap();
            (
                i64::try_from(d.as_secs()).unwrap(),
                i64::from(d.subsec_nanos()),
            )
        };
        let stamp = |ctime| Stamp::Present {
            dev: 1,
            ino: 1,
            len: 1,
            mtime: ctime,
            ctime,
        };
        assert!(!stamp(secs(now)).settled(now));
        let earlier = now - std::time::Duration::from_secs(2);
        assert!(stamp(secs(earlier)).settled(now));
        assert!(Stamp::Absent.settled(now));
    }

    #[test]
    fn a_broken_file_fails_closed_with_its_path_and_reason() {
        let (_dir, store) = store();
        let secret = store.create("ci").unwrap();
        assert!(store.authenticate(secret.expose()).unwrap().is_some());
        fs::write(
            store.path(),
            b"{\"version\": 1, \"tokens\": [], \"extra\": 1}",
        )
        .unwrap();
        let err = store.authenticate(secret.expose()).unwrap_err().to_string();
        assert!(err.contains("tokens.json is not valid"), "{err}");
        assert!(err.contains("extra"), "{err}");

        fs::write(
            store.path(),
            br#"{"version": 1, "tokens": [{"name": "ci", "sha256": "abc", "created_at": "x"}]}"#,
        )
        .unwrap();
        let err = store.has_tokens().unwrap_err().to_string();
        assert!(err.contains("64 hex digits"), "{err}");

        fs::write(store.path(), br#"{"version": 2, "tokens": []}"#).unwrap();
        let err = store.list().unwrap_err().to_string();
        assert!(err.contains("version 2"), "{err}");
    }

    #[test]
    fn the_secret_is_redacted_in_debug_output() {
        let (_dir, store) = store();
        let secret = store.create("ci").unwrap();
        assert_eq!(format!("{secret:?}"), "Secret(<redacted>)");
    }
}
