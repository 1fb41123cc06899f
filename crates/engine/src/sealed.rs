//! What forkd must keep but may not store in the clear: a session's own MCP server definitions
//! may hold secrets (an API token in an env value or a header), so the database holds them
//! sealed with the daemon's secret key (ChaCha20-Poly1305 from `ring`), bound to the session they
//! belong to. The key never enters the database: it is a file the operator keeps
//! (`secret_key_file`; daemons sharing a database share the key), so a copy of the database
//! alone reveals nothing.
//!
//! A sealed value is `v1:KEY_ID:HEX`, where `KEY_ID` names the key (the first 8 bytes of its
//! SHA-256, so a daemon holding another key says so instead of failing to decrypt) and `HEX` is
//! the 12-byte random nonce followed by the ciphertext and its tag.

use ring::aead::{Aad, CHACHA20_POLY1305, LessSafeKey, NONCE_LEN, Nonce, UnboundKey};
use ring::rand::{SecureRandom, SystemRandom};

/// The key's length in bytes.
pub const KEY_LEN: usize = 32;

/// Why a secret key or a sealed value cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SealError {
    #[error("a secret key is {KEY_LEN} bytes written as {} hex digits", 2 * KEY_LEN)]
    BadKey,
    #[error("sealed with another secret key ({0}); give every daemon the same secret_key_file")]
    OtherKey(String),
    #[error("the sealed value is damaged, or belongs to something else")]
    Damaged,
    #[error("no randomness from the operating system")]
    Random,
}

/// The daemon's secret key.
pub struct SecretKey {
    key: LessSafeKey,
    id: String,
}

impl std::fmt::Debug for SecretKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the key itself.
        f.debug_struct("SecretKey").field("id", &self.id).finish()
    }
}

impl SecretKey {
    /// A key from its hex text (as a key file holds it; surrounding whitespace is ignored).
    pub fn from_hex(text: &str) -> Result<Self, SealError> {
        let bytes = hex::decode(text.trim()).map_err(|_| SealError::BadKey)?;
        Self::from_bytes(&bytes)
    }

    fn from_bytes(bytes: &[u8]) -> Result<Self, SealError> {
        if bytes.len() != KEY_LEN {
            return Err(SealError::BadKey);
        }
        let key = UnboundKey::new(&CHACHA20_POLY1305, bytes).map_err(|_| SealError::BadKey)?;
        let digest = ring::digest::digest(&ring::digest::SHA256, bytes);
        Ok(Self {
            key: LessSafeKey::new(key),
            id: hex::encode(&digest.as_ref()[..8]),
        })
    }

    /// A new random key, as hex text for its file.
    pub fn generate_hex() -> Result<String, SealError> {
        let mut bytes = [0u8; KEY_LEN];
        SystemRandom::new()
            .fill(&mut bytes)
            .map_err(|_| SealError::Random)?;
        Ok(hex::encode(bytes))
    }

    /// Names the key without revealing it.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// Seals `plain` for `owner` (what it belongs to: it must be named again to open it).
    pub fn seal(&self, owner: &str, plain: &[u8]) -> Result<String, SealError> {
        let mut nonce = [0u8; NONCE_LEN];
        SystemRandom::new()
            .fill(&mut nonce)
            .map_err(|_| SealError::Random)?;
        let mut data = plain.to_vec();
        self.key
            .seal_in_place_append_tag(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(owner.as_bytes()),
                &mut data,
            )
            .map_err(|_| SealError::Damaged)?;
        let mut out = nonce.to_vec();
        out.append(&mut data);
        Ok(format!("v1:{}:{}", self.id, hex::encode(out)))
    }

    /// Opens what [`SecretKey::seal`] sealed for `owner`.
    pub fn open(&self, owner: &str, sealed: &str) -> Result<Vec<u8>, SealError> {
        let mut parts = sealed.splitn(3, ':');
        let (Some("v1"), Some(id), Some(body)) = (parts.next(), parts.next(), parts.next()) else {
            return Err(SealError::Damaged);
        };
        if id != self.id {
            return Err(SealError::OtherKey(id.chars().take(16).collect()));
        }
        let mut data = hex::decode(body).map_err(|_| SealError::Damaged)?;
        if data.len() < NONCE_LEN {
            return Err(SealError::Damaged);
        }
        let mut ciphertext = data.split_off(NONCE_LEN);
        let nonce = Nonce::try_assume_unique_for_key(&data).map_err(|_| SealError::Damaged)?;
        let plain = self
            .key
            .open_in_place(nonce, Aad::from(owner.as_bytes()), &mut ciphertext)
            .map_err(|_| SealError::Damaged)?;
        Ok(plain.to_vec())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn key() -> SecretKey {
        SecretKey::from_hex(&SecretKey::generate_hex().unwrap()).unwrap()
    }

    #[test]
    fn sealed_values_open_for_their_owner_with_their_key_only() {
        let k = key();
        let plain = br#"{"mcpServers":{"gh":{"env":{"TOKEN":"s3cret"}}}}"#;
        let sealed = k.seal("session-1", plain).unwrap();
        assert!(!sealed.contains("s3cret"));
        assert_ne!(
            sealed,
            k.seal("session-1", plain).unwrap(),
            "a fresh nonce each time"
        );
        assert_eq!(k.open("session-1", &sealed).unwrap(), plain.to_vec());
        // Another owner, another key, a flipped byte: refused.
        assert_eq!(k.open("session-2", &sealed), Err(SealError::Damaged));
        let other = key();
        assert!(matches!(
            other.open("session-1", &sealed),
            Err(SealError::OtherKey(_))
        ));
        let mut flipped = sealed.clone().into_bytes();
        let last = flipped.len() - 1;
        flipped[last] = if flipped[last] == b'0' { b'1' } else { b'0' };
        let flipped = String::from_utf8(flipped).unwrap();
        assert_eq!(k.open("session-1", &flipped), Err(SealError::Damaged));
        assert_eq!(k.open("session-1", "v1:nonsense"), Err(SealError::Damaged));
    }

    #[test]
    fn keys_are_32_bytes_of_hex() {
        assert_eq!(SecretKey::from_hex("abcd").err(), Some(SealError::BadKey));
        assert_eq!(SecretKey::from_hex("zz").err(), Some(SealError::BadKey));
        let text = format!("{}\n", "11".repeat(KEY_LEN));
        let k = SecretKey::from_hex(&text).unwrap();
        assert_eq!(k.id().len(), 16);
        assert!(!format!("{k:?}").contains("1111"));
    }
}
